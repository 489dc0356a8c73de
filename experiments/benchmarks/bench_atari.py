"""Atari Pong through envpool on a CPU: the pipeline's throughput against its two limits.

    python experiments/benchmarks/bench_atari.py [--steps 20480] [--actors 2] [--skip-sync]

On a machine without an accelerator Atari is compute-bound: the Nature CNN's PPO update
costs about 250 MFLOP per env step, so this shows the pipeline, not a trained agent. One
run prints, for configs/ppo_pong_async.yaml (envpool Pong-v5, DeepMind preprocessing
through envpool's own options, 8 envs per actor, [128, 8] trajectories, Nature CNN):

1. envpool's random-action rate: one pool of the config's `num_envs` envs with its
   `env_options`, stepped by `envpool.make` directly (the env's own limit) and through
   tianjax's adapter (tianjax.envs.factory, with same-step auto-reset), after a warm-up;
2. the update's measured cost: the learner's update (PPO, staleness-corrected, as the
   async learner compiles it) on one batch of the learner's shapes ([128, actors x 8]
   uint8 frames), compiled ahead of time (compile time apart), then timed: ms per update
   and ms per env step of the batch, next to a hand count of the Nature CNN's FLOPs
   (forward 2 FLOP per multiply-add, backward twice the forward, once per epoch, plus one
   forward pass for the proximal policy and values; XLA's own cost analysis counts a
   loop's body once, so it would show one minibatch of the 16);
3. an async run (`tianjax.train`, 2 actor processes) for `--steps` env steps, and the same
   config in sync mode for the same budget as the reference: env steps/s, fresh samples/s,
   learner busy fraction, compile and wall time, and env steps/s over the random rate and
   over the update-bound limit (2.'s env steps per second of update time).

Figures on a shared 2-core machine move with the load of its other users.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import numpy as np

# experiments/, for the shared _runs helper
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from _runs import fmt, run  # noqa: E402  (it also puts the repository on sys.path)

import tianjax  # noqa: E402
from tianjax.algos import make_algorithm  # noqa: E402
from tianjax.envs import env_spec, make_host_env  # noqa: E402
from tianjax.runtime import batch_axis, batch_template  # noqa: E402

CONFIG = "configs/ppo_pong_async.yaml"


# ----------------------------------------------------------------------------- 1. random actions


def _random_rate(step, n_envs, n_actions, seconds, warmup_s=1.0):
    """env steps/s of `step(actions)` with uniform random actions, after a warm-up."""
    rng = np.random.default_rng(0)
    steps, t0, t_end = 0, None, time.perf_counter() + warmup_s
    while True:
        step(rng.integers(0, n_actions, n_envs, dtype=np.int32))
        now = time.perf_counter()
        if t0 is None:
            if now >= t_end:
                t0, t_end = now, now + seconds
            continue
        steps += n_envs
        if now >= t_end:
            return steps / (now - t0)


def random_rates(cfg, seconds):
    import envpool

    env = envpool.make(
        cfg.env, env_type="gymnasium", num_envs=cfg.num_envs, seed=cfg.seed, **cfg.env_options
    )
    env.reset()
    n_actions = env.action_space.n
    ids = np.arange(cfg.num_envs, dtype=np.int32)
    raw = _random_rate(lambda a: env.step(a, ids), cfg.num_envs, n_actions, seconds)
    env.close()
    host = make_host_env(cfg.env_backend, cfg.env, cfg.num_envs, cfg.seed, **cfg.env_options)
    host.reset(cfg.seed)
    adapted = _random_rate(host.step, cfg.num_envs, n_actions, seconds)
    host.close()
    return raw, adapted


# ----------------------------------------------------------------------------- 2. the update


def _learner_batch(cfg, algo, obs_shape, obs_dtype, n_actions):
    """A batch of the learner's shapes (batch_trajectories actor trajectories joined along
    B), random uint8 frames and actions, zero rewards, no episode ends or truncations."""
    one = batch_template(cfg, algo, obs_shape, obs_dtype)[0]
    k = cfg.batch_trajectories
    rng = np.random.default_rng(0)

    def fill(name, x):
        shape = list(x.shape)
        shape[batch_axis(name)] *= k
        if name in ("obs", "last_obs", "trunc_obs"):
            return rng.integers(0, 256, shape, dtype=np.uint8).astype(x.dtype)
        if name == "action":
            return rng.integers(0, n_actions, shape).astype(x.dtype)
        if name == "trunc_t":
            return np.full(shape, -1, x.dtype)
        if name == "behaviour_log_prob":
            return np.full(shape, -np.log(n_actions), x.dtype)
        return np.zeros(shape, x.dtype)

    return type(one)(*[fill(n, getattr(one, n)) for n in one._fields])


def nature_cnn_flops(obs_shape, hidden, n_actions):
    """FLOPs of one forward pass (2 per multiply-add): the Nature convolutions, the MLP and
    the policy and value heads, for [C, H, W] (or [H, W, C]) frames."""
    c, h, w = (
        obs_shape if obs_shape[0] < obs_shape[-1] else (obs_shape[2], obs_shape[0], obs_shape[1])
    )
    macs = 0
    for feat, k, s in ((32, 8, 4), (64, 4, 2), (64, 3, 1)):
        h, w = (h - k) // s + 1, (w - k) // s + 1
        macs += h * w * feat * k * k * c
        c = feat
    width = h * w * c
    for units in hidden:
        macs += width * units
        width = units
    macs += width * (n_actions + 1)
    return 2 * macs


def update_cost(cfg, repeats):
    obs_shape, obs_dtype, spec = env_spec(cfg)
    algo = make_algorithm(
        cfg, obs_shape, spec, correct_staleness=cfg.staleness.correct, obs_dtype=obs_dtype
    )
    batch = jax.device_put(_learner_batch(cfg, algo, obs_shape, obs_dtype, spec.num_actions))
    state = jax.jit(algo.init)(jax.random.key(cfg.seed))
    fresh = np.bool_(True)
    t = time.perf_counter()
    compiled = jax.jit(algo.update, donate_argnums=0).lower(state, batch, fresh).compile()
    compile_s = time.perf_counter() - t
    state, m = compiled(state, batch, fresh)  # warm-up
    jax.block_until_ready(m)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        state, m = compiled(state, batch, fresh)
        jax.block_until_ready(m)
        times.append(time.perf_counter() - t)
    steps = cfg.steps_per_update
    fwd = nature_cnn_flops(obs_shape, cfg.network.hidden, spec.num_actions)
    # per sample: num_epochs x (forward + backward = 3 forwards) + one forward (prepare)
    hand = fwd * (3 * cfg.ppo.num_epochs + 1)
    return dict(
        steps=steps,
        compile_s=compile_s,
        update_s=float(np.median(times)),
        hand_flops_per_step=hand,
        fwd_flops=fwd,
        obs_shape=obs_shape,
    )


# ----------------------------------------------------------------------------- 3. training runs


def train_runs(steps, actors, skip_sync):
    common = [
        f"total_env_steps={steps}",
        f"num_actors={actors}",
        "target_return=null",
        "checkpoint.every=0",
        "checkpoint.final=false",
        "compile_cache=false",
    ]  # cold compiles: the second run would reuse the first's
    out = {}
    for mode in ("async",) + (() if skip_sync else ("sync",)):
        out[mode] = run(CONFIG, common + [f"mode={mode}"])
    return out


# ----------------------------------------------------------------------------- table


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=20480, help="env steps of each training run")
    ap.add_argument("--actors", type=int, default=2, help="actor processes of the training runs")
    ap.add_argument("--seconds", type=float, default=5.0, help="random-action stepping time")
    ap.add_argument("--repeats", type=int, default=3, help="timed updates (after one warm-up)")
    ap.add_argument("--skip-sync", action="store_true", help="leave out the sync reference run")
    ap.add_argument(
        "--skip-train", action="store_true", help="only the random rate and the update cost"
    )
    args = ap.parse_args()

    cfg = tianjax.load_config(CONFIG, [f"num_actors={args.actors}"])
    raw, adapted = random_rates(cfg, args.seconds)
    uc = update_cost(cfg, args.repeats)
    runs = {} if args.skip_train else train_runs(args.steps, args.actors, args.skip_sync)

    print(
        f"\nAtari {cfg.env} (envpool, {cfg.env_options}), PPO + Nature CNN, "
        f"{jax.devices()[0].platform}, {os.cpu_count()} cores"
    )
    print(
        f"\n1. random actions, one pool of {cfg.num_envs} envs, {args.seconds:.0f} s after a 1 s warm-up"
    )
    print(f"   envpool.make directly      {raw:>10,.0f} env steps/s")
    print(f"   tianjax host adapter       {adapted:>10,.0f} env steps/s")
    ms = 1e3 * uc["update_s"]
    print(
        f"\n2. learner update on [{cfg.rollout_len}, {cfg.batch_trajectories}x{cfg.num_envs}] frames "
        f"{uc['obs_shape']} uint8 ({uc['steps']} env steps; {cfg.ppo.num_epochs} epochs x "
        f"{cfg.ppo.num_minibatches} minibatches), median of {args.repeats}"
    )
    print(f"   compile                    {uc['compile_s']:>10.1f} s")
    print(f"   per update                 {ms:>10,.0f} ms")
    print(
        f"   per env step               {ms / uc['steps']:>10.2f} ms   "
        f"(update-bound limit {uc['steps'] / uc['update_s']:,.0f} env steps/s)"
    )
    print(
        f"   FLOP per env step (hand)   {uc['hand_flops_per_step'] / 1e6:>10,.0f} M"
        f"   (forward {uc['fwd_flops'] / 1e6:.1f} M x (3 x {cfg.ppo.num_epochs} epochs + 1))"
    )
    print(
        f"   achieved                   {uc['hand_flops_per_step'] * uc['steps'] / uc['update_s'] / 1e9:>10.1f}"
        f" GFLOP/s (hand count)"
    )
    if runs:
        print(
            f"\n3. tianjax.train {CONFIG} total_env_steps={args.steps} num_actors={args.actors} "
            "target_return=null"
        )
        print(
            f"   {'mode':<7}{'env steps':>10}{'updates':>9}{'env steps/s':>13}{'fresh/s':>9}{'busy':>7}"
            f"{'compile s':>11}{'wall s':>9}{'/ random':>10}{'/ update':>10}{'return':>8}{'episodes':>10}"
        )
        limit = uc["steps"] / uc["update_s"]
        for mode, r in runs.items():
            print(
                f"   {mode:<7}{r['env_steps']:>10,}{r['updates']:>9}{fmt(r['env_steps_per_s'], ',.1f'):>13}"
                f"{fmt(r.get('samples_fresh_per_s'), ',.1f'):>9}{fmt(r.get('learner_busy_fraction'), '.2f'):>7}"
                f"{fmt(r['compile_time_s'], '.1f'):>11}{fmt(r['wall_time_s'], '.1f'):>9}"
                f"{fmt(r['env_steps_per_s'] / raw if r['env_steps_per_s'] else None, '.4f'):>10}"
                f"{fmt(r['env_steps_per_s'] / limit if r['env_steps_per_s'] else None, '.2f'):>10}"
                f"{fmt(r['final_return'], '.1f'):>8}{r['episodes']:>10}"
            )
        print(
            "   (env steps/s and fresh/s over training time, compile excluded; busy: the learner's "
            "busy fraction; / random: env steps/s over envpool's random rate (1.); / update: over "
            "the update-bound limit (2.); return: mean unclipped score of the finished games)"
        )


if __name__ == "__main__":
    main()
