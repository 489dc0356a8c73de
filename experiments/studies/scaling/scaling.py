"""The scaling curve: sync against async as latency-bound actors are added.

    python experiments/studies/scaling/scaling.py [--actors 1 2 4 8 16 32]
        [--cases sigma0 sigma1 slow4] [--repeats 3 | --seeds 1 2] [--steps 500000]
        [--out runs.jsonl] [key=value ...]
    python experiments/studies/scaling/scaling.py --table runs.jsonl [more.jsonl ...]
        # the table of stored runs

configs/ppo_latency_async.yaml (async PPO on tianjax/LatencyCartPole-v1, 16 envs x 32
steps per trajectory, a learner batch of one trajectory per actor, so that both modes
learn from batches of the same size) with N actor processes, in three cases:

- sigma0: every vector step sleeps 16 ms, no hiccups (a fixed-speed simulator);
- sigma1: the shipped config: lognormal delays (sigma 1.0) around 16 ms, 1% hiccups of 300 ms;
- slow4: sigma1 with actor 0 four times slower (`slow_actors: [0]`, `slow_factor: 4`).

For each (case, N) the modes alternate (S A S A ...), seeds 0..R-1 for both, and the
table gives medians of:

- fresh/s: samples learned from for the first time per second of training (from the end
  of the first update to convergence, or to the end for a run that did not converge;
  compilation and start-up excluded);
- conv. launch / conv. upd.: seconds to the first 100-episode mean of 475, from the launch
  (processes, imports, compilation included, as the runtime reports it) and from the end
  of the first update;
- tau: mean staleness (updates) of the consumed samples; busy: the learner's busy fraction;
  wait: the share of the actors' wall time spent waiting (credits, parameters, a full socket);
- reached: runs that reached 475 within the budget.

Every run ends where it converges (`stop_at_target=true`): what comes after measures
nothing here. `--out` appends each run, as it ends, to a JSON-lines file (the case, N,
mode, seed and the figures above), so that a long study can be stopped and its table
printed from what it kept (`--table`), and cluster_model.py (beside this file) can be checked
against it.

Below the table: async/sync fresh samples/s and sync/async convergence time per (case, N),
and async's fresh samples/s against N x one actor's (the N = 1 async row of the same case;
for slow4, N - 1 actors at sigma1's N = 1 pace plus one at a quarter of it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

# experiments/, for the shared _runs helper
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from _runs import fmt, ratio, records_of, run, summarise  # noqa: E402

CONFIG = "configs/ppo_latency_async.yaml"
CASES = {
    "sigma0": ["env_options.sigma=0.0", "env_options.hiccup_p=0.0"],
    "sigma1": [],
    "slow4": ["env_options.slow_actors=[0]", "env_options.slow_factor=4"],
}


def measure(case: str, n: int, mode: str, seed: int, steps: int, extra: list[str]) -> dict:
    overrides = [
        *CASES[case],
        f"num_actors={n}",
        f"mode={mode}",
        f"seed={seed}",
        f"total_env_steps={steps}",
        "log_every=1",
        "stop_at_target=true",
        *extra,
    ]
    with tempfile.TemporaryDirectory() as d:
        s = run(CONFIG, overrides, keep_dir=os.path.join(d, "run"))
    records = [r for r in records_of(s.pop("metrics")) if r.get("updates")]
    conv = s["convergence_time_s"]
    first = records[0]
    learning = [r for r in records if conv is None or r["wall_time_s"] <= conv]
    last = learning[-1] if len(learning) > 1 else records[-1]
    span = last["wall_time_s"] - first["wall_time_s"]
    return {
        "fresh": (last["samples_fresh"] - first["samples_fresh"]) / span if span > 0 else None,
        "conv_launch": conv,
        "conv": None if conv is None else max(conv - first["wall_time_s"], 0.0),
        "tau": s["staleness_mean"],
        "busy": s["learner_busy_fraction"],
        "wait": s.get("actor_wait_fraction"),
        "final": s["final_return"],
        "launch_to_first_update": first["wall_time_s"],
        # summary.json whole (the actors' time split, updates, ...: the cluster model's
        # inputs), less the temporary run directory's path
        "summary": {k: v for k, v in s.items() if k != "run_dir"},
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--actors", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        help="these seeds instead of 0..repeats-1 (to add repeats "
        "to a stored study: --seeds 1 2 --out the same file)",
    )
    ap.add_argument(
        "--steps",
        type=int,
        default=500_000,
        help="total_env_steps of each run (a cap: runs stop at convergence)",
    )
    ap.add_argument("--out", help="append every run to this JSON-lines file as it ends")
    ap.add_argument(
        "--table",
        nargs="+",
        metavar="JSONL",
        help="print the table of the runs stored in these files (no new runs)",
    )
    ap.add_argument("overrides", nargs="*", help="more key=value overrides for every run")
    args = ap.parse_args()
    if args.table:
        rows = []
        for path in args.table:
            with open(path) as f:
                rows += [json.loads(line) for line in f if line.strip()]
        print_table(rows)
        return
    rows = []
    for case in args.cases:
        for n in args.actors:
            for i in args.seeds or range(args.repeats):
                for mode in ("sync", "async"):
                    r = measure(case, n, mode, i, args.steps, args.overrides)
                    r.update(
                        case=case,
                        n=n,
                        mode=mode,
                        seed=i,
                        steps=args.steps,
                        overrides=args.overrides,
                    )
                    rows.append(r)
                    if args.out:
                        with open(args.out, "a") as f:
                            f.write(json.dumps(r) + "\n")
                    print(
                        f"{case} N={n} {mode:<5} seed {i}: fresh {fmt(r['fresh'])}/s, convergence "
                        f"{fmt(r['conv_launch'], '.1f')} s from launch ({fmt(r['conv'], '.1f')} s from the first "
                        f"update), tau {r['tau']:.2f}, busy {r['busy']:.2f}, wait {fmt(r['wait'], '.2f')}, "
                        f"final {r['final']:.0f}",
                        file=sys.stderr,
                        flush=True,
                    )
    print_table(rows)


def print_table(rows: list[dict]) -> None:
    """Medians per (case, N, mode) of the runs in `rows`, then the ratios."""
    table: dict = {}
    for r in rows:
        table.setdefault((r["case"], r["n"]), {}).setdefault(r["mode"], []).append(r)
    table = {
        k: {mode: summarise(rs) | {"runs": len(rs)} for mode, rs in v.items()}
        for k, v in table.items()
    }
    steps = sorted({r["steps"] for r in rows})
    print(
        f"\nPPO on tianjax/LatencyCartPole-v1 ({CONFIG}), 16 envs x 32 steps per trajectory and actor, "
        f"budget {', '.join(f'{s:,}' for s in steps)} env steps (each run stops at 475), medians, sync and "
        f"async alternating"
    )
    print(
        f"{'case':<7}{'N':>3} {'mode':<6}{'fresh/s':>9}{'conv. launch':>13}{'conv. upd.':>11}{'tau':>6}"
        f"{'busy':>6}{'wait':>6}{'reached':>9}"
    )
    for (case, n), modes in sorted(
        table.items(), key=lambda kv: (list(CASES).index(kv[0][0]), kv[0][1])
    ):
        for mode in ("sync", "async"):
            if mode not in modes:
                continue
            m = modes[mode]
            print(
                f"{case:<7}{n:>3} {mode:<6}{fmt(m['fresh']):>9}{fmt(m['conv_launch'], '.1f'):>13}"
                f"{fmt(m['conv'], '.1f'):>11}{fmt(m['tau'], '.2f'):>6}{fmt(m['busy'], '.2f'):>6}"
                f"{fmt(m['wait'], '.2f'):>6}{m['reached']:>6}/{m['runs']:<2}"
            )
    print()
    for (case, n), modes in sorted(
        table.items(), key=lambda kv: (list(CASES).index(kv[0][0]), kv[0][1])
    ):
        if set(modes) != {"sync", "async"}:
            continue
        s, a = modes["sync"], modes["async"]
        # what N actors would make at one actor's pace (N = 1 async of the case; with one
        # actor 4x slower, N - 1 at sigma1's pace and one at a quarter of it)
        if case == "slow4":
            one = table.get(("sigma1", 1), {}).get("async", {}).get("fresh")
            ideal = None if one is None else one * (n - 1 + 1 / 4)
        else:
            one = table.get((case, 1), {}).get("async", {}).get("fresh")
            ideal = None if one is None else one * n
        eff = ratio(a["fresh"], ideal)
        print(
            f"{case} N={n}: async/sync fresh samples/s {fmt(ratio(a['fresh'], s['fresh']), '.2f')}, "
            f"sync/async convergence time {fmt(ratio(s['conv_launch'], a['conv_launch']), '.2f')} from launch "
            f"({fmt(ratio(s['conv'], a['conv']), '.2f')} from the first update), async fresh/s vs N x one "
            f"actor's {fmt(eff, '.2f')}"
        )


if __name__ == "__main__":
    main()
