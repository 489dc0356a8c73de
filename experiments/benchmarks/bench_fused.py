"""Fused PPO training speed on gymnax CartPole-v1, against a reference measured in the same run.

    python experiments/benchmarks/bench_fused.py [--repeats 5] [--envs 4 64]
        [--steps 500000 2000000] [--no-cold-start]

Hyperparameters are the single-file JAX PPO defaults (N envs x 128 steps, 4 epochs x 4
minibatches, 2x64 tanh MLP, lr 2.5e-4). For each env count (with its budget: 500k steps at
4 envs, 2M at 64 by default) the rows are alternated A B C D A B C D ... so that machine
drift hits all of them alike, and the median of the repeats is reported:

- minimal PPO (reference): experiments/benchmarks/minimal_ppo.py, written to PureJaxRL's structure,
  the whole run as one compiled call;
- tianjax core: `tianjax.core.fused_loop.make_fused`, the whole run as one compiled call;
- tianjax train(): the user-facing path, in chunks of log_every updates with episodes,
  records and metrics files (its training time, compilation apart);
- random actions: the same envs stepped by a jitted scan with uniform random actions, no
  policy (the env's physical limit on this machine).

Every time counts env steps (policy decisions) over training time, compilation apart
(compile time is its own column). Then, cold start: time to a 100-episode mean return of
475 for `tianjax train` in a fresh process with an empty compile cache and again with the
cache it filled (convergence time counts from the run's start, compilation included; the
process's whole wall time, imports included, beside it), and the reference's, which has no
persistent cache: its compile time plus the training time up to the update where its
moving average first reaches 475 (the run's time spread evenly over its updates).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import gymnax
import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from minimal_ppo import make_train  # noqa: E402

import tianjax  # noqa: E402
from tianjax.algos import make_algorithm  # noqa: E402
from tianjax.core import make_fused  # noqa: E402
from tianjax.envs import make_gymnax  # noqa: E402

CONFIG = "configs/ppo_cartpole.yaml"
REF = "minimal PPO (reference)"


def _compile(fn, *args):
    t = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    return compiled, time.perf_counter() - t


def _time(compiled, *args):
    t = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    return time.perf_counter() - t


def tianjax_core(num_envs, total):
    cfg = tianjax.load_config(CONFIG, [f"num_envs={num_envs}", f"total_env_steps={total}"])
    env = make_gymnax(cfg.env)
    algo = make_algorithm(cfg, env.obs_shape, env.action_spec, correct_staleness=False)
    init, run = make_fused(cfg, env, algo)
    n = total // (num_envs * cfg.rollout_len)
    compiled, ct = _compile(lambda key: run(init(key), n), jax.random.key(0))
    return (lambda i: _time(compiled, jax.random.key(i))), ct, n * num_envs * cfg.rollout_len


def tianjax_train(num_envs, total, info):
    overrides = [f"num_envs={num_envs}", f"total_env_steps={total}", "eval.episodes=0"]

    def once(i):
        with tempfile.TemporaryDirectory() as d:
            r = tianjax.train(
                CONFIG, overrides + [f"seed={i}"], run_dir=d, progress=False, verbose=False
            )
        info["compile"] = r.summary["compile_time_s"]
        info["steps"] = r.summary["env_steps"]
        return (
            r.summary["env_steps"] / r.summary["env_steps_per_s"]
        )  # training time, compile excluded

    return once


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


def speed_table(num_envs, total, repeats):
    core, core_ct, core_steps = tianjax_core(num_envs, total)
    ref, ref_ct, ref_steps = minimal(num_envs, total)
    rnd, rnd_ct, rnd_steps = random_actions(num_envs, total)
    info = {}
    train_once = tianjax_train(num_envs, total, info)
    train_once(0)  # its compile (and the cache) before the timed repeats, as for the others
    rows = {
        REF: ref,
        "tianjax core": core,
        "tianjax train()": train_once,
        "random actions (env limit)": rnd,
    }
    times = {k: [] for k in rows}
    for i in range(repeats):
        for name, fn in rows.items():
            times[name].append(fn(i + 1))
    compile_s = {
        REF: ref_ct,
        "tianjax core": core_ct,
        "tianjax train()": info["compile"],
        "random actions (env limit)": rnd_ct,
    }
    steps = {
        REF: ref_steps,
        "tianjax core": core_steps,
        "tianjax train()": info["steps"],
        "random actions (env limit)": rnd_steps,
    }
    sps = {k: steps[k] / statistics.median(v) for k, v in times.items()}
    print(
        f"\nfused PPO, gymnax CartPole-v1, {num_envs} envs x 128 steps, 4x4 minibatches, {total:,} steps, "
        f"{jax.devices()[0].platform}, median of {repeats} (alternating)"
    )
    print(
        f"{'row':<28}{'env steps/s':>14}{'train s':>10}{'compile s':>11}{'vs reference':>14}{'vs core':>9}"
        f"{'vs random':>11}"
    )
    for name in rows:
        print(
            f"{name:<28}{sps[name]:>14,.0f}{statistics.median(times[name]):>10.2f}{compile_s[name]:>11.2f}"
            f"{sps[name] / sps[REF]:>14.2f}{sps[name] / sps['tianjax core']:>9.2f}"
            f"{sps[name] / sps['random actions (env limit)']:>11.3f}"
        )
    print(
        "train s per repeat: "
        + "; ".join(f"{k}: {', '.join(f'{t:.2f}' for t in v)}" for k, v in times.items())
    )
    sys.stdout.flush()


def _moving_475(returns, done) -> int | None:
    """The first update (0-based) after which the mean of the last 100 finished episodes is >= 475."""
    window, first = [], None
    for u in range(returns.shape[0]):
        ended = returns[u][done[u]]
        window = (window + ended.tolist())[-100:]
        if len(window) >= 100 and np.mean(window) >= 475:
            first = u
            break
    return first


def cold_start():
    rows = []
    with tempfile.TemporaryDirectory() as d:
        cache = os.path.join(d, "cache")
        for label in ("cold cache", "warm cache"):
            run_dir = os.path.join(d, label.split()[0])
            t = time.perf_counter()
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "tianjax.cli",
                    "train",
                    CONFIG,
                    f"compile_cache={cache}",
                    f"run_dir={run_dir}",
                    "eval.episodes=0",
                    "--no-progress",
                ],
                capture_output=True,
                text=True,
            )
            wall = time.perf_counter() - t
            if proc.returncode != 0:
                print(f"tianjax train ({label}) failed:\n{proc.stderr[-2000:]}")
                return
            s = json.load(open(os.path.join(run_dir, "summary.json")))
            rows.append(
                (
                    f"tianjax train, {label}",
                    s["convergence_time_s"],
                    s["compile_time_s"],
                    wall,
                    s["convergence_env_steps"],
                )
            )
    train, steps = make_train(num_envs=4, total_steps=500_000)
    compiled, ct = _compile(train, jax.random.key(0))
    t = time.perf_counter()
    _, r, done = jax.block_until_ready(compiled(jax.random.key(0)))
    run_s = time.perf_counter() - t
    # returns per episode from rewards: CartPole pays 1 per step, so an episode's return is
    # its length; rebuild the [updates, T, B] returns at episode ends
    r, done = np.asarray(r), np.asarray(done)
    U, T, B = r.shape
    flat_r, flat_d = r.reshape(U * T, B), done.reshape(U * T, B)
    acc, rets = np.zeros(B), np.zeros_like(flat_r)
    for t_ in range(U * T):
        acc += flat_r[t_]
        rets[t_] = acc
        acc = np.where(flat_d[t_], 0.0, acc)
    u = _moving_475(rets.reshape(U, T, B), flat_d.reshape(U, T, B))
    to475 = None if u is None else ct + run_s * (u + 1) / U
    rows.append(
        (
            "minimal PPO (reference), no cache",
            to475,
            ct,
            None,
            None if u is None else (u + 1) * T * B,
        )
    )
    print(
        "\ntime to a 100-episode mean return of 475, CartPole-v1, 4 envs, 500k-step budget (seed 0)"
    )
    print(f"{'run':<38}{'to 475 s':>10}{'compile s':>11}{'process s':>11}{'env steps':>12}")
    for name, conv, comp, wall, env_steps in rows:
        fmt = lambda x, f: "-" if x is None else format(x, f)  # noqa: E731
        print(
            f"{name:<38}{fmt(conv, '.2f'):>10}{comp:>11.2f}{fmt(wall, '.1f'):>11}{fmt(env_steps, ','):>12}"
        )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--envs", type=int, nargs="+", default=[4, 64])
    ap.add_argument(
        "--steps",
        type=int,
        nargs="+",
        default=None,
        help="budget per env count (default 500k at 4 envs, 2M otherwise)",
    )
    ap.add_argument("--no-cold-start", action="store_true", help="skip the time-to-475 runs")
    args = ap.parse_args()
    steps = args.steps or [500_000 if e <= 4 else 2_000_000 for e in args.envs]
    if len(steps) != len(args.envs):
        ap.error("--steps needs one budget per --envs value")
    for e, s in zip(args.envs, steps):
        speed_table(e, s, args.repeats)
    if not args.no_cold_start:
        cold_start()


if __name__ == "__main__":
    main()
