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

Evaluation (the `eval` section) runs inside the chunk program: after a chunk's iterations,
when asked, `eval.episodes` episodes of the parameters the chunk ended with are played side
by side (tianjax.core.evaluation.play_episodes, vmapped over seeds too). Chunks end where an
evaluation is due, like checkpoints: at the first record boundary at or after each multiple
of `eval.every_updates` updates, or, with `eval.every_s`, at the end of the first chunk that
ends that long after the last evaluation (chunks then aim at no more than every_s). The
last chunk always evaluates, so the run's final evaluation is of its final parameters. The
video and the best parameters of an evaluation are made on the host from the state the
chunk ended with, before the next chunk is dispatched.
"""

from __future__ import annotations

import time
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from tianjax.algos import make_algorithm
from tianjax.config import Config
from tianjax.core.evaluation import EvalOutput, play_episodes
from tianjax.core.fused_loop import corrects_staleness, make_fused
from tianjax.envs.factory import make_jax_env
from tianjax.metrics import Progress, RunLogger
from tianjax.runtime.evaluation.play import MAX_STEPS, Evaluation, eval_key
from tianjax.runtime.evaluation.schedule import EvalSchedule
from tianjax.runtime.process import shutdown
from tianjax.runtime.record.evaluations import eval_fields
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


def next_chunk(
    n_prev: int, seconds_prev: float, every: int, capacity: int, seconds: float = CHUNK_SECONDS
) -> int:
    """Iterations of the next chunk: the whole records that take about `seconds` (default
    CHUNK_SECONDS) at the pace of the previous chunk (n_prev iterations in seconds_prev), at
    most GROWTH times n_prev and `capacity`, one record at least."""
    rate = n_prev / max(seconds_prev, 1e-6)
    n = min(int(rate * seconds), GROWTH * n_prev, capacity)
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
        correct_staleness=corrects_staleness(config),
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

    ec = config.eval

    # one program for every chunk: it holds `capacity` iterations and runs the first n, then
    # (do_eval) evaluates the parameters it ended with
    def chunk_fn(state, num_valid, do_eval):
        state, outputs = run(state, capacity, num_valid)
        if not ec.on:
            return state, outputs, None
        learner = state.learner

        def evaluate():
            key = eval_key(config, learner.version)
            return play_episodes(env, algo, learner.params, key, ec.episodes, ec.greedy, MAX_STEPS)

        shapes = jax.eval_shape(evaluate)
        none = lambda: jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), shapes)  # noqa: E731
        return state, outputs, jax.lax.cond(do_eval, evaluate, none)

    schedule = EvalSchedule(ec, done_iters * updates_per_iter)
    # (its video and best params; its returns are the chunk program's)
    evaluation = Evaluation(config, logger.run_dir, env=env, returns=False) if ec.on else None
    chunk_seconds = min(CHUNK_SECONDS, ec.every_s) if ec.every_s else CHUNK_SECONDS
    last_eval_t = time.perf_counter()

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
        fn = jax.vmap(chunk_fn, in_axes=(0, None, None)) if S > 1 else chunk_fn
        program = (
            jax.jit(fn, donate_argnums=donate_argnums(state))
            .lower(state, jnp.int32(capacity), jnp.bool_(False))
            .compile()
        )
    compile_time = time.perf_counter() - t_compile

    rec.training(time.perf_counter(), env_steps)

    def fetch(n, outputs, ev: EvalOutput | None):
        """The host copy of a chunk's outputs, in one transfer (waits for the chunk), the
        time it was ready, and its evaluation's fields (None: it made none)."""
        metrics, episodes = outputs
        metrics, done, rets, won, ev = jax.device_get(
            (metrics, episodes.done, episodes.returns, episodes.won if wins else None, ev)
        )
        fields = None
        if ev is not None:
            fields = eval_fields(ev.returns, ev.lengths, ev.won if wins else None)
        return n, time.perf_counter(), metrics, done, rets, won, fields

    def evaluated(pending) -> None:
        """A chunk that evaluated has ended (`state` is what it ended with, before the next
        chunk may donate it): its video and best params."""
        now, fields = pending[1], pending[-1]
        version = int(np.asarray(state.learner.version).max())
        schedule.done(done_iters * updates_per_iter, now)
        if evaluation is not None and (evaluation.video or evaluation.best):
            params = state.learner.params
            first = params if S == 1 else jax.tree.map(lambda x: x[0], params)
            if evaluation.video is not None:  # (of the first seed)
                fields["eval_video"] = evaluation.video(first, version, eval_key(config, version))
            if evaluation.best is not None:
                evaluation.best.offer(params, version, done_iters * per_iter, fields["eval_return"])

    def eval_due(n: int, now: float) -> bool:
        """Whether the chunk of `n` iterations about to run evaluates at its end."""
        if not ec.on:
            return False
        if done_iters + n >= n_iters:
            return True  # the final evaluation
        if ec.every_s is not None:
            expected = n * max(pace, 1e-9)
            return now + expected - last_eval_t >= ec.every_s
        return schedule.due((done_iters + n) * updates_per_iter, now)

    last_ready = None  # when the previous chunk's outputs were ready
    pace = 0.0  # seconds per iteration, as the last chunk ran

    def record(n, now, metrics, done, rets, won, eval_fields_=None):
        """Host-side bookkeeping of a finished chunk of n iterations (its outputs fetched):
        one record per `every` iterations, each stamped with a time interpolated between
        the previous chunk's end and this one's (the chunk ran them at an even pace); then
        its evaluation's record, of the version it ended with."""
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
        if eval_fields_ is not None:
            rec.evaluation(int(versions[..., n - 1].max()), env_steps, now, eval_fields_)

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
    def to_evaluation(done: int) -> int:
        """Iterations up to the first record boundary at or after the next multiple of
        eval.every_updates updates (no limit otherwise)."""
        updates = schedule.updates_to_next(done * updates_per_iter)
        if updates is None:
            return n_iters
        iters = -(-updates // updates_per_iter)
        return max(every, -(-iters // every) * every)

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
            n = min(n, n_iters - done_iters, to_checkpoint(done_iters), to_evaluation(done_iters))
            # the chunk may donate the state: keep its result; and a chunk's outputs are
            # fetched and recorded whole (a stop waits for them; check() then stops the run)
            with shutdown.critical():
                t_dispatch = time.perf_counter()
                do_eval = eval_due(n, t_dispatch)
                state, outputs, ev = program(state, jnp.int32(n), jnp.bool_(do_eval))
                done_iters += n
                if pending is not None:
                    record(*pending)
                pending = fetch(n, outputs, ev if do_eval else None)
                if do_eval:
                    evaluated(pending)
                    last_eval_t = pending[1]
                pace = (pending[1] - t_dispatch) / n
                n = next_chunk(n, pending[1] - t_dispatch, every, capacity, chunk_seconds)
                if rec.due(done_iters * updates_per_iter):
                    record(*pending)
                    pending = None
                    save()
        if pending is not None:
            last, pending = pending, None  # a stop landing in it: not recorded twice
            record(*last)
        if ec.on and program is not None and schedule.last_version < done_iters * updates_per_iter:
            # ended before its last chunk (stop_at_target): the final parameters evaluated
            # by the same program, running none of its iterations
            state, outputs, ev = program(state, jnp.int32(0), jnp.bool_(True))
            pending = fetch(0, outputs, ev)
            evaluated(pending)
            last, pending = pending, None
            version = int(np.asarray(state.learner.version).max())
            rec.evaluation(version, env_steps, last[1], last[-1])
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
