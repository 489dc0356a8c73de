"""Stragglers: sync against async when one of 3 actors steps an env k times slower.

    python experiments/studies/stragglers/stragglers.py [--k 1 2 4 8] [--repeats 3] [--step-ms 2]

PPO on host CartPole (configs/ppo_cartpole_async.yaml: 16 envs x 32 steps per trajectory,
a learner batch of 3 trajectories) with 3 actor processes. The env is
tianjax/LatencyCartPole-v1 (tianjax/envs/latency.py) with a fixed delay: every vector step
sleeps `--step-ms`, and actor 0's k times as much (`slow_actors: [0]`, `slow_factor: k`).
The script checks each actor's log line for the factor it stepped at.

Sync waits for all 3 actors before every update, so the straggler sets its pace; async
(the adaptive balance controller, `balance.mode: adaptive`) learns from whichever
trajectories arrived. For each k the modes alternate (S A S A ...), with seeds 0..R-1
for both, and the table gives medians of:

- convergence (s): from the end of the first update to the first time the 100-episode
  moving average reaches 475. Start-up (processes, imports, compilation, the first
  trajectories and update) is reported apart: on CartPole it is most of a run and would
  hide the effect. Runs that did not reach 475 are left out of the median ("reached");
- start-up (s): launch to the end of the first update (metrics.jsonl is written every
  update, so its first record is that moment);
- env steps to 475;
- fresh samples/s: samples learned from for the first time, per second from the first
  update to convergence (to the end for a run that did not converge; async's bounded
  reuse is not counted);
- mean staleness tau (updates) of the consumed samples.

Below each k: sync/async convergence time (from the first update, and from launch as the
runtime reports it) and async/sync fresh samples per second.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile

# experiments/, for the shared _runs helper
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from _runs import fmt, ratio, records_of, run, summarise  # noqa: E402

from tianjax.envs import CARTPOLE_ID  # noqa: E402

CONFIG = "configs/ppo_cartpole_async.yaml"
NUM_ACTORS = 3
SLOW_ACTOR = 0
_LINE = re.compile(r"latency: actor (\d+) steps at ([0-9.]+)x")


def overrides(k: float, step_ms: float, steps: int, mode: str, seed: int) -> list[str]:
    return [
        f"env={CARTPOLE_ID}",
        "env_backend=gymnasium",
        f"num_actors={NUM_ACTORS}",
        f"env_options.step_ms={step_ms}",
        f"env_options.slow_actors=[{SLOW_ACTOR}]",
        f"env_options.slow_factor={k}",
        f"total_env_steps={steps}",
        "log_every=1",
        f"mode={mode}",
        f"seed={seed}",
    ]


def check_slowdown(run_dir: str, k: float) -> None:
    """Each actor's log says the factor its envs stepped at: k for the slow one, 1 else."""
    for a in range(NUM_ACTORS):
        path = os.path.join(run_dir, "actors", f"actor-{a}.log")
        text = open(path).read() if os.path.exists(path) else ""
        found = {int(m.group(1)): float(m.group(2)) for m in _LINE.finditer(text)}
        want = k if a == SLOW_ACTOR else 1.0
        if found.get(a) != want:
            raise SystemExit(
                f"stragglers: actor {a} should step at {want:g}x, its log says {found or 'nothing'} "
                f"({path})"
            )


def measure(k: float, step_ms: float, steps: int, mode: str, seed: int) -> dict:
    """One run: its summary, with start-up, convergence and fresh samples/s after the first update."""
    with tempfile.TemporaryDirectory() as d:
        run_dir = os.path.join(d, "run")
        s = run(CONFIG, overrides(k, step_ms, steps, mode, seed), keep_dir=run_dir)
        check_slowdown(run_dir, k)
    records = [r for r in records_of(s.pop("metrics")) if r.get("updates")]
    first, startup, conv = records[0], records[0]["wall_time_s"], s["convergence_time_s"]
    # the rate while learning to 475: the last batches of an async run's budget wait for
    # the straggler's trajectories in flight, a tail that would dilute it
    learning = [r for r in records if conv is None or r["wall_time_s"] <= conv]
    last = learning[-1] if len(learning) > 1 else records[-1]
    span = last["wall_time_s"] - first["wall_time_s"]
    return {
        "startup": startup,
        "conv": None if conv is None else max(conv - startup, 0.0),
        "conv_launch": conv,
        "conv_steps": s["convergence_env_steps"],
        "fresh": (last["samples_fresh"] - first["samples_fresh"]) / span if span > 0 else None,
        "tau": s["staleness_mean"],
        "final": s["final_return"],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--k", type=float, nargs="+", default=[1, 2, 4, 8], help="slowdown of actor 0's env"
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--step-ms", type=float, default=2.0, help="sleep per vector step (ms) of a normal actor"
    )
    ap.add_argument("--steps", type=int, default=150_000, help="total_env_steps of each run")
    args = ap.parse_args()
    table = {}
    for k in args.k:
        runs = {"sync": [], "async": []}
        for i in range(args.repeats):
            for mode in ("sync", "async"):
                r = measure(k, args.step_ms, args.steps, mode, seed=i)
                runs[mode].append(r)
                print(
                    f"k={k:g} {mode:<5} seed {i}: convergence {fmt(r['conv'], '.1f')} s after a start-up of "
                    f"{r['startup']:.1f} s, {fmt(r['conv_steps'])} env steps, fresh {fmt(r['fresh'])}/s, "
                    f"tau {r['tau']:.2f}",
                    flush=True,
                )
        table[k] = {mode: summarise(rs) for mode, rs in runs.items()}

    print(
        f"\nPPO, host CartPole ({CARTPOLE_ID}), {NUM_ACTORS} actors x 16 envs; a normal vector step sleeps "
        f"{args.step_ms:g} ms, actor {SLOW_ACTOR}'s k times that; "
        f"{args.steps:,} env steps; medians of {args.repeats}"
    )
    print(
        f"{'k':>3} {'mode':<6}{'conv. s':>9}{'start-up s':>12}{'steps to 475':>14}{'fresh/s':>10}"
        f"{'reached':>9}{'tau mean':>10}"
    )
    for k, modes in table.items():
        for mode in ("sync", "async"):
            m = modes[mode]
            print(
                f"{k:>3g} {mode:<6}{fmt(m['conv'], '.1f'):>9}{fmt(m['startup'], '.1f'):>12}"
                f"{fmt(m['conv_steps']):>14}{fmt(m['fresh']):>10}{m['reached']:>6}/{args.repeats:<2}"
                f"{fmt(m['tau'], '.2f'):>10}"
            )
    print()
    for k, modes in table.items():
        s, a = modes["sync"], modes["async"]
        print(
            f"k={k:g}: sync/async convergence time {fmt(ratio(s['conv'], a['conv']), '.2f')} "
            f"(from launch: {fmt(ratio(s['conv_launch'], a['conv_launch']), '.2f')}), "
            f"async/sync fresh samples/s {fmt(ratio(a['fresh'], s['fresh']), '.2f')}"
        )


if __name__ == "__main__":
    main()
