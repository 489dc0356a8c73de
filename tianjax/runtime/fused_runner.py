"""Runs the fused trainer in jitted chunks, logging between them.

Compilation is done ahead of time (lower + compile) so that compile time is reported apart
from training time; the state buffers are donated so each chunk updates them in place.
"""

from __future__ import annotations

import time
from functools import partial

import jax
import numpy as np

from tianjax.algos import make_algorithm
from tianjax.config import Config
from tianjax.envs.jax_env import make_gymnax
from tianjax.fused import make_fused
from tianjax.metrics import EpisodeTracker, Progress, RunLogger
from tianjax.metrics.episodes import finished_episodes
from tianjax.runtime import shutdown


def run_fused(config: Config, logger: RunLogger, progress: Progress, env=None) -> dict:
    """Trains `config` in fused mode. Returns a dict with params, tracker stats and timings."""
    t_start = time.perf_counter()
    env = env if env is not None else make_gymnax(config.env)
    algo = make_algorithm(config, env.obs_shape, env.action_spec, correct_staleness=False)
    init, run = make_fused(config, env, algo)
    S, B, T = config.num_seeds, config.num_envs, config.rollout_len
    per_iter = B * T
    n_iters = config.total_env_steps // per_iter  # never more steps than the budget
    chunk = min(config.log_every, n_iters)

    keys = jax.random.split(jax.random.key(config.seed), S)
    state = jax.jit(init if S == 1 else jax.vmap(init))(keys[0] if S == 1 else keys)

    def compile_chunk(n: int):
        fn = partial(run, num_iterations=n)
        return jax.jit(fn if S == 1 else jax.vmap(fn), donate_argnums=0).lower(state).compile()

    t_compile = time.perf_counter()
    compiled = {chunk: compile_chunk(chunk)}
    if n_iters % chunk:  # a shorter last chunk (choose log_every dividing the updates to avoid it)
        compiled[n_iters % chunk] = compile_chunk(n_iters % chunk)
    compile_time = time.perf_counter() - t_compile

    trackers = [EpisodeTracker(config.target_return) for _ in range(S)]
    t_train = time.perf_counter()
    env_steps = 0

    def record(n, metrics, episodes):
        """Host-side bookkeeping of a finished chunk of n iterations."""
        nonlocal env_steps
        done = np.asarray(episodes.done)  # waits for the chunk, if it is still running
        rets = np.asarray(episodes.returns)
        now = time.perf_counter()
        if S == 1:
            done, rets = done[None], rets[None]
        for s in range(S):
            r, st = finished_episodes(done[s], rets[s], env_steps)
            trackers[s].add(r, st, now - t_start)
        env_steps += n * per_iter
        ma = float(np.mean([t.moving_average for t in trackers]))
        metrics = {k: np.asarray(v) for k, v in metrics.items()}
        rec = {
            "env_steps": env_steps,
            "updates": int(metrics.pop("version")[..., -1].max()),
            "wall_time_s": now - t_start,
            "env_steps_per_s": env_steps / max(now - t_train, 1e-9),
            "return_mean_100": ma,
            "episodes": int(sum(t.episodes for t in trackers)),
        }
        rec.update({k: float(np.mean(v)) for k, v in metrics.items()})
        logger.log(rec)
        progress.update(env_steps, ret=ma, sps=int(rec["env_steps_per_s"]))

    # NOTE: chunk k + 1 is dispatched before chunk k's outputs are read, so the host-side
    # bookkeeping overlaps the next chunk's computation instead of idling the device.
    done_iters, pending = 0, None
    while done_iters < n_iters:
        shutdown.check()
        n = min(chunk, n_iters - done_iters)
        state, outputs = compiled[n](state)
        done_iters += n
        if pending is not None:
            record(*pending)
        pending = (n, *outputs)
    record(*pending)

    train_time = time.perf_counter() - t_train
    params = state.learner.params
    conv = [t.convergence_time_s for t in trackers]
    conv_steps = [t.convergence_env_steps for t in trackers]
    return {
        "params": params,
        "algo": algo,
        "env": env,
        "env_steps": env_steps * S,
        "updates": int(np.asarray(state.learner.version).max()),
        "skipped_updates": int(np.asarray(state.learner.skipped_updates).sum()),
        "train_time_s": train_time,
        "compile_time_s": compile_time,
        "env_steps_per_s": env_steps * S / max(train_time, 1e-9),
        "episodes": int(sum(t.episodes for t in trackers)),
        "final_return": float(np.mean([t.moving_average for t in trackers])),
        "final_return_per_seed": [t.moving_average for t in trackers] if S > 1 else None,
        # with several seeds, the run has converged when its slowest seed has
        "convergence_time_s": None if any(c is None for c in conv) else max(conv),
        "convergence_env_steps": None if any(c is None for c in conv_steps) else max(conv_steps),
    }
