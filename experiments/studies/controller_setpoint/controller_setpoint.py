"""The balance controller in a real run: does measured staleness follow the set-point?

    python experiments/studies/controller_setpoint/controller_setpoint.py [--actors 4]
        [--steps 200000] [--targets 2 6]

Async PPO on envpool CartPole-v1 with N actor processes and a learner slowed by a larger
network (network.hidden=[256,256], 1 trajectory per update) so that samples queue. The
bounds are wide (8 credits per actor, publish every 4 updates, 2 reuse passes). For each
target, one run with `balance.mode=adaptive` and one with `balance.mode=fixed` (the
bounds, never moved). Staleness is the mean tau (updates) of the samples learned from,
over the whole run and over its second half (from the per-record staleness histograms);
`moves` counts the controller's decisions; `busy` is learner_busy_fraction (share of
training time, compilation excluded, with an update running); `wall s` is the run's wall
time, start-up included. The run directories are kept under --out, so
`tianjax report DIR...` plots set-point, measurement and actions over time.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

# experiments/, for the shared _runs helper
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from _runs import run  # noqa: E402


def second_half(records):
    """Mean tau of the samples consumed in the second half of the records (each record's
    staleness_hist counts the consumed samples per tau since the previous one)."""
    hists = [
        h for h in records.get("staleness_hist", []) if h is not None
    ]  # TrainResult.metrics columns
    n = tau = 0
    for h in hists[len(hists) // 2 :]:
        n += sum(h)
        tau += sum(t * c for t, c in enumerate(h))
    return tau / n if n else math.nan


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--actors", type=int, default=4)
    ap.add_argument("--steps", type=int, default=200_000)
    ap.add_argument("--targets", type=float, nargs="+", default=[2.0, 6.0])
    ap.add_argument("--out", default="runs/controller_setpoint")
    args = ap.parse_args()
    base = [
        f"num_actors={args.actors}",
        "runtime.batch_trajectories=1",
        "network.hidden=[256,256]",
        "runtime.credits_per_actor=8",
        "runtime.publish_every=4",
        "runtime.max_reuse=2",
        "runtime.max_pool=64",
        "staleness.max_staleness=null",
        "target_return=null",
        f"total_env_steps={args.steps}",
        "log_every=5",
        "balance.period_s=0.5",
    ]
    rows = []
    for target in args.targets:
        for mode in ("adaptive", "fixed"):
            d = os.path.join(args.out, f"{mode}_target{target:g}")
            s = run(
                "configs/ppo_cartpole_async.yaml",
                [*base, f"balance.mode={mode}", f"balance.target_staleness={target}"],
                keep_dir=d,
            )
            b = s["balance"]
            rows.append(
                (
                    target,
                    mode,
                    s["staleness_mean"],
                    second_half(s["metrics"]),
                    b["balance_moves"],
                    b["balance_window"],
                    b["balance_publish_every"],
                    b["balance_max_reuse"],
                    s.get("learner_busy_fraction", float("nan")),
                    s["wall_time_s"],
                    d,
                )
            )
    print(
        f"\nasync PPO, envpool CartPole-v1, {args.actors} actors, hidden [256,256], {args.steps:,} env steps"
    )
    print(
        f"{'target':>6} {'mode':>9}{'tau mean':>10}{'2nd half':>10}{'within 25%':>11}{'moves':>7}"
        f"{'window':>8}{'publish':>8}{'reuse':>6}{'busy':>6}{'wall s':>9}  run dir"
    )
    for t, mode, tau, tau2, moves, w, pe, ru, busy, tt, d in rows:
        ok = "yes" if abs(tau2 - t) <= 0.25 * t else "no"
        print(
            f"{t:>6g} {mode:>9}{tau:>10.2f}{tau2:>10.2f}{ok:>11}{moves:>7}{w:>8}{pe:>8}{ru:>6}"
            f"{busy:>6.2f}{tt:>9.1f}  {d}"
        )


if __name__ == "__main__":
    main()
