"""The scaling curve: sync against async as latency-bound actors are added.

    python experiments/scaling.py [--actors 1 2 4 8 16 32] [--cases sigma0 sigma1 slow4]
                                  [--repeats 3] [--steps 500000] [key=value ...]

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

Below the table: async/sync fresh samples/s and sync/async convergence time per (case, N),
and async's fresh samples/s against N x one actor's (the N = 1 async row of the same case).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

from _runs import fmt, median, ratio, run, summarise

CONFIG = "configs/ppo_latency_async.yaml"
CASES = {
    "sigma0": ["env_options.sigma=0.0", "env_options.hiccup_p=0.0"],
    "sigma1": [],
    "slow4": ["env_options.slow_actors=[0]", "env_options.slow_factor=4"],
}


def measure(case: str, n: int, mode: str, seed: int, steps: int, extra: list[str]) -> dict:
    overrides = [*CASES[case], f"num_actors={n}", f"mode={mode}", f"seed={seed}", f"total_env_steps={steps}",
                 "log_every=1", *extra]
    with tempfile.TemporaryDirectory() as d:
        s = run(CONFIG, overrides, keep_dir=os.path.join(d, "run"))
    records = [r for r in s.pop("metrics") if r.get("updates")]
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
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--actors", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=500_000, help="total_env_steps of each run")
    ap.add_argument("overrides", nargs="*", help="more key=value overrides for every run")
    args = ap.parse_args()
    table = {}
    for case in args.cases:
        for n in args.actors:
            runs = {"sync": [], "async": []}
            for i in range(args.repeats):
                for mode in ("sync", "async"):
                    r = measure(case, n, mode, i, args.steps, args.overrides)
                    runs[mode].append(r)
                    print(f"{case} N={n} {mode:<5} seed {i}: fresh {fmt(r['fresh'])}/s, convergence "
                          f"{fmt(r['conv_launch'], '.1f')} s from launch ({fmt(r['conv'], '.1f')} s from the first "
                          f"update), tau {r['tau']:.2f}, busy {r['busy']:.2f}, wait {fmt(r['wait'], '.2f')}, "
                          f"final {r['final']:.0f}", file=sys.stderr, flush=True)
            table[case, n] = {mode: summarise(rs) for mode, rs in runs.items()}

    print(f"\nPPO on tianjax/LatencyCartPole-v1 ({CONFIG}), 16 envs x 32 steps per trajectory and actor, "
          f"{args.steps:,} env steps, medians of {args.repeats}, sync and async alternating")
    print(f"{'case':<7}{'N':>3} {'mode':<6}{'fresh/s':>9}{'conv. launch':>13}{'conv. upd.':>11}{'tau':>6}"
          f"{'busy':>6}{'wait':>6}{'reached':>9}")
    for (case, n), modes in table.items():
        for mode in ("sync", "async"):
            m = modes[mode]
            print(f"{case:<7}{n:>3} {mode:<6}{fmt(m['fresh']):>9}{fmt(m['conv_launch'], '.1f'):>13}"
                  f"{fmt(m['conv'], '.1f'):>11}{fmt(m['tau'], '.2f'):>6}{fmt(m['busy'], '.2f'):>6}"
                  f"{fmt(m['wait'], '.2f'):>6}{m['reached']:>6}/{args.repeats:<2}")
    print()
    for (case, n), modes in table.items():
        s, a = modes["sync"], modes["async"]
        one = table.get((case, 1), {}).get("async", {}).get("fresh")
        eff = ratio(a["fresh"], n * one) if one else None
        print(f"{case} N={n}: async/sync fresh samples/s {fmt(ratio(a['fresh'], s['fresh']), '.2f')}, "
              f"sync/async convergence time {fmt(ratio(s['conv_launch'], a['conv_launch']), '.2f')} from launch "
              f"({fmt(ratio(s['conv'], a['conv']), '.2f')} from the first update), async fresh/s vs N x one "
              f"actor's {fmt(eff, '.2f')}")


if __name__ == "__main__":
    main()
