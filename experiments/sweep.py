"""A short hyperparameter sweep whose every point trains several seeds at once (fused mode's
`num_seeds`: the seeds are vmapped inside one jitted loop), so that a setting is judged by
its spread over seeds, not by one lucky run.

    python experiments/sweep.py CONFIG --grid ppo.lr=1e-3,2.5e-3,5e-3 [--grid KEY=V1,V2 ...]
        [--seeds 3] [--steps 1500000] [key=value ...]

Every combination of the grids' values is trained with `num_seeds=--seeds` for `--steps`
env steps (schedules anneal over that budget, so compare points of one sweep, not with a
full-length run). Printed per point: the mean of the last 100 episodes' returns per seed
(final_return_per_seed), their mean and minimum, how many seeds reached the config's
target, and the env steps/s of the whole vmapped run (all seeds' steps over training
time, compilation apart).
"""

from __future__ import annotations

import argparse
import itertools
import statistics

from _runs import fmt, run


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config")
    ap.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2,...",
                    help="a config key and the values to try (repeat for a product of grids)")
    ap.add_argument("--seeds", type=int, default=3, help="seeds per point, vmapped in one run")
    ap.add_argument("--steps", type=int, default=1_500_000, help="env steps per seed")
    ap.add_argument("overrides", nargs="*", help="key=value applied to every point")
    args = ap.parse_args()
    grids = []
    for g in args.grid:
        key, _, values = g.partition("=")
        if not key or not values:
            ap.error(f"--grid {g!r}: expected KEY=V1,V2,...")
        grids.append([f"{key}={v}" for v in values.split(",")])
    points = list(itertools.product(*grids)) or [()]
    base = list(args.overrides) + [f"num_seeds={args.seeds}", f"total_env_steps={args.steps}", "eval_episodes=0"]
    print(f"{args.config}: {len(points)} points x {args.seeds} seeds x {args.steps:,} env steps")
    rows = []
    for point in points:
        s = run(args.config, base + list(point))
        finals = s.get("final_return_per_seed") or [s["final_return"]]
        target = s.get("target_return")
        reached = None if target is None else sum(f is not None and f >= target for f in finals)
        rows.append((" ".join(point) or "(config)", finals, reached, s["env_steps_per_s"], s["compile_time_s"]))
        print(f"  {rows[-1][0]}: per seed {[round(f, 2) for f in finals]}", flush=True)
    print(f"\n{'point':<34}{'mean':>8}{'min':>8}{'at target':>11}{'env steps/s':>13}{'compile s':>11}")
    for name, finals, reached, sps, compile_s in rows:
        print(f"{name:<34}{statistics.mean(finals):>8.2f}{min(finals):>8.2f}"
              f"{'-' if reached is None else f'{reached}/{len(finals)}':>11}{fmt(sps):>13}{compile_s:>11.1f}")


if __name__ == "__main__":
    main()
