"""What the deterministic-lag mode costs: async PPO on gymnax CartPole against the same run
with `runtime.deterministic: true`, alternating, same seeds.

    python experiments/benchmarks/bench_deterministic.py [--pairs 2] [--actors 2]
        [--lag 1] [--steps 200000] [key=value ...]

configs/ppo_cartpole_async.yaml on gymnax with N actor processes and N shards (one
trajectory of each per update in both arms); each pair runs both arms back to back, the
order flipping each pair so that a drift of the shared machine does not favour one. Per
run: fresh samples/s (learned from for the first time, from the end of the first update
to the end), mean staleness, and the final 100-episode return. Then the ratios
deterministic/async per pair and of the medians.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

# experiments/, for the shared _runs helper
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from _runs import fmt, median, ratio, records_of, run  # noqa: E402

CONFIG = "configs/ppo_cartpole_async.yaml"
ARMS = ("async", "deterministic")


def measure(arm: str, n: int, lag: int, seed: int, steps: int, extra: list[str]) -> dict:
    overrides = [
        "env_backend=gymnax",
        f"num_actors={n}",
        f"runtime.batch_trajectories={n}",
        f"seed={seed}",
        f"total_env_steps={steps}",
        "log_every=1",
        "target_return=null",
        "eval.episodes=0",
        "loggers=[]",
        "checkpoint.final=false",
        *(
            ["runtime.deterministic=true", f"runtime.deterministic_lag={lag}"]
            if arm != "async"
            else []
        ),
        *extra,
    ]
    with tempfile.TemporaryDirectory() as d:
        s = run(CONFIG, overrides, keep_dir=os.path.join(d, "run"))
    records = [r for r in records_of(s.pop("metrics")) if r.get("updates")]
    first, last = records[0], records[-1]
    span = last["wall_time_s"] - first["wall_time_s"]
    fresh = (last["samples_fresh"] - first["samples_fresh"]) / span if span > 0 else None
    return {
        "arm": arm,
        "seed": seed,
        "fresh": fresh,
        "tau": s["staleness_mean"],
        "final": s["final_return"],
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--actors", type=int, default=2)
    ap.add_argument("--lag", type=int, default=1)
    ap.add_argument("--steps", type=int, default=200_000)
    args, extra = ap.parse_known_args(argv)
    runs = []
    print(f"{'arm':<15}{'seed':>5}{'fresh/s':>10}{'tau':>7}{'final':>8}", flush=True)
    for pair in range(args.pairs):
        arms = ARMS if pair % 2 == 0 else ARMS[::-1]
        got = {}
        for arm in arms:
            r = measure(arm, args.actors, args.lag, pair, args.steps, extra)
            got[arm] = r
            runs.append(r)
            print(
                f"{arm:<15}{pair:>5}{fmt(r['fresh']):>10}{fmt(r['tau'], '.2f'):>7}"
                f"{fmt(r['final'], '.1f'):>8}",
                flush=True,
            )
        print(
            f"  pair {pair}: fresh/s deterministic/async "
            f"{fmt(ratio(got['deterministic']['fresh'], got['async']['fresh']), '.2f')}"
        )
    med = {a: median([r["fresh"] for r in runs if r["arm"] == a]) for a in ARMS}
    print(
        f"medians: fresh/s deterministic/async {fmt(ratio(med['deterministic'], med['async']), '.2f')}"
    )


if __name__ == "__main__":
    main()
