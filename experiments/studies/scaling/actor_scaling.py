"""Throughput and staleness as actor processes are added (async mode, envpool CartPole-v1).

    python experiments/studies/scaling/actor_scaling.py [--actors 1 2 4] [--steps 60000]

Each run uses the same per-actor work (16 envs x 32 steps per trajectory) and a learner
batch of 2 trajectories from whichever actors delivered them; the table gives env steps
and samples consumed per second, the ratio to 1 actor, and the staleness (tau, in
updates) of the consumed samples: mean, max and its distribution.
"""

from __future__ import annotations

import argparse
import os
import sys

# experiments/, for the shared _runs helper
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from _runs import fmt, run  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--actors", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--steps", type=int, default=60_000)
    args = ap.parse_args()
    rows = []
    for n in args.actors:
        s = run(
            "configs/ppo_cartpole_async.yaml",
            [
                f"num_actors={n}",
                "runtime.batch_trajectories=2",
                f"total_env_steps={args.steps}",
                "staleness.max_staleness=null",
                "target_return=null",
            ],
        )
        rows.append((n, s))
    base = rows[0][1]["env_steps_per_s"]
    print(
        f"\nasync PPO, envpool CartPole-v1, {args.steps:,} env steps, learner batch = 2 trajectories"
    )
    print(
        f"{'actors':>6}{'env steps/s':>13}{'samples/s':>11}{'vs 1 actor':>12}{'tau mean':>10}{'tau max':>9}"
        "  tau distribution (share of consumed samples)"
    )
    for n, s in rows:
        hist = {int(k): v for k, v in s["staleness_histogram"].items()}
        total = sum(hist.values()) or 1
        dist = " ".join(f"{t}:{c / total:.0%}" for t, c in sorted(hist.items())[:8])
        print(
            f"{n:>6}{fmt(s['env_steps_per_s']):>13}{fmt(s['samples_consumed_per_s']):>11}"
            f"{s['env_steps_per_s'] / base:>12.2f}{s['staleness_mean']:>10.2f}{s['staleness_max']:>9}  {dist}"
        )


if __name__ == "__main__":
    main()
