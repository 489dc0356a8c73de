"""Async (relaxed assignment dependencies) against sync (strict), same config and budget.

    python experiments/studies/async_vs_sync/async_vs_sync.py [--repeats 5]
        [--workloads cartpole lunarlander] [--actors 1 2] [--lunar-steps 2000000] [--atari]

For each workload and actor count it runs sync and async alternately (S A S A ..., seed i
for the i-th pair) and prints, per mode, the medians of: convergence time (first wall-clock
time the 100-episode moving average reaches the config's target, from launch: start-up and
compilation included; a run that never reaches it counts as slower than all that do),
fresh samples per second (learned from for the first time: the
headline throughput), consumed samples per second (every sample of every update, async's
bounded reuse included, so it overstates what async gains), and the env steps it took;
then async/sync ratios of each.

Workloads: `cartpole`, envpool CartPole-v1 (configs/ppo_cartpole_async.yaml, target 475:
the quick row, where start-up is most of the time to converge) and `lunarlander`, envpool
LunarLander-v2 (configs/ppo_lunarlander_async.yaml, target 200, `--lunar-steps` env steps:
minutes of learning, so start-up no longer dominates). Before the measured runs, one tiny
run per mode fills the compile cache. With --atari it adds Pong-v5
(envpool, Nature CNN, a short fixed budget: throughput only, no convergence on a CPU).

A second table says where the time went, per mode (medians): the learner's busy fraction
(share of training wall time with an update running), the CPU cores the learner process
and the actor processes used on average over training (CPU seconds / wall seconds), the
share of the machine's cores that is (all processes' CPU over cores x wall), and the
share of the actors' wall time spent waiting for a credit (the learner is behind), for
parameters (sync: the next version) and to send (the learner's socket full). A mode that
leaves the machine's cores idle can be sped up by relaxing dependencies; one that already
uses them all can only gain by needing fewer env steps.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys

# experiments/, for the shared _runs helper
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from _runs import fmt, median, run  # noqa: E402

import tianjax  # noqa: E402

WORKLOADS = {
    "cartpole": ("envpool CartPole-v1, PPO, target 475", "configs/ppo_cartpole_async.yaml", []),
    "lunarlander": (
        "envpool LunarLander-v2, PPO, target 200",
        "configs/ppo_lunarlander_async.yaml",
        [],
    ),
}
# The Nature CNN's update is slow on a 2-core CPU: a tiny budget, throughput only.
PONG = (
    "configs/ppo_cartpole_async.yaml",
    [
        "env=Pong-v5",
        "total_env_steps=2048",
        "num_envs=4",
        "rollout_len=32",
        "ppo.num_epochs=1",
        "ppo.num_minibatches=2",
        "target_return=null",
        "log_every=1",
        "runtime.heartbeat_timeout_s=600",
    ],
)
CORES = os.cpu_count() or 1


def median_to_target(values):
    """The median of convergence figures where a run that never reached the target counts
    as slower than every run that did (None if the median run did not reach it)."""
    m = statistics.median([math.inf if v is None else v for v in values])
    return None if m == math.inf else m


def where_time_went(r: dict) -> dict:
    """One run's time breakdown from its summary (see the module docstring)."""
    wall = max(r.get("wall_time_s") or 0.0, 1e-9)
    t = r.get("actor_time_s") or {}
    actor_wall = t.get("wall") or 0.0
    learner_cpu = r.get("learner_cpu_s")

    def share(key):
        return t[key] / actor_wall if actor_wall else None

    return {
        "busy": r.get("learner_busy_fraction"),
        "learner_cores": None if learner_cpu is None else learner_cpu / wall,
        "actor_cores": t["cpu"] / wall if t else None,
        "machine": None
        if learner_cpu is None or not t
        else (learner_cpu + t["cpu"]) / (CORES * wall),
        "wait_credit": share("waiting_credit") if t else None,
        "wait_params": share("waiting_params") if t else None,
        "wait_send": share("sending") if t else None,
    }


