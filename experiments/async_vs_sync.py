"""Async (relaxed assignment dependencies) against sync (strict), same config and budget.

    python experiments/async_vs_sync.py [--repeats 2] [--atari] [--actors 1 2]

For envpool CartPole-v1 (configs/ppo_cartpole_async.yaml) it runs sync and async
alternately (S A S A ...) and prints, per mode, the medians of: convergence time (first
wall-clock time the 100-episode moving average reaches 475, from launch: start-up and
compilation included), fresh samples per second (learned from for the first time: the
headline throughput), and consumed samples per second (every sample of every update,
async's bounded reuse included, so it overstates what async gains), with async/sync
ratios of each. It does so for each
actor count in --actors (default 1 and 2): on a 2-core machine, 1 actor process and the
learner have a core each, which is where relaxed dependencies pay (sync leaves each idle
while the other works); with 2 actors three busy processes share two cores. With --atari
it adds Pong-v5 (envpool, Nature CNN, a short fixed budget: throughput only, no
convergence on a CPU).
"""

from __future__ import annotations

import argparse

from _runs import fmt, median, run

CARTPOLE = ("configs/ppo_cartpole_async.yaml", [])
# The Nature CNN's update is slow on a 2-core CPU: a tiny budget, throughput only.
PONG = ("configs/ppo_cartpole_async.yaml",
        ["env=Pong-v5", "total_env_steps=2048", "num_envs=4", "rollout_len=32", "ppo.num_epochs=1",
         "ppo.num_minibatches=2", "target_return=null", "log_every=1", "runtime.heartbeat_timeout_s=600"])


def compare(name, config, overrides, repeats):
    rows = {"sync": [], "async": []}
    for i in range(repeats):
        for mode in ("sync", "async"):
            rows[mode].append(run(config, overrides + [f"mode={mode}", f"seed={i}"]))
    out = {}
    for mode, runs in rows.items():
        out[mode] = {
            "fresh": median([r["samples_fresh_per_s"] for r in runs]),
            "sps": median([r["samples_consumed_per_s"] for r in runs]),
            "reuse": median([r.get("reuse_fraction", 0.0) for r in runs]),
            "env_sps": median([r["env_steps_per_s"] for r in runs]),
            "conv": median([r["convergence_time_s"] for r in runs]),
            "conv_steps": median([r["convergence_env_steps"] for r in runs]),
            "reached": sum(r["convergence_time_s"] is not None for r in runs),
            "final": median([r["final_return"] for r in runs]),
            "tau": median([r["staleness_mean"] for r in runs]),
            "compile": median([r["compile_time_s"] for r in runs]),
        }
    s, a = out["sync"], out["async"]
    print(f"\n{name}: {repeats} runs per mode, medians")
    print(f"{'mode':<7}{'conv. s':>9}{'fresh/s':>10}{'consumed/s':>12}{'reuse':>7}{'env steps/s':>13}"
          f"{'conv. steps':>13}{'reached':>9}{'final':>8}{'tau mean':>10}{'compile s':>11}")
    for mode in ("sync", "async"):
        m = out[mode]
        print(f"{mode:<7}{fmt(m['conv'], '.1f'):>9}{fmt(m['fresh']):>10}{fmt(m['sps']):>12}"
              f"{fmt(m['reuse'], '.2f'):>7}{fmt(m['env_sps']):>13}"
              f"{fmt(m['conv_steps']):>13}{m['reached']:>6}/{repeats:<2}{fmt(m['final'], '.1f'):>8}"
              f"{fmt(m['tau'], '.2f'):>10}{fmt(m['compile'], '.1f'):>11}")

    def ratio(num, den):
        return num / den if num and den else None

    print(f"sync/async convergence time: {fmt(ratio(s['conv'], a['conv']), '.2f')}   "
          f"async/sync fresh samples per second: {fmt(ratio(a['fresh'], s['fresh']), '.2f')}   "
          f"async/sync consumed samples per second (reuse incl.): {fmt(ratio(a['sps'], s['sps']), '.2f')}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--atari", action="store_true", help="also Pong-v5 (throughput only)")
    ap.add_argument("--actors", type=int, nargs="+", default=[1, 2], help="actor processes (CartPole)")
    args = ap.parse_args()
    config, overrides = CARTPOLE
    for n in args.actors:
        compare(f"envpool CartPole-v1, PPO, {n} actor{'s' * (n > 1)}", config, overrides + [f"num_actors={n}"],
                args.repeats)
    if args.atari:
        compare("envpool Pong-v5, PPO (Nature CNN), 2 actors, 2048 steps", *PONG, args.repeats)


if __name__ == "__main__":
    main()
