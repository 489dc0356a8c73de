"""What a run's metrics records cost fused training: CartPole PPO with few records
(log_every=61: 16 records, one chunk each), with the default of about 200 records cut from
chunks of 1/16 of the run, and with one chunk per record (what the default cost before),
alternating in one process. Prints env steps/s (training time, compilation excluded) and
the ratio to the few-records run.

    python experiments/bench_records.py --repeats 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import tianjax  # noqa: E402
from tianjax.runtime.runners import fused  # noqa: E402

CASES = {  # label -> (overrides, chunks per run)
    "log_every=61 (16 records)": (["log_every=61"], fused.CHUNKS_PER_RUN),
    "default, one chunk per record": ([], 10**9),
    "default, records cut from chunks": ([], fused.CHUNKS_PER_RUN),
}


def steps_per_s(overrides: list[str], chunks: int, steps: int) -> float:
    fused.CHUNKS_PER_RUN = chunks
    r = tianjax.train("ppo_cartpole", ["eval_episodes=0", f"total_env_steps={steps}",
                                       "compile_cache=~/.cache/tianjax/xla"] + overrides,
                      save=False, progress=False, verbose=False)
    return r.summary["env_steps_per_s"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=500_000)
    args = ap.parse_args()
    runs = {label: [] for label in CASES}
    for _ in range(args.repeats):
        for label, (overrides, chunks) in CASES.items():
            runs[label].append(steps_per_s(overrides, chunks, args.steps))
    base = statistics.median(next(iter(runs.values())))
    print(f"{'case':34s} {'env steps/s (median)':>21s} {'ratio':>7s}")
    for label, values in runs.items():
        m = statistics.median(values)
        print(f"{label:34s} {m:21,.0f} {m / base:7.3f}")


if __name__ == "__main__":
    main()
