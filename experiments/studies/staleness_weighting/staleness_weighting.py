"""Staleness correction at high staleness: none, truncated IS only, and w(tau) with
truncated IS (decoupled PPO), against the sync baseline, same env-step budget.

    python experiments/studies/staleness_weighting/staleness_weighting.py [--seeds 3]
        [--steps 200000]

Async PPO on envpool CartPole-v1 with 4 actors, 4 credits each, 1-trajectory batches and
parameters published every 4 updates, so that consumed samples are several versions old
(the table shows the measured mean tau); the balance controller is held at these values
(`balance.mode=fixed`: the adaptive one, async's default, would bring tau down to its
set-point). The arms:

- none:      the textbook loss, ratio and clip against the behaviour policy mu, weights 1;
- IS only:   decoupled PPO (clip against pi_0), weights min(rho_bar, pi_0 / mu);
- w(tau)+IS: decoupled PPO, weights (1 + tau)^-1 * min(rho_bar, pi_0 / mu);
- w+IS+traces: the same, with GAE's traces cut by min(1, pi_0 / mu) of each later step
  (`ppo.truncated_traces`);
- IS+bclip, w+IS+bclip: IS only and w(tau)+IS, and a sample whose pi_0 has already moved
  past the clip range from mu in the direction of its advantage gets weight 0
  (`ppo.behaviour_clip`: the textbook clip's first-step effect, kept inside the decoupled loss);
- default, default-wide: the async configs' correction as shipped (weights
  (1 + tau)^-0.5 * min(rho_bar, pi_0 / mu), the behaviour clip), and with the behaviour
  clip's range widened from 0.2 to 0.5 (`ppo.behaviour_clip_eps=0.5`);
- sync:      the same config in sync mode (no staleness), the reference for env steps.

Per arm, over the seeds: final 100-episode return (mean), env steps and wall-clock time to
475 (median over the seeds that reached it; time from launch, start-up included), how many
seeds reached 475, and the mean staleness of consumed samples.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

# experiments/, for the shared _runs helper
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from _runs import fmt, median, run  # noqa: E402

CONFIG = "configs/ppo_cartpole_async.yaml"
BASE = [
    "num_actors=4",
    "runtime.credits_per_actor=4",
    "runtime.batch_trajectories=1",
    "runtime.publish_every=4",
    "runtime.max_reuse=0",
    "staleness.max_staleness=null",
    "target_return=475",
    "ppo.num_minibatches=4",
    "balance.mode=fixed",
]
ARMS = {
    "none": ["staleness.correct=false"],
    "IS only": ["staleness.schedule=constant", "ppo.behaviour_clip=false"],
    "w(tau)+IS": [
        "staleness.schedule=polynomial",
        "staleness.power=1.0",
        "ppo.behaviour_clip=false",
    ],
    "w+IS+traces": [
        "staleness.schedule=polynomial",
        "staleness.power=1.0",
        "ppo.truncated_traces=true",
        "ppo.behaviour_clip=false",
    ],
    "IS+bclip": ["staleness.schedule=constant", "ppo.behaviour_clip=true"],
    "w+IS+bclip": [
        "staleness.schedule=polynomial",
        "staleness.power=1.0",
        "ppo.behaviour_clip=true",
    ],
    # the shipped correction (w = (1 + tau)^-0.5), and with the behaviour clip's range
    # widened to 0.5 (ppo.behaviour_clip_eps: the staleness_robustness study's tianjax-wide)
    "default": ["ppo.behaviour_clip=true"],
    "default-wide": ["ppo.behaviour_clip=true", "ppo.behaviour_clip_eps=0.5"],
    "sync": ["mode=sync", "runtime.batch_trajectories=null"],
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=200_000)
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    args = ap.parse_args()
    results = {k: [] for k in args.arms}
    for seed in range(args.seeds):
        for name in args.arms:  # interleaved, so drifts of the machine's speed hit every arm
            results[name].append(
                run(CONFIG, BASE + ARMS[name] + [f"seed={seed}", f"total_env_steps={args.steps}"])
            )
    print(
        f"\nasync PPO, envpool CartPole-v1, 4 actors, publish every 4 updates, {args.steps:,} env steps, "
        f"{args.seeds} seeds"
    )
    print(
        f"{'arm':<11}{'final (mean)':>13}{'steps to 475':>14}{'time to 475 s':>15}{'reached':>9}{'tau mean':>10}"
    )
    sync_steps = median([r["convergence_env_steps"] for r in results.get("sync", [])])
    for name, runs in results.items():
        steps = median([r["convergence_env_steps"] for r in runs])
        print(
            f"{name:<11}{statistics.mean(r['final_return'] for r in runs):>13.1f}{fmt(steps):>14}"
            f"{fmt(median([r['convergence_time_s'] for r in runs]), '.1f'):>15}"
            f"{sum(r['convergence_time_s'] is not None for r in runs):>6}/{len(runs):<2}"
            f"{statistics.mean(r.get('staleness_mean', 0.0) for r in runs):>10.2f}"
        )
    if sync_steps:
        for name in results:
            if name != "sync":
                worst = [r["convergence_env_steps"] for r in results[name]]
                ratio = None if None in worst else max(worst) / sync_steps
                print(f"{name}: env steps to 475, worst seed / sync median = {fmt(ratio, '.2f')}")


if __name__ == "__main__":
    main()
