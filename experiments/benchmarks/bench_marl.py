"""Fused IPPO speed on MPE simple_spread against JaxMARL's own random-action stepping.

    python experiments/benchmarks/bench_marl.py [--envs 1 64 1024] [--iters 4] [--repeats 3]

For each number of parallel envs B, two rows measured alternately (A B A B ...) in one
process, the median of the repeats reported:

- fused IPPO: `tianjax.core.fused_loop.make_fused` with configs/ippo_mpe_spread.yaml (T = 128, 4
  epochs x 4 minibatches, 3 agents sharing a 2x64 actor-critic), `--iters` rollout+update
  iterations as one compiled call;
- JaxMARL random: the same env stepped through JaxMARL's own `env.step` (its auto-reset
  included), vmapped over B, uniform random actions, no policy, in a jitted scan of the
  same number of steps: the env's limit on this machine.

Env steps are steps of all 3 agents at once (agent decisions are 3x). Compile time is
reported apart and excluded from the rates.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import jax

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import tianjax  # noqa: E402
from tianjax.algos import make_algorithm  # noqa: E402
from tianjax.core import make_fused  # noqa: E402
from tianjax.envs import make_jaxmarl  # noqa: E402

CONFIG = os.path.join(ROOT, "configs", "ippo_mpe_spread.yaml")


def _compile(fn, *args):
    t = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    return compiled, time.perf_counter() - t


def _time(compiled, *args):
    t = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    return time.perf_counter() - t


def fused_ippo(num_envs: int, iters: int):
    minibatches = min(4, num_envs * 128)
    cfg = tianjax.load_config(
        CONFIG,
        [
            f"num_envs={num_envs}",
            f"ppo.num_minibatches={minibatches}",
            f"total_env_steps={num_envs * 128 * iters}",
        ],
    )
    env = make_jaxmarl(cfg.env)
    algo = make_algorithm(cfg, env.obs_shape, env.action_spec, correct_staleness=False)
    init, run = make_fused(cfg, env, algo)
    state = jax.jit(init)(jax.random.key(0))
    compiled, ct = _compile(lambda s: run(s, iters), state)
    return (lambda: _time(compiled, state)), ct, iters * num_envs * cfg.rollout_len


def jaxmarl_random(num_envs: int, steps: int):
    raw = make_jaxmarl("MPE_simple_spread_v3").env
    agents = raw.agents
    n_act = raw.action_space(agents[0]).n

    def fn(key):
        key, sub = jax.random.split(key)
        _, state = jax.vmap(raw.reset)(jax.random.split(sub, num_envs))

        def step(c, _):
            state, key = c
            key, k_a, k_e = jax.random.split(key, 3)
            acts = jax.random.randint(k_a, (len(agents), num_envs), 0, n_act)
            actions = {a: acts[i] for i, a in enumerate(agents)}
            _, state, reward, _, _ = jax.vmap(raw.step)(
                jax.random.split(k_e, num_envs), state, actions
            )
            return (state, key), reward[agents[0]].sum()

        return jax.lax.scan(step, (state, key), None, length=steps)[1].sum()

    compiled, ct = _compile(fn, jax.random.key(0))
    return (lambda: _time(compiled, jax.random.key(1))), ct, steps * num_envs


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--envs", type=int, nargs="+", default=[1, 64, 1024])
    parser.add_argument("--iters", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print("| envs B | row | env steps/s | compile s | vs JaxMARL random |")
    print("|---:|---|---:|---:|---:|")
    for b in args.envs:
        ippo, ct_ippo, n_ippo = fused_ippo(b, args.iters)
        rand, ct_rand, n_rand = jaxmarl_random(b, args.iters * 128)
        t_ippo, t_rand = [], []
        for _ in range(args.repeats):
            t_ippo.append(ippo())
            t_rand.append(rand())
        sps_ippo = n_ippo / statistics.median(t_ippo)
        sps_rand = n_rand / statistics.median(t_rand)
        print(f"| {b} | fused IPPO | {sps_ippo:,.0f} | {ct_ippo:.1f} | {sps_ippo / sps_rand:.3f} |")
        print(
            f"| {b} | JaxMARL random (reference) | {sps_rand:,.0f} | {ct_rand:.1f} | 1.000 |",
            flush=True,
        )


if __name__ == "__main__":
    main()
