"""What the replay log costs an async run: the same config with `runtime.replay_log` true
and false, alternating, same seed, the order flipped each pair.

    python experiments/benchmarks/bench_replay_log.py [--pairs 3] [--config CONFIG]
        [--steps 150000] [key=value ...]

The log is a JSON line per trajectory received and per update (tianjax/runtime/record/
replay_log.py), written and flushed by the learner's loop, so its cost grows with the
event rate: the default config (configs/ppo_cartpole_async.yaml: envpool CartPole, 2 CPU-
bound actors, 2 trajectories of 512 steps an update) sends many small trajectories; an
async DQN (configs/dqn_cartpole.yaml mode=async: 4 updates a 40-step trajectory) writes the
most lines per sample. Per run: fresh samples/s (summary.json's samples_fresh_per_s, over
the training time: compilation excluded), the learner's CPU seconds, and the log's lines and
bytes. Then the on/off ratio per pair and of the medians (goal: the log costs under 2%).

On a shared 2-core machine whole runs of CPU-bound actors drift by more than 2% from one
to the next, so the script also times the log's own work in this process (a trajectory's
line, from its [T, B] version stamps to the flushed write, and an update's), and gives
its share of the learner's wall time in the logged runs: lines x their cost over the run's
training time.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

# experiments/, for the shared _runs helper
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from _runs import fmt, median, ratio, run  # noqa: E402

from tianjax.runtime import REPLAY_LOG, ReplayLog  # noqa: E402


def measure(config: str, on: bool, steps: int, extra: list[str]) -> dict:
    overrides = [
        f"total_env_steps={steps}",
        f"runtime.replay_log={str(on).lower()}",
        "target_return=null",
        "eval.episodes=0",
        "checkpoint.final=false",
        *extra,
    ]
    with tempfile.TemporaryDirectory() as d:
        s = run(config, overrides, keep_dir=os.path.join(d, "run"))
        log = os.path.join(d, "run", REPLAY_LOG)
        lines = size = 0
        if os.path.exists(log):
            size = os.path.getsize(log)
            with open(log, "rb") as f:
                lines = sum(1 for _ in f)
    return {
        "log": on,
        "fresh": s["samples_fresh_per_s"],
        "cpu": s["learner_cpu_s"],
        "updates": s["updates"],
        "received": s["trajectories_received"],
        "lines": lines,
        "bytes": size,
        "train_s": s["env_steps"] / s["env_steps_per_s"] if s["env_steps_per_s"] else None,
    }


def unit_costs(config: str, extra: list[str], n: int = 5000) -> tuple[float, float]:
    """Seconds the learner's loop spends on one trajectory's line and on one update's
    (the median of 5 batches of `n`), with the config's [T, B] version stamps."""
    import statistics
    import time
    from types import SimpleNamespace

    import numpy as np

    from tianjax.config import load_config

    c = load_config(config, extra)
    version = np.full((c.rollout_len, c.num_envs), 7, np.int32)
    msg = SimpleNamespace(body={"rollout": 123, "seed": 7919}, inc="0123456789abcdef", seq=123)
    traj, update = [], []
    with tempfile.TemporaryDirectory() as d:
        log = ReplayLog(d)
        for _ in range(5):
            t = time.perf_counter()
            for _ in range(n):
                log.trajectory(msg, 0, np.take(version, 0, axis=1), 1234567, "pool")
            traj.append((time.perf_counter() - t) / n)
            t = time.perf_counter()
            for _ in range(n):
                log.write({"e": "update", "items": [1234, 1235], "reuse": False})
            update.append((time.perf_counter() - t) / n)
        log.close()
    return statistics.median(traj), statistics.median(update)


HEADER = f"{'log':<5}{'fresh/s':>10}{'learner cpu s':>15}{'updates':>9}{'trajs':>7}{'lines':>8}{'KiB':>8}"


def row(r: dict) -> str:
    return (
        f"{'on' if r['log'] else 'off':<5}{fmt(r['fresh']):>10}{fmt(r['cpu'], '.1f'):>15}"
        f"{r['updates']:>9}{r['received']:>7}{r['lines']:>8}{r['bytes'] / 1024:>8.0f}"
    )


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--config", default="configs/ppo_cartpole_async.yaml")
    p.add_argument("--steps", type=int, default=150_000)
    p.add_argument("overrides", nargs="*", help="more key=value overrides for both arms")
    args = p.parse_args(argv)
    print(f"{args.config} {' '.join(args.overrides)}, {args.steps} env steps a run")
    print(HEADER)
    pairs = []
    for i in range(args.pairs):
        order = (True, False) if i % 2 == 0 else (False, True)
        got = {on: measure(args.config, on, args.steps, args.overrides) for on in order}
        for on in order:
            print(row(got[on]), flush=True)
        pairs.append(got)
    print()
    for i, got in enumerate(pairs):
        print(
            f"pair {i}: fresh/s on/off {fmt(ratio(got[True]['fresh'], got[False]['fresh']), '.3f')}"
            f", learner CPU on/off {fmt(ratio(got[True]['cpu'], got[False]['cpu']), '.3f')}"
        )
    per_traj, per_update = unit_costs(args.config, args.overrides)
    shares = [
        (g[True]["received"] * per_traj + g[True]["updates"] * per_update) / g[True]["train_s"]
        for g in pairs
        if g[True]["train_s"]
    ]
    print(
        f"the log's own work: {per_traj * 1e6:.1f} us a trajectory, {per_update * 1e6:.1f} us an "
        f"update; in the logged runs {fmt(median(shares) * 100 if shares else None, '.3f')}% of "
        "the learner's training wall time (median)"
    )
    on = median([g[True]["fresh"] for g in pairs])
    off = median([g[False]["fresh"] for g in pairs])
    print(
        f"medians: fresh/s on {fmt(on)}, off {fmt(off)}, on/off {fmt(ratio(on, off), '.3f')}; "
        f"per-pair ratios' median {fmt(median([ratio(g[True]['fresh'], g[False]['fresh']) for g in pairs]), '.3f')}"
    )


if __name__ == "__main__":
    main()
