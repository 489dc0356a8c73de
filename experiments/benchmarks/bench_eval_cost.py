"""What evaluation during training costs the learner: async PPO on CartPole (the shipped
ppo_cartpole_async config, its actor processes) with evaluation off, then on (an evaluator
process, `eval.episodes` greedy episodes every `eval.every_s` seconds), alternating off and
on in one process. Prints the learner's updates per second of training time (compilation
and the final evaluation after training excluded) for each, and the ratio of their
medians, on/off. The target is 0.97 or more.

    python experiments/benchmarks/bench_eval_cost.py --pairs 5

A figure is the medians of one sitting; take it alone on the machine (BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import tianjax  # noqa: E402


def updates_per_s(config: str, steps: int, overrides: list[str]) -> float:
    r = tianjax.train(
        config,
        [f"total_env_steps={steps}", "compile_cache=~/.cache/tianjax/xla", *overrides],
        save=False,
        progress=False,
        verbose=False,
    )
    s = r.summary
    train_time = s["env_steps"] / s["env_steps_per_s"]  # this session's training time
    return s["updates"] / train_time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="ppo_cartpole_async")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=500_000)
    ap.add_argument("--episodes", type=int, default=10)
    ap.add_argument("--every-s", type=float, default=5.0)
    args = ap.parse_args()
    cases = {
        "eval off": ["eval.episodes=0"],
        f"eval on ({args.episodes} episodes every {args.every_s:g} s)": [
            f"eval.episodes={args.episodes}",
            f"eval.every_s={args.every_s}",
        ],
    }
    runs = {label: [] for label in cases}
    for i in range(args.pairs):
        for label, overrides in cases.items():
            runs[label].append(updates_per_s(args.config, args.steps, overrides))
            print(f"pair {i + 1}: {label}: {runs[label][-1]:.1f} updates/s", flush=True)
    (off, on) = (statistics.median(v) for v in runs.values())
    print(f"\n{'case':40s} {'learner updates/s (median)':>27s}")
    for label, values in runs.items():
        print(f"{label:40s} {statistics.median(values):27.1f}")
    print(f"ratio on/off: {on / off:.3f}")


if __name__ == "__main__":
    main()
