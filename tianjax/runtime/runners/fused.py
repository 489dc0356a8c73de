"""Runs the fused trainer in jitted chunks, logging between them.

Compilation is done ahead of time (lower + compile) so that compile time is reported apart
from training time; the state buffers are donated so each chunk updates them in place.

Checkpoints hold the whole FusedState (learner, the envs' states and keys, and the replay
buffer whatever `checkpoint.replay` says: the fused loop's learning_starts counts env
steps, so it cannot go on with an empty buffer), so a run resumed from one continues bit
for bit as if it had not stopped. They
are written at chunk boundaries: the first one at or after every `checkpoint.every`
updates, and at the end (also when stopped by Ctrl-C or SIGTERM). Episodes, records,
checkpoints and the result are kept by the run recorder (tianjax.runtime.runners.recorder).
"""

from __future__ import annotations

import time
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from tianjax.algos import make_algorithm
from tianjax.config import Config
from tianjax.envs.factory import make_jax_env
from tianjax.core.fused import make_fused
from tianjax.metrics import Progress, RunLogger
from tianjax.runtime.process import shutdown
from tianjax.runtime.runners.outcome import RunOutcome
from tianjax.runtime.runners.recorder import RunRecorder, sample_rates


# A chunk is one compiled program: the host reads the device once per chunk, so records
# (about 200 a run) are cut from a chunk's stacked outputs, not one chunk each. Chunks
# stay short enough for a responsive progress line, Ctrl-C and checkpoint cadence.
CHUNKS_PER_RUN = 16


