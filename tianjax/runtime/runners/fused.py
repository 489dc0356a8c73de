"""Runs the fused trainer in jitted chunks, logging between them.

Compilation is done ahead of time (lower + compile) so that compile time is reported apart
from training time. A large state (a replay buffer) is donated, so each chunk updates it in
place; a small one is not (see DONATE_MIN_BYTES).

Checkpoints hold the whole FusedState (learner, the envs' states and keys, and the replay
buffer whatever `checkpoint.replay` says: the fused loop's learning_starts counts env
steps, so it cannot go on with an empty buffer), so a run resumed from one continues bit
for bit as if it had not stopped. They
are written at chunk boundaries: the first one at or after every `checkpoint.every`
updates, and at the end (also when stopped by Ctrl-C or SIGTERM). Episodes, records,
checkpoints and the result are kept by the run recorder (tianjax.runtime.record.recorder).
"""

from __future__ import annotations

import time
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from tianjax.algos import make_algorithm
from tianjax.config import Config
from tianjax.core.fused_loop import make_fused
from tianjax.envs.factory import make_jax_env
from tianjax.metrics import Progress, RunLogger
from tianjax.runtime.process import shutdown
from tianjax.runtime.record.outcome import RunOutcome
from tianjax.runtime.record.recorder import RunRecorder, sample_rates

# A chunk is one call of the one compiled program: the host reads the device once per
# chunk, so records (about 200 a run) are cut from a chunk's stacked outputs. Chunks aim at
# CHUNK_SECONDS of wall time, so that the progress line moves, Ctrl-C is answered and
# checkpoints are due that often however long the run, while a short run is a handful of
# calls (each call costs the host a dispatch and a read).
CHUNK_SECONDS = 2.0
GROWTH = 4  # a chunk is at most this many times the one before (the first ones measure the pace)
MAX_CHUNK_OUTPUT_BYTES = 64 << 20  # the stacked outputs of one chunk (episodes, metrics)
# NOTE: a state this large or larger is donated to each chunk (updated in place, never held
# twice); a smaller one is copied. Donating PPO's state (under 1 MiB on CartPole) made the
# chunks of a fused run 4 to 7% slower on XLA:CPU (jax 0.10, the same compiled program bar
# its entry copies; experiments/benchmarks, fused training), while a second copy of it costs
# nothing that matters. A replay buffer of hundreds of MiB must not be held twice.
DONATE_MIN_BYTES = 64 << 20


