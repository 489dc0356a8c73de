"""Runs the fused trainer in jitted chunks, logging between them.

Compilation is done ahead of time (lower + compile) so that compile time is reported apart
from training time; the state buffers are donated so each chunk updates them in place.

Checkpoints hold the whole FusedState (learner, the envs' states and keys, and the replay
buffer whatever `checkpoint.replay` says: the fused loop's learning_starts counts env
steps, so it cannot go on with an empty buffer), so a run resumed from one continues bit
for bit as if it had not stopped. They
are written at chunk boundaries: the first one at or after every `checkpoint.every`
updates, and at the end (also when stopped by Ctrl-C or SIGTERM).
"""

from __future__ import annotations

import time
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from tianjax import checkpoint as ckpt
from tianjax.algos import make_algorithm
from tianjax.config import Config
from tianjax.envs.jax_env import make_jax_env
from tianjax.fused import make_fused
from tianjax.metrics import EpisodeTracker, Progress, RunLogger
from tianjax.metrics.episodes import finished_episodes
from tianjax.runtime import shutdown


def run_fused(config: Config, logger: RunLogger, progress: Progress, env=None) -> dict:
    """Trains `config` in fused mode. Returns a dict with params, tracker stats and timings."""
    t_start = time.perf_counter()
    env = env if env is not None else make_jax_env(config.env_backend, config.env, config.env_options)
    algo = make_algorithm(config, env.obs_shape, env.action_spec, correct_staleness=False,
                          obs_dtype=getattr(env, "obs_dtype", None))
    init, run = make_fused(config, env, algo)
    S, B, T = config.num_seeds, config.num_envs, config.rollout_len
    per_iter = B * T
    n_iters = config.total_env_steps // per_iter  # never more steps than the budget
    chunk = min(config.log_every, n_iters)

    keys = jax.random.split(jax.random.key(config.seed), S)
    if S == 1:
        state = jax.jit(init)(keys[0])
    else:
        # NOTE: one init per seed, stacked on the host. A vmapped init was seen to hang at
        # random inside XLA:CPU (jax 0.10: every thread idle, its outputs never ready);
        # the per-seed init and the vmapped training chunks did not.
        one = jax.jit(init)
        seeds = [one(keys[s]) for s in range(S)]
        state = jax.tree.map(lambda *xs: jnp.stack(xs), *seeds)
    updates_per_iter = config.replay_config.updates_per_rollout if algo.buffer != "onpolicy" else 1

    wins = getattr(env, "reports_wins", False)
    trackers = [EpisodeTracker(config.target_return, target_win_rate=config.target_win_rate)
                for _ in range(S)]
    done_iters, env_steps, wall_offset, resumed_from = 0, 0, 0.0, None
    if config.resume:
        resumed_from, state, meta = ckpt.restore_latest(config.resume, state)
        ckpt.check_compatible(meta, config, config.resume)
        done_iters, env_steps, wall_offset = meta["iterations"], meta["env_steps"], meta["wall_time_s"]
        for t, st in zip(trackers, meta["trackers"]):
            t.load_state_dict(st)
    saver = ckpt.Checkpointer(logger.run_dir, config.checkpoint.keep, config.checkpoint.every,
                             start=done_iters * updates_per_iter)
    compiled = {}

    def compiled_chunk(n: int):
        if n not in compiled:
            fn = partial(run, num_iterations=n)
            compiled[n] = jax.jit(fn if S == 1 else jax.vmap(fn), donate_argnums=0).lower(state).compile()
        return compiled[n]

    t_compile = time.perf_counter()
    remaining = n_iters - done_iters
    if remaining > 0:
        compiled_chunk(min(chunk, remaining))
        if remaining % chunk:  # a shorter last chunk (choose log_every dividing the updates to avoid it)
            compiled_chunk(remaining % chunk)
    compile_time = time.perf_counter() - t_compile

    t_train = time.perf_counter()
    env_steps0 = env_steps

    def elapsed(now: float) -> float:
        return wall_offset + now - t_start

    def record(n, metrics, episodes):
        """Host-side bookkeeping of a finished chunk of n iterations."""
        nonlocal env_steps
        done = np.asarray(episodes.done)  # waits for the chunk, if it is still running
        rets = np.asarray(episodes.returns)
        now = time.perf_counter()
        won = np.asarray(episodes.won) if wins else None
        if S == 1:
            done, rets = done[None], rets[None]
            won = None if won is None else won[None]
        for s in range(S):
            if wins:
                r, st, w = finished_episodes(done[s], rets[s], env_steps, won[s])
            else:
                (r, st), w = finished_episodes(done[s], rets[s], env_steps), None
            trackers[s].add(r, st, elapsed(now), wins=w)
        env_steps += n * per_iter
        ma = float(np.mean([t.moving_average for t in trackers]))
        metrics = {k: np.asarray(v) for k, v in metrics.items()}
        rec = {
            "env_steps": env_steps,
            "updates": int(metrics.pop("version")[..., -1].max()),
            "wall_time_s": elapsed(now),
            "env_steps_per_s": (env_steps - env_steps0) / max(now - t_train, 1e-9),
            "return_mean_100": ma,
            "episodes": int(sum(t.episodes for t in trackers)),
        }
        if wins:
            rec["win_rate_100"] = float(np.mean([t.win_rate for t in trackers]))
        rec.update({k: float(np.mean(v)) for k, v in metrics.items()})
        if algo.schedules is not None:
            rec.update({k: float(v) for k, v in algo.schedules(env_steps).items()})
        logger.log(rec)
        progress.update(env_steps, ret=ma, sps=int(rec["env_steps_per_s"]))

    def save() -> None:
        meta = dict(ckpt.run_meta(config), iterations=done_iters, env_steps=env_steps,
                    updates=int(np.asarray(state.learner.version).max()),
                    wall_time_s=elapsed(time.perf_counter()),
                    trackers=[t.state_dict() for t in trackers])
        # labelled by updates scheduled (iterations x updates per iteration): unique and
        # increasing even while DQN's version waits for learning_starts
        saver.save(done_iters * updates_per_iter, state, meta)

    progress.update(env_steps)
    # NOTE: on an accelerator chunk k + 1 is dispatched before chunk k's outputs are read,
    # so the host-side bookkeeping overlaps the next chunk's computation instead of idling
    # the device. On the CPU, where host and device share the cores anyway, each chunk is
    # read before the next is dispatched: two programs in flight on XLA:CPU (jax 0.10)
    # were seen to deadlock, every thread idle, the outputs never ready. A checkpoint must
    # be taken before the next dispatch, which donates the state buffers.
    overlap = jax.default_backend() != "cpu"
    pending, interrupted = None, False
    try:
        while done_iters < n_iters:
            shutdown.check()
            n = min(chunk, n_iters - done_iters)
            with shutdown.critical():  # the chunk donates the state: keep its result
                state, outputs = compiled_chunk(n)(state)
                done_iters += n
            if pending is not None:
                record(*pending)
            pending = (n, *outputs)
            if not overlap:
                record(*pending)
                pending = None
            if saver.due(done_iters * updates_per_iter):
                if pending is not None:
                    record(*pending)
                pending = None
                save()
        if pending is not None:
            record(*pending)
            pending = None
        if config.checkpoint.final:
            save()
    except KeyboardInterrupt:
        # Ctrl-C / SIGTERM between chunks: keep what was trained (the last dispatched
        # chunk is finished first; its outputs are read before the save) and report it
        interrupted = True
        if pending is not None:
            record(*pending)
        if config.checkpoint.final:
            save()
    finally:
        saver.close()

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
        "resumed_from_step": resumed_from,
        "interrupted": interrupted,
        "wall_offset_s": wall_offset,
        "skipped_updates": int(np.asarray(state.learner.skipped_updates).sum()),
        "train_time_s": train_time,
        "compile_time_s": compile_time,
        "env_steps_per_s": (env_steps - env_steps0) * S / max(train_time, 1e-9),
        "episodes": int(sum(t.episodes for t in trackers)),
        "final_return": float(np.mean([t.moving_average for t in trackers])),
        "final_return_per_seed": [t.moving_average for t in trackers] if S > 1 else None,
        # with several seeds, the run has converged when its slowest seed has
        "convergence_time_s": None if any(c is None for c in conv) else max(conv),
        "convergence_env_steps": None if any(c is None for c in conv_steps) else max(conv_steps),
        "final_win_rate": float(np.mean([t.win_rate for t in trackers])) if wins else None,
        "extra_summary": sample_rates(config, algo, (env_steps - env_steps0) * S, train_time),
    }


def sample_rates(config: Config, algo, env_steps: int, train_time: float) -> dict:
    """Fresh and consumed samples per second of a single-process loop: every env step is
    learned from once (fresh); on-policy each update consumes its batch once, off-policy
    each gradient step consumes dqn.batch_size replayed samples. No reuse here."""
    t = max(train_time, 1e-9)
    if algo.buffer != "onpolicy":
        rc = config.replay_config  # items: transitions, or (qmix) sequences of rollout_len steps
        item_steps = config.rollout_len if algo.buffer == "sequences" else 1
        learned = max(env_steps - rc.learning_starts, 0) // (config.num_envs * config.rollout_len)
        consumed = learned * rc.updates_per_rollout * rc.batch_size * item_steps
    else:
        consumed = env_steps
    return {"samples_fresh_per_s": env_steps / t, "samples_consumed_per_s": consumed / t,
            "reuse_fraction": 0.0}