def chunk_iterations(n_iters: int, every: int) -> int:
    """Iterations per compiled chunk: the smallest multiple of `every` (the iterations per
    record) that covers the run in CHUNKS_PER_RUN chunks; `every` at least, the run at
    most. The last chunk may run fewer: the same program skips its tail (make_fused's
    num_valid), so no second size is compiled."""
    if n_iters <= every:
        return max(1, n_iters)
    per_chunk = -(-n_iters // CHUNKS_PER_RUN)
    return min(every * -(-per_chunk // every), n_iters)


def run_fused(config: Config, logger: RunLogger, progress: Progress, env=None) -> RunOutcome:
    """Trains `config` in fused mode; the RunOutcome holds the params, the episode stats and
    the timings."""
    t_start = time.perf_counter()
    env = env if env is not None else make_jax_env(config.env_backend, config.env, config.env_options)
    algo = make_algorithm(config, env.obs_shape, env.action_spec, correct_staleness=False,
                          obs_dtype=getattr(env, "obs_dtype", None))
    init, run = make_fused(config, env, algo)
    S, B, T = config.num_seeds, config.num_envs, config.rollout_len
    per_iter = B * T
    n_iters = config.total_env_steps // per_iter  # never more steps than the budget
    every = min(config.log_interval, n_iters)  # iterations per record
    chunk = chunk_iterations(n_iters, every)  # iterations per compiled program

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
    rec = RunRecorder(config, logger, progress, seeds=S, wins=wins)
    done_iters, env_steps = 0, 0
    if config.resume:
        state, meta = rec.resume(state)
        done_iters, env_steps = meta["iterations"], meta["env_steps"]
    rec.start(t_start)
    # labelled by updates scheduled (iterations x updates per iteration): unique and
    # increasing even while DQN's version waits for learning_starts
    rec.open_checkpoints(logger.run_dir, start=done_iters * updates_per_iter)
    # one program for every chunk: where the chunks do not divide what is left (a budget
    # or a resume point off the chunk grid), each takes how many of its iterations run
    masked = (n_iters - done_iters) % chunk != 0

    def compile_chunk():
        if masked:
            def fn(state, num_valid):
                return run(state, chunk, num_valid)

            fn = jax.vmap(fn, in_axes=(0, None)) if S > 1 else fn
            return jax.jit(fn, donate_argnums=0).lower(state, jnp.int32(chunk)).compile()
        fn = partial(run, num_iterations=chunk)
        return jax.jit(fn if S == 1 else jax.vmap(fn), donate_argnums=0).lower(state).compile()

    t_compile = time.perf_counter()
    program = compile_chunk() if done_iters < n_iters else None
    compile_time = time.perf_counter() - t_compile

    def run_chunk(state, n):
        return program(state, jnp.int32(n)) if masked else program(state)

    rec.training(time.perf_counter(), env_steps)

    def fetch(n, metrics, episodes):
        """The host copy of a chunk's outputs, in one transfer (waits for the chunk), and
        the time it was ready."""
        metrics, done, rets, won = jax.device_get((metrics, episodes.done, episodes.returns,
                                                   episodes.won if wins else None))
        return n, time.perf_counter(), metrics, done, rets, won

    last_ready = None  # when the previous chunk's outputs were ready

    def record(n, now, metrics, done, rets, won):
        """Host-side bookkeeping of a finished chunk of n iterations (its outputs fetched):
        one record per `every` iterations, each stamped with a time interpolated between
        the previous chunk's end and this one's (the chunk ran them at an even pace)."""
        nonlocal env_steps, last_ready
        if S == 1:
            done, rets = done[None], rets[None]
            won = None if won is None else won[None]
        start = rec.t_train if last_ready is None else last_ready
        last_ready = now
        metrics = dict(metrics)
        versions = metrics.pop("version")
        for g0 in range(0, n, every):
            g1 = min(n, g0 + every)
            at = start + (now - start) * g1 / n
            for s in range(S):
                rec.add_rollout(done[s][g0:g1], rets[s][g0:g1], env_steps, at,
                                won=None if won is None else won[s][g0:g1], seed=s)
            env_steps += (g1 - g0) * per_iter
            fields = {k: float(np.mean(v[..., g0:g1])) for k, v in metrics.items()}
            if algo.schedules is not None:
                fields.update({k: float(v) for k, v in algo.schedules(env_steps).items()})
            rec.record(env_steps, int(versions[..., g1 - 1].max()), at, fields=fields)

    def save() -> None:
        rec.save(done_iters * updates_per_iter, state, time.perf_counter(),
                 dict(iterations=done_iters, env_steps=env_steps,
                      updates=int(np.asarray(state.learner.version).max())))

    progress.update(env_steps)
    # NOTE: chunk k's bookkeeping (episodes, records, progress) runs on the host while
    # chunk k + 1 computes: each chunk is dispatched, then the previous chunk's fetched
    # outputs are recorded, then this chunk's are fetched. One program is in flight at a
    # time (two on XLA:CPU, jax 0.10, were seen to deadlock: every thread idle, the outputs
    # never ready), and the host reads the device once per chunk. A checkpoint is taken
    # before the next dispatch, which donates the state buffers.
    pending, interrupted, completed = None, False, False
    try:
        while done_iters < n_iters:
            shutdown.check()
            n = min(chunk, n_iters - done_iters)
            # the chunk donates the state: keep its result; and a chunk's outputs are
            # fetched and recorded whole (a stop waits for them; check() then stops the run)
            with shutdown.critical():
                state, outputs = run_chunk(state, n)
                done_iters += n
                if pending is not None:
                    record(*pending)
                pending = fetch(n, *outputs)
                if rec.due(done_iters * updates_per_iter):
                    record(*pending)
                    pending = None
                    save()
        if pending is not None:
            last, pending = pending, None  # a stop landing in it: not recorded twice
            record(*last)
        completed = True
    except KeyboardInterrupt:
        # Ctrl-C / SIGTERM between chunks: keep what was trained (the last chunk's outputs
        # are fetched; they are recorded before the final save) and report it
        interrupted = True
        if pending is not None:
            record(*pending)
    finally:
        rec.final_checkpoint(save, allowed=completed or interrupted)  # not after an error

    rec.end_training(time.perf_counter())
    return rec.result(
        params=state.learner.params, algo=algo, env=env, env_steps=env_steps,
        updates=int(np.asarray(state.learner.version).max()),
        skipped_updates=int(np.asarray(state.learner.skipped_updates).sum()),
        compile_time_s=compile_time, interrupted=interrupted,
        extra_summary=sample_rates(config, algo, (env_steps - rec.env_steps0) * S, rec.train_time))