def chunk_capacity(n_iters: int, every: int, output_bytes_per_iter: int) -> int:
    """Iterations the compiled chunk program holds (what its outputs are stacked over):
    the whole run, or the whole records whose outputs fit MAX_CHUNK_OUTPUT_BYTES; one
    record at least. A chunk runs any number of them up to this (make_fused's num_valid)."""
    fit = max(1, MAX_CHUNK_OUTPUT_BYTES // max(output_bytes_per_iter, 1))
    if fit >= n_iters:
        return max(1, n_iters)
    return max(fit - fit % every, min(every, n_iters))


def next_chunk(n_prev: int, seconds_prev: float, every: int, capacity: int) -> int:
    """Iterations of the next chunk: the whole records that take about CHUNK_SECONDS at the
    pace of the previous chunk (n_prev iterations in seconds_prev), at most GROWTH times
    n_prev and `capacity`, one record at least."""
    rate = n_prev / max(seconds_prev, 1e-6)
    n = min(int(rate * CHUNK_SECONDS), GROWTH * n_prev, capacity)
    n -= n % every
    return max(n, min(every, capacity))


def tree_bytes(tree) -> int:
    """Bytes of a tree's arrays (or of the arrays its shapes describe), keys included."""
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def donate_argnums(state) -> tuple[int, ...]:
    """jit's donate_argnums for a program whose first argument is `state`: donated from
    DONATE_MIN_BYTES up, not below."""
    return (0,) if tree_bytes(state) >= DONATE_MIN_BYTES else ()


def run_fused(config: Config, logger: RunLogger, progress: Progress, env=None) -> RunOutcome:
    """Trains `config` in fused mode; the RunOutcome holds the params, the episode stats and
    the timings."""
    t_start = time.perf_counter()
    env = (
        env if env is not None else make_jax_env(config.env_backend, config.env, config.env_options)
    )
    algo = make_algorithm(
        config,
        env.obs_shape,
        env.action_spec,
        correct_staleness=False,
        obs_dtype=getattr(env, "obs_dtype", None),
    )
    init, run = make_fused(config, env, algo)
    S, B, T = config.num_seeds, config.num_envs, config.rollout_len
    per_iter = B * T
    n_iters = config.total_env_steps // per_iter  # never more steps than the budget
    every = min(config.log_interval, n_iters)  # iterations per record

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
    updates_per_iter = config.replay_config.updates_per_rollout if algo.buffer.replayed else 1

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

    # one program for every chunk: it holds `capacity` iterations and runs the first n
    def chunk_fn(state, num_valid):
        return run(state, capacity, num_valid)

    one_iter = jax.eval_shape(
        partial(run, num_iterations=1),
        state
        if S == 1
        else jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), state),
    )[1]
    capacity = chunk_capacity(n_iters, every, S * tree_bytes(one_iter))

    t_compile = time.perf_counter()
    program = None
    if done_iters < n_iters:
        fn = jax.vmap(chunk_fn, in_axes=(0, None)) if S > 1 else chunk_fn
        program = (
            jax.jit(fn, donate_argnums=donate_argnums(state))
            .lower(state, jnp.int32(capacity))
            .compile()
        )
    compile_time = time.perf_counter() - t_compile

    rec.training(time.perf_counter(), env_steps)

    def fetch(n, metrics, episodes):
        """The host copy of a chunk's outputs, in one transfer (waits for the chunk), and
        the time it was ready."""
        metrics, done, rets, won = jax.device_get(
            (metrics, episodes.done, episodes.returns, episodes.won if wins else None)
        )
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
                rec.add_rollout(
                    done[s][g0:g1],
                    rets[s][g0:g1],
                    env_steps,
                    at,
                    won=None if won is None else won[s][g0:g1],
                    seed=s,
                )
            env_steps += (g1 - g0) * per_iter
            fields = {k: float(np.mean(v[..., g0:g1])) for k, v in metrics.items()}
            if algo.schedules is not None:
                fields.update({k: float(v) for k, v in algo.schedules(env_steps).items()})
            rec.record(env_steps, int(versions[..., g1 - 1].max()), at, fields=fields)

    def save() -> None:
        rec.save(
            done_iters * updates_per_iter,
            state,
            time.perf_counter(),
            dict(
                iterations=done_iters,
                env_steps=env_steps,
                updates=int(np.asarray(state.learner.version).max()),
            ),
        )

    progress.update(env_steps)

    # NOTE: chunk k's bookkeeping (episodes, records, progress) runs on the host while
    # chunk k + 1 computes: each chunk is dispatched, then the previous chunk's fetched
    # outputs are recorded, then this chunk's are fetched. One program is in flight at a
    # time (two on XLA:CPU, jax 0.10, were seen to deadlock: every thread idle, the outputs
    # never ready), and the host reads the device once per chunk. A checkpoint is taken
    # before the next dispatch, which may donate the state buffers.
    def to_checkpoint(done: int) -> int:
        """Iterations up to the first record boundary at or after the next multiple of
        checkpoint.every updates (no limit without periodic checkpoints)."""
        ck = config.checkpoint.every
        if ck <= 0:
            return n_iters
        updates = ck - (done * updates_per_iter) % ck
        iters = -(-updates // updates_per_iter)
        return max(every, -(-iters // every) * every)

    pending, interrupted, completed = None, False, False
    n = min(every, capacity)  # the first chunk: one record, to measure the pace
    try:
        # (stop_at_target: the episodes of a chunk are counted while the next one runs, so
        # the run ends one chunk, about CHUNK_SECONDS, after the one in which it converged)
        while done_iters < n_iters and not rec.stop_now():
            shutdown.check()
            n = min(n, n_iters - done_iters, to_checkpoint(done_iters))
            # the chunk may donate the state: keep its result; and a chunk's outputs are
            # fetched and recorded whole (a stop waits for them; check() then stops the run)
            with shutdown.critical():
                t_dispatch = time.perf_counter()
                state, outputs = program(state, jnp.int32(n))
                done_iters += n
                if pending is not None:
                    record(*pending)
                pending = fetch(n, *outputs)
                n = next_chunk(n, pending[1] - t_dispatch, every, capacity)
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
        # training ends with the last chunk; the final save is timed apart (final_checkpoint_s)
        rec.end_training(time.perf_counter())
        rec.final_checkpoint(save, allowed=completed or interrupted)  # not after an error

    return rec.result(
        params=state.learner.params,
        algo=algo,
        env=env,
        env_steps=env_steps,
        updates=int(np.asarray(state.learner.version).max()),
        skipped_updates=int(np.asarray(state.learner.skipped_updates).sum()),
        compile_time_s=compile_time,
        interrupted=interrupted,
        extra_summary=sample_rates(config, algo, (env_steps - rec.env_steps0) * S, rec.train_time),
    )


__all__ = [
    "CHUNK_SECONDS",
    "DONATE_MIN_BYTES",
    "GROWTH",
    "MAX_CHUNK_OUTPUT_BYTES",
    "chunk_capacity",
    "donate_argnums",
    "next_chunk",
    "run_fused",
    "tree_bytes",
]
