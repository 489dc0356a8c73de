"""Async DQN against fused DQN on CartPole: env steps to 475, replay ratio held, staleness.

    python experiments/studies/async_dqn/async_dqn.py [--actors 2 4] [--steps 300000] [--seeds 1]

Fused DQN (gymnax CartPole-v1, configs/dqn_cartpole.yaml) is the reference; async runs
the same config with N actor processes on envpool CartPole-v1 (the same task). The async
learner paces gradient steps against arrivals so that samples learned per sample produced
(after learning_starts) hold `replay_ratio`, and holds the actors' credits back when it
falls behind. Printed per run: env steps and wall-clock time to a 100-episode mean of 475,
its ratio of env steps to the fused run's, the measured replay ratio against its target,
the final return, and the mean staleness of replayed samples (replay age in updates).
"""

from __future__ import annotations

import argparse
import os
import sys

# experiments/, for the shared _runs helper
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from _runs import fmt, run  # noqa: E402

CONFIG = "configs/dqn_cartpole.yaml"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--actors", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--steps", type=int, default=300_000)
    ap.add_argument("--seeds", type=int, default=1)
    args = ap.parse_args()
    rows = []
    for seed in range(args.seeds):
        common = [f"total_env_steps={args.steps}", f"seed={seed}", "eval.episodes=0"]
        rows.append(("fused", seed, run(CONFIG, common)))
        for n in args.actors:
            rows.append(
                (
                    f"async {n} actors",
                    seed,
                    run(CONFIG, common + ["mode=async", f"num_actors={n}", "env_backend=envpool"]),
                )
            )
    fused = {seed: s["convergence_env_steps"] for name, seed, s in rows if name == "fused"}
    print(f"\nDQN on CartPole-v1, {args.steps:,} env steps (eps decays over the first 25%)")
    print(
        f"{'run':<16}{'seed':>5}{'steps to 475':>14}{'x fused':>9}{'time to 475 s':>15}"
        f"{'replay ratio':>14}{'target':>8}{'final':>8}{'tau mean':>10}"
    )
    for name, seed, s in rows:
        steps = s["convergence_env_steps"]
        ratio = steps / fused[seed] if steps and fused.get(seed) else None
        print(
            f"{name:<16}{seed:>5}{fmt(steps):>14}{fmt(ratio, '.2f'):>9}"
            f"{fmt(s['convergence_time_s'], '.1f'):>15}{fmt(s.get('replay_ratio'), '.2f'):>14}"
            f"{fmt(s.get('replay_ratio_target'), '.2f'):>8}{s['final_return']:>8.1f}"
            f"{fmt(s.get('staleness_mean'), '.0f'):>10}"
        )


if __name__ == "__main__":
    main()