def compare(name, config, overrides, repeats):
    rows = {"sync": [], "async": []}
    # NOTE: compiled programs are cached on disk; one short run per mode first, so that no
    # measured run pays a compilation the others do not
    batch = tianjax.load_config(config, overrides).steps_per_update
    for mode in ("sync", "async"):
        run(
            config,
            overrides + [f"mode={mode}", f"total_env_steps={2 * batch}", "target_return=null"],
        )
    for i in range(repeats):
        for mode in ("sync", "async"):
            r = run(config, overrides + [f"mode={mode}", f"seed={i}"])
            rows[mode].append(r)
            print(
                f"  {mode} seed {i}: convergence {fmt(r['convergence_time_s'], '.1f')} s at "
                f"{fmt(r['convergence_env_steps'])} env steps, fresh {fmt(r['samples_fresh_per_s'])}/s, "
                f"final {fmt(r['final_return'], '.1f')}",
                flush=True,
            )
    out, time_rows = {}, {}
    for mode, runs in rows.items():
        out[mode] = {
            "fresh": median([r["samples_fresh_per_s"] for r in runs]),
            "sps": median([r["samples_consumed_per_s"] for r in runs]),
            "reuse": median([r.get("reuse_fraction", 0.0) for r in runs]),
            "env_sps": median([r["env_steps_per_s"] for r in runs]),
            "conv": median_to_target([r["convergence_time_s"] for r in runs]),
            "conv_steps": median_to_target([r["convergence_env_steps"] for r in runs]),
            "reached": sum(r["convergence_time_s"] is not None for r in runs),
            "final": median([r["final_return"] for r in runs]),
            "tau": median([r["staleness_mean"] for r in runs]),
            "compile": median([r["compile_time_s"] for r in runs]),
        }
        parts = [where_time_went(r) for r in runs]
        time_rows[mode] = {k: median([p[k] for p in parts]) for k in parts[0]}
    s, a = out["sync"], out["async"]
    print(f"\n{name}: {repeats} runs per mode, medians")
    print(
        f"{'mode':<7}{'conv. s':>9}{'fresh/s':>10}{'consumed/s':>12}{'reuse':>7}{'env steps/s':>13}"
        f"{'conv. steps':>13}{'reached':>9}{'final':>8}{'tau mean':>10}{'compile s':>11}"
    )
    for mode in ("sync", "async"):
        m = out[mode]
        print(
            f"{mode:<7}{fmt(m['conv'], '.1f'):>9}{fmt(m['fresh']):>10}{fmt(m['sps']):>12}"
            f"{fmt(m['reuse'], '.2f'):>7}{fmt(m['env_sps']):>13}"
            f"{fmt(m['conv_steps']):>13}{m['reached']:>6}/{repeats:<2}{fmt(m['final'], '.1f'):>8}"
            f"{fmt(m['tau'], '.2f'):>10}{fmt(m['compile'], '.1f'):>11}"
        )

    def ratio(num, den):
        return num / den if num and den else None

    print(
        f"sync/async convergence time: {fmt(ratio(s['conv'], a['conv']), '.2f')}   "
        f"async/sync fresh samples per second: {fmt(ratio(a['fresh'], s['fresh']), '.2f')}   "
        f"async/sync consumed samples per second (reuse incl.): {fmt(ratio(a['sps'], s['sps']), '.2f')}   "
        f"sync/async env steps to target: {fmt(ratio(s['conv_steps'], a['conv_steps']), '.2f')}"
    )
    print(
        f"where the time went ({CORES} cores; CPU over training wall time; actors' waits as shares of "
        f"their wall time):"
    )
    print(
        f"{'mode':<7}{'learner busy':>13}{'learner cores':>15}{'actor cores':>13}{'machine used':>14}"
        f"{'wait credit':>13}{'wait params':>13}{'wait send':>11}"
    )
    for mode in ("sync", "async"):
        m = time_rows[mode]
        print(
            f"{mode:<7}{fmt(m['busy'], '.2f'):>13}{fmt(m['learner_cores'], '.2f'):>15}"
            f"{fmt(m['actor_cores'], '.2f'):>13}{fmt(m['machine'], '.2f'):>14}{fmt(m['wait_credit'], '.2f'):>13}"
            f"{fmt(m['wait_params'], '.2f'):>13}{fmt(m['wait_send'], '.2f'):>11}",
            flush=True,
        )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument(
        "--workloads", nargs="+", choices=sorted(WORKLOADS), default=["cartpole", "lunarlander"]
    )
    ap.add_argument("--actors", type=int, nargs="+", default=[1, 2], help="actor processes")
    ap.add_argument(
        "--lunar-steps",
        type=int,
        default=2_000_000,
        help="LunarLander's env-step budget (its learning rate anneals over it)",
    )
    ap.add_argument("--atari", action="store_true", help="also Pong-v5 (throughput only)")
    args = ap.parse_args()
    for w in args.workloads:
        name, config, overrides = WORKLOADS[w]
        if w == "lunarlander":
            overrides = overrides + [f"total_env_steps={args.lunar_steps}"]
        for n in args.actors:
            compare(
                f"{name}, {n} actor{'s' * (n > 1)}",
                config,
                overrides + [f"num_actors={n}"],
                args.repeats,
            )
    if args.atari:
        compare("envpool Pong-v5, PPO (Nature CNN), 2 actors, 2048 steps", *PONG, args.repeats)


if __name__ == "__main__":
    main()
