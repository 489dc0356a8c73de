"""Fused PPO training speed on gymnax CartPole-v1, against references measured in the same run.

    python experiments/bench_fused.py [--repeats 3] [--envs 4] [--steps 500000]

Hyperparameters are the single-file JAX PPO defaults (4 envs x 128 steps, 4 epochs x 4
minibatches, 2x64 tanh MLP, lr 2.5e-4, 5e5 steps). Rows, alternated A B C A B C ... so that
machine drift hits all of them alike (the median of the repeats is reported):

- tianjax core: `tianjax.core.fused.make_fused`, the whole run as one compiled call;
- tianjax train(): the user-facing path, with chunked logging, episodes and metrics files;
- minimal PPO: experiments/minimal_ppo.py, the bare algorithm (reference);
- random actions: the same envs stepped by a jitted scan with uniform random actions, no
  policy (the env's physical limit on this machine).

Compile time is reported apart. Ratios are against the minimal PPO and random stepping.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import gymnax
import jax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from minimal_ppo import make_train  # noqa: E402

import tianjax  # noqa: E402
from tianjax.algos import make_algorithm  # noqa: E402
from tianjax.envs.gymnax_env import make_gymnax  # noqa: E402
from tianjax.core.fused import make_fused  # noqa: E402


def _compile(fn, *args):
    t = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    return compiled, time.perf_counter() - t


def _time(compiled, *args):
    t = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    return time.perf_counter() - t


def tianjax_core(num_envs, total):
    cfg = tianjax.load_config("configs/ppo_cartpole.yaml", [f"num_envs={num_envs}", f"total_env_steps={total}"])
    env = make_gymnax(cfg.env)
    algo = make_algorithm(cfg, env.obs_shape, env.action_spec, correct_staleness=False)
    init, run = make_fused(cfg, env, algo)
    n = total // (num_envs * cfg.rollout_len)
    fn = lambda key: run(init(key), n)  # noqa: E731
    compiled, ct = _compile(fn, jax.random.key(0))
    return (lambda i: _time(compiled, jax.random.key(i))), ct, n * num_envs * cfg.rollout_len


def tianjax_train(num_envs, total):
    overrides = [f"num_envs={num_envs}", f"total_env_steps={total}", "eval_episodes=0", "log_every=50"]
    info = {}

    def once(i):
        with tempfile.TemporaryDirectory() as d:
            r = tianjax.train("configs/ppo_cartpole.yaml", overrides + [f"seed={i}"], run_dir=d,
                              progress=False, verbose=False)
        info["compile"] = r.summary["compile_time_s"]
        info["steps"] = r.summary["env_steps"]
        return r.summary["env_steps"] / r.summary["env_steps_per_s"]  # training time, compile excluded

    return once, info


def minimal(num_envs, total):
    train, steps = make_train(num_envs=num_envs, total_steps=total)
    compiled, ct = _compile(train, jax.random.key(0))
    return (lambda i: _time(compiled, jax.random.key(i))), ct, steps


def random_actions(num_envs, total):
    env, params = gymnax.make("CartPole-v1")
    n = total // num_envs

    def fn(key):
        k0, key = jax.random.split(key)
        obs, st = jax.vmap(env.reset, (0, None))(jax.random.split(k0, num_envs), params)

        def step(c, _):
            st, key = c
            key, ka, ke = jax.random.split(key, 3)
            a = jax.random.randint(ka, (num_envs,), 0, 2)
            out = jax.vmap(env.step, (0, 0, 0, None))(jax.random.split(ke, num_envs), st, a, params)
            return (out[1], key), out[2].sum()

        return jax.lax.scan(step, (st, key), None, n)[1].sum()

    compiled, ct = _compile(fn, jax.random.key(0))
    return (lambda i: _time(compiled, jax.random.key(i))), ct, n * num_envs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--envs", type=int, default=4)
    ap.add_argument("--steps", type=int, default=500_000)
    args = ap.parse_args()

    core, core_ct, core_steps = tianjax_core(args.envs, args.steps)
    ref, ref_ct, ref_steps = minimal(args.envs, args.steps)
    rnd, rnd_ct, rnd_steps = random_actions(args.envs, args.steps)
    train_once, train_info = tianjax_train(args.envs, args.steps)
    rows = {"tianjax core": (core, core_steps), "tianjax train()": (train_once, None),
            "minimal PPO (reference)": (ref, ref_steps), "random actions (env limit)": (rnd, rnd_steps)}
    times = {k: [] for k in rows}
    for i in range(args.repeats):
        for name, (fn, _) in rows.items():
            times[name].append(fn(i + 1))
    compile_s = {"tianjax core": core_ct, "tianjax train()": train_info["compile"],
                 "minimal PPO (reference)": ref_ct, "random actions (env limit)": rnd_ct}
    steps = {"tianjax core": core_steps, "tianjax train()": train_info["steps"],
             "minimal PPO (reference)": ref_steps, "random actions (env limit)": rnd_steps}
    sps = {k: steps[k] / statistics.median(v) for k, v in times.items()}

    print(f"\nfused PPO, gymnax CartPole-v1, {args.envs} envs x 128 steps, 4x4 minibatches, "
          f"{args.steps:,} steps, {jax.devices()[0].platform}, median of {args.repeats}")
    print(f"{'row':<28}{'env steps/s':>14}{'train s':>10}{'compile s':>11}{'vs minimal':>12}{'vs random':>11}")
    for name in rows:
        print(f"{name:<28}{sps[name]:>14,.0f}{statistics.median(times[name]):>10.2f}{compile_s[name]:>11.2f}"
              f"{sps[name] / sps['minimal PPO (reference)']:>12.2f}{sps[name] / sps['random actions (env limit)']:>11.3f}")


if __name__ == "__main__":
    main()
