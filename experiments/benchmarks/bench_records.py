"""What a run's metrics records cost fused training: CartPole PPO with few records
(log_every=61: 16 records), with the default of about 200 records cut from chunks of about
2 s (tianjax.runtime.runners.fused.CHUNK_SECONDS), and with one chunk per record (what the
default cost before), alternating in one process. Prints env steps/s (training time,
compilation excluded) and the ratio to the few-records run.

    python experiments/benchmarks/bench_records.py --repeats 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import tianjax  # noqa: E402
from tianjax.runtime.runners import fused  # noqa: E402

CASES = {  # label -> (overrides, seconds a chunk aims at; 0: one record per chunk)
    "log_every=61 (16 records)": (["log_every=61"], fused.CHUNK_SECONDS),
    "default, one chunk per record": ([], 0.0),
    "default, records cut from chunks": ([], fused.CHUNK_SECONDS),
}


def steps_per_s(overrides: list[str], chunk_s: float, steps: int) -> float:
    fused.CHUNK_SECONDS = chunk_s
    r = tianjax.train(
        "ppo_cartpole",
        ["eval.episodes=0", f"total_env_steps={steps}", "compile_cache=~/.cache/tianjax/xla"]
        + overrides,
        save=False,
        progress=False,
        verbose=False,
    )
    return r.summary["env_steps_per_s"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=500_000)
    args = ap.parse_args()
    runs = {label: [] for label in CASES}
    for _ in range(args.repeats):
        for label, (overrides, chunk_s) in CASES.items():
            runs[label].append(steps_per_s(overrides, chunk_s, args.steps))
    base = statistics.median(next(iter(runs.values())))
    print(f"{'case':34s} {'env steps/s (median)':>21s} {'ratio':>7s}")
    for label, values in runs.items():
        m = statistics.median(values)
        print(f"{label:34s} {m:21,.0f} {m / base:7.3f}")


if __name__ == "__main__":
    main()
