"""Staleness weighting on vs off at high staleness (many actors, a slow learner).

    python experiments/staleness_weighting.py [--seeds 2] [--steps 150000]

Async PPO on envpool CartPole-v1 with 4 actors, 4 credits each and a learner that takes
4 epochs over 1-trajectory batches, so samples arrive several versions old. "off" is the
plain loss (constant weights, no drop); "on" weights samples by (1 + tau)^-1 and drops
those staler than 8 updates. Same seeds, same env-step budget; the table gives the final
100-episode return, the return reached at each quarter of the budget, and tau.
"""

from __future__ import annotations

import argparse
import statistics

from _runs import fmt, run

BASE = ["num_actors=4", "runtime.credits_per_actor=4", "runtime.batch_trajectories=1",
        "target_return=475"]
SETTINGS = {
    "off": ["staleness.correct=false", "staleness.max_staleness=null"],
    "on": ["staleness.schedule=polynomial", "staleness.power=1.0", "staleness.max_staleness=8"],
}


def return_at(metrics, steps):
    best = None
    for r in metrics:
        if r["env_steps"] <= steps and r.get("return_mean_100") is not None:
            best = r["return_mean_100"]
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=150_000)
    args = ap.parse_args()
    results = {k: [] for k in SETTINGS}
    for seed in range(args.seeds):
        for name, extra in SETTINGS.items():
            results[name].append(run("configs/ppo_cartpole_async.yaml",
                                     BASE + extra + [f"seed={seed}", f"total_env_steps={args.steps}"]))
    quarters = [args.steps * q // 4 for q in (1, 2, 3, 4)]
    print(f"\nasync PPO, envpool CartPole-v1, 4 actors, {args.steps:,} env steps, {args.seeds} seeds (mean)")
    print(f"{'weighting':<10}" + "".join(f"{'ret@' + format(q, ','):>14}" for q in quarters)
          + f"{'final':>8}{'reached':>9}{'tau mean':>10}{'tau max':>9}{'dropped':>9}")
    for name, runs in results.items():
        at = [statistics.mean([return_at(r["metrics"], q) or 0.0 for r in runs]) for q in quarters]
        print(f"{name:<10}" + "".join(f"{a:>14.1f}" for a in at)
              + f"{statistics.mean(r['final_return'] for r in runs):>8.1f}"
              + f"{sum(r['convergence_time_s'] is not None for r in runs):>6}/{len(runs):<2}"
              + f"{statistics.mean(r['staleness_mean'] for r in runs):>10.2f}"
              + f"{max(r['staleness_max'] for r in runs):>9}"
              + f"{fmt(statistics.mean(r['dropped_samples'] for r in runs)):>9}")


if __name__ == "__main__":
    main()
