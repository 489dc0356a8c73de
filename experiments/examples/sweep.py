"""A hyperparameter sweep in as few compiled programs as the shapes allow (`tianjax sweep`),
and, with --separate, the same points trained one after another with `tianjax.train()` as
the reference: throughput and final returns side by side.

    python experiments/examples/sweep.py CONFIG key=V1,V2,... [key=V1,V2 ...] [key=value ...]
        [--separate] [--out DIR]

    # the issue's measurement: 8 learning rates x 1 seed, one program vs 8 runs
    python experiments/examples/sweep.py configs/ppo_cartpole.yaml \
        ppo.lr=1e-4,2.5e-4,5e-4,1e-3,2e-3,3e-3,5e-3,1e-2 num_seeds=1 --separate

A value list is a grid axis, a single value applies to every point (tianjax/runtime/runners/sweep.py).
Every point uses the seeds `tianjax train` gives its config, so with --separate each
separate run is the same computation as its point of the sweep; their final returns (mean
of the last 100 episodes per seed) should agree within float noise, which grows over a run
where a near-tie flips an action.

Printed: the sweep's table (points ranked by final return, spread over seeds), then with
--separate, per point the sweep's and the separate run's final return, and the env steps/s
of both: all points' and seeds' env steps over training time (compilation apart), and over
wall time with compilation. The separate runs run after the sweep in the same process; the
machine's load hits both (say so with the figures).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import tianjax
from tianjax.runtime import make_points, run_sweep, use_cpu_cores


def separate_runs(config: str, assignments: list[str], out: str) -> list[dict]:
    """Each point of the grid as its own tianjax.train() run, one after another."""
    rows = []
    for p in make_points(config, assignments):
        t = time.perf_counter()
        r = tianjax.train(
            p.config, run_dir=os.path.join(out, f"p{p.index:02d}"), progress=False, verbose=False
        )
        wall = time.perf_counter() - t
        s = r.summary
        rows.append(
            dict(
                name=p.name,
                final=s.get("final_return_per_seed") or [s["final_return"]],
                steps=s["env_steps"],
                train_s=s["env_steps"] / s["env_steps_per_s"],
                wall_s=wall,
                compile_s=s["compile_time_s"],
            )
        )
        print(
            f"  separate {p.name}: final {rows[-1]['final']}, {rows[-1]['train_s']:.1f} s training, "
            f"{rows[-1]['compile_s']:.1f} s compile",
            flush=True,
        )
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config")
    ap.add_argument("assignments", nargs="*", metavar="key=v1,v2,...")
    ap.add_argument(
        "--separate", action="store_true", help="also train every point on its own (reference)"
    )
    ap.add_argument("--out", help="the sweep directory (default: a temporary one)")
    args = ap.parse_args()
    use_cpu_cores()  # as `tianjax sweep` does (the separate runs use one device each)
    assignments = list(args.assignments) + ["eval.episodes=0"]
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or os.path.join(tmp, "sweep")
        t = time.perf_counter()
        result = run_sweep(args.config, assignments, out=out)
        sweep_wall = time.perf_counter() - t
        if not args.separate:
            return
        print("\nthe same points, one tianjax.train() after another:", flush=True)
        rows = separate_runs(args.config, assignments, os.path.join(tmp, "separate"))
    steps = sum(g["env_steps"] for g in result.groups)
    train_s = sum(g["train_time_s"] for g in result.groups)
    sep_steps = sum(r["steps"] for r in rows)
    sep_train = sum(r["train_s"] for r in rows)
    sep_wall = sum(r["wall_s"] for r in rows)
    print(f"\n{'point':<36}{'sweep final':>14}{'separate final':>16}")
    for p, r in zip(result.points, rows):
        fmt = lambda xs: "/".join("-" if x is None else f"{x:.1f}" for x in xs)  # noqa: E731
        print(f"{p.name:<36}{fmt(p.final_return_per_seed):>14}{fmt(r['final']):>16}")
    print(f"\n{'':<36}{'env steps':>12}{'steps/s (train)':>17}{'steps/s (wall)':>16}")
    print(
        f"{'sweep, ' + str(len(result.groups)) + ' program(s)':<36}{steps:>12,}{steps / train_s:>17,.0f}"
        f"{steps / sweep_wall:>16,.0f}"
    )
    print(
        f"{'separate train() runs':<36}{sep_steps:>12,}{sep_steps / sep_train:>17,.0f}{sep_steps / sep_wall:>16,.0f}"
    )
    print(
        f"{'ratio (sweep / separate)':<36}{'':>12}{(steps / train_s) / (sep_steps / sep_train):>17.2f}"
        f"{(steps / sweep_wall) / (sep_steps / sep_wall):>16.2f}"
    )


if __name__ == "__main__":
    main()
