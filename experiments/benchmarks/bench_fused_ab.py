"""The fused core with and without the last-cut truncation bootstrap
(tianjax.core.rollout.cut_values), against the minimal PPO, alternating in one process.

    python experiments/benchmarks/bench_fused_ab.py [--envs 4] [--steps 250000] [--repeats 5]

Rows: the core as it is (the critic runs on each env's last cut observation, [B]), the core
with the critic on every final observation ([T, B], as before), and the reference
(experiments/benchmarks/minimal_ppo.py). Each is one compiled call of the whole run, compilation
apart. Reported per row: the median wall time and the median CPU time of the process
(all threads) over the repeats, and the reference's over the row's. On a machine shared
with other jobs the CPU time is the steadier figure: a process waiting for a core
accrues none.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import jax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from minimal_ppo import make_train  # noqa: E402

import tianjax  # noqa: E402
from tianjax.algos import make_algorithm  # noqa: E402
from tianjax.core import make_fused, rollout  # noqa: E402
from tianjax.envs import make_gymnax  # noqa: E402


def core(envs: int, total: int):
    cfg = tianjax.load_config(
        "configs/ppo_cartpole.yaml", [f"num_envs={envs}", f"total_env_steps={total}"]
    )
    env = make_gymnax(cfg.env)
    algo = make_algorithm(cfg, env.obs_shape, env.action_spec, correct_staleness=False)
    init, run = make_fused(cfg, env, algo)
    n = total // (envs * cfg.rollout_len)
    return jax.jit(lambda k: run(init(k), n)).lower(jax.random.key(0)).compile()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--envs", type=int, default=4)
    ap.add_argument("--steps", type=int, default=250_000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    fns = {"core (last cut only)": core(args.envs, args.steps)}
    kept = rollout.cut_values
    rollout.cut_values = lambda value, params, cut, final_obs: value(
        params, final_obs
    )  # traced next
    try:
        fns["core (every final obs)"] = core(args.envs, args.steps)
    finally:
        rollout.cut_values = kept
    train, _ = make_train(num_envs=args.envs, total_steps=args.steps)
    fns["minimal PPO (reference)"] = jax.jit(train).lower(jax.random.key(0)).compile()
    wall = {k: [] for k in fns}
    cpu = {k: [] for k in fns}
    for i in range(args.repeats):
        for k, f in fns.items():
            t, c = time.perf_counter(), time.process_time()
            jax.block_until_ready(f(jax.random.key(i + 1)))
            wall[k].append(time.perf_counter() - t)
            cpu[k].append(time.process_time() - c)
    m = statistics.median
    ref = "minimal PPO (reference)"
    print(
        f"\nCartPole-v1, {args.envs} envs x 128, {args.steps:,} env steps, median of {args.repeats} (alternating)"
    )
    print(f"{'row':<26}{'wall s':>9}{'cpu s':>8}{'ref/row wall':>14}{'ref/row cpu':>13}")
    for k in fns:
        print(
            f"{k:<26}{m(wall[k]):>9.2f}{m(cpu[k]):>8.2f}{m(wall[ref]) / m(wall[k]):>14.3f}"
            f"{m(cpu[ref]) / m(cpu[k]):>13.3f}"
        )


if __name__ == "__main__":
    main()
