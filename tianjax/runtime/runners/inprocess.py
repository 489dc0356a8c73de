"""The in-process trainer for host envs (envpool, gymnasium): a Python loop around jitted
policy and learner functions.

One batch of `config.num_envs` host envs (tianjax.envs.factory) is stepped from Python. Each
iteration:

1. acts for `rollout_len` steps with a jitted `algo.act` (the policy stays on the device;
   one device->host transfer per step brings back the actions, log-probs and values of
   the whole batch), building a numpy [T, B] Trajectory stamped with the learner version;
   Python works per batch, never per sample;
2. evaluates the truncation bootstrap V(final_obs) with `algo.value` once per rollout,
   batched over only the (step, env) pairs where an episode was cut by a time limit, B
   observations per call (padded, so one shape is compiled), and not at all when no
   episode was cut;
3. applies the jitted `algo.update` to that batch.

Replay algorithms (DQN) run the same loop, adding each rollout's [T * B] transitions to an
on-device replay buffer and taking `dqn.updates_per_rollout` gradient steps once
`dqn.learning_starts` env steps have been collected, exactly as the fused loop does (the
same tianjax.core.replay.setup set-up). Episodes, records, checkpoints and the result are kept by
the run recorder (tianjax.runtime.record.recorder), as in the other runners.

Modes: `sync` is this loop. `async` runs the same single-process loop (its learner uses
the staleness-corrected losses, which reduce to the plain ones because every batch here is
fresh); actor and learner processes that really run apart, and several actors, are the
distributed runtime's. Here `num_actors` is 0 or 1: one batch of envs, acted on inside the
learner's process.

Evaluation (the `eval` section) runs in this process too, between two iterations, on an
env batch of its own (`eval.episodes` host envs built at the start): the run is one process
by choice, so an evaluation costs its time here (each record's `eval_s` says how much),
where a sync or async run hands it to a process of its own.

Everything jitted (act, value, update) is compiled ahead of time (lower + compile) before
the first env step, so that compile time is reported apart from training time. The
stepping itself is `tianjax.runtime.actor.sources.HostSource`, the same code an actor process
runs.
"""

from __future__ import annotations

import time

import jax
import numpy as np

from tianjax.algos import make_algorithm
from tianjax.config import Config, ConfigError
from tianjax.core.algorithm import Algorithm
from tianjax.core.buffer_kind import buffer_kind
from tianjax.core.replay.setup import make_replay, make_replay_learn
from tianjax.envs.factory import HostEnv, make_host_env
from tianjax.metrics import Progress, RunLogger
from tianjax.runtime.actor.sources import HostSource, batch_template
from tianjax.runtime.evaluation.play import Evaluation
from tianjax.runtime.evaluation.schedule import EvalSchedule
from tianjax.runtime.process import shutdown
from tianjax.runtime.record.outcome import RunOutcome
from tianjax.runtime.record.recorder import RunRecorder, sample_rates


def _check_config(config: Config) -> None:
    if config.num_actors not in (0, 1):
        raise ConfigError(
            f"config key 'num_actors': the in-process host trainer acts with one batch "
            f"of envs in the learner's process (num_actors 0 or 1), got "
            f"{config.num_actors}; several actor processes need the distributed "
            "runtime (or raise num_envs for more envs here)"
        )


def _mean_metrics(metrics: list[dict]) -> dict:
    if not metrics:
        return {}
    host = jax.device_get(metrics)
    return {k: float(np.mean([np.mean(m[k]) for m in host])) for k in host[0]}


def run_host(
    config: Config,
    logger: RunLogger,
    progress: Progress,
    env: HostEnv | None = None,
    algo: Algorithm | None = None,
) -> RunOutcome:
    """Trains `config` on host envs in this process. Returns the same keys as run_fused.

    `env` (a HostEnv of config.num_envs envs) and `algo` may be passed in instead of being
    built from the config (tests, custom envs); an env built here is closed at the end.
    """
    t_start = time.perf_counter()
    _check_config(config)
    own_env = env is None
    if own_env:
        env = make_host_env(
            config.env_backend, config.env, config.num_envs, config.seed, **config.env_options
        )
    try:
        if env.num_envs != config.num_envs:
            raise ConfigError(
                f"config key 'num_envs': is {config.num_envs} but the env passed in "
                f"has {env.num_envs} envs"
            )
        if algo is None:
            algo = make_algorithm(
                config,
                env.obs_shape,
                env.action_spec,
                correct_staleness=False,
                obs_dtype=env.obs_dtype,
            )
        else:  # (one built elsewhere may name its buffer kind)
            algo = algo._replace(buffer=buffer_kind(algo.buffer))
        out = _train(config, logger, progress, env, algo, t_start)
    finally:
        if own_env:
            env.close()
    return out


def _train(
    config: Config,
    logger: RunLogger,
    progress: Progress,
    env: HostEnv,
    algo: Algorithm,
    t_start: float,
) -> RunOutcome:
    B, T = config.num_envs, config.rollout_len
    n_iters = config.total_env_steps // (B * T)  # never more steps than the budget
    replay = algo.buffer.replayed

    t = time.perf_counter()
    k_learn, k_act = jax.random.split(jax.random.key(config.seed))
    learner = jax.jit(algo.init)(k_learn)
    source = HostSource(config, algo, config.seed, env=env, key=k_act)
    source.compile(learner.params)
    template = batch_template(config, algo, env.obs_shape, source.obs_dtype)[0]
    if replay:
        rb = jax.jit(make_replay(config, algo).init)(template)
        learn = (
            jax.jit(make_replay_learn(config, algo), donate_argnums=(0, 1))
            .lower(learner, rb, template, np.int32(0))
            .compile()
        )
    else:
        learn = jax.jit(algo.update, donate_argnums=0).lower(learner, template).compile()
    compile_time = time.perf_counter() - t

    # host envs report no wins: the return decides convergence
    rec = RunRecorder(config, logger, progress, win_target=False)
    env_steps, t_update, start_iter = 0, 0.0, 0
    keep_replay = replay and config.checkpoint.replay

    def tree():
        return {"learner": learner, "replay": rb} if keep_replay else {"learner": learner}

    if config.resume:
        # the envs start afresh (host envs cannot be saved); learner and counters go on
        restored, meta = rec.resume(tree())
        learner = restored["learner"]
        rb = restored.get("replay", rb if replay else None)
        env_steps, start_iter = meta["env_steps"], meta["iterations"]
    rec.start(t_start)  # a resumed run's clock goes on
    # labelled by updates scheduled (iterations x updates per iteration), as in fused mode
    per_iter_updates = config.replay_config.updates_per_rollout if replay else 1
    rec.open_checkpoints(logger.run_dir, start=start_iter * per_iter_updates)
    replay_base = 0 if keep_replay or rec.resumed_from is None else env_steps  # see learn() below
    pending: list[dict] = []
    version = int(learner.version)
    it = start_iter

    def save():
        rec.save(
            it * per_iter_updates,
            tree(),
            time.perf_counter(),
            dict(iterations=it, env_steps=env_steps, updates=version),
        )

    evaluation = Evaluation(config, logger.run_dir) if config.eval.on else None
    schedule = EvalSchedule(config.eval, version, time.perf_counter())

    def evaluate() -> None:
        now = time.perf_counter()
        fields = evaluation.evaluate(learner.params, version, env_steps)
        rec.evaluation(version, env_steps, now, fields, age_s=0.0)
        schedule.done(version, now)

    rec.training(time.perf_counter(), env_steps)
    interrupted = completed = False
    try:
        while it < n_iters and not rec.stop_now():
            shutdown.check()
            rollout = source(learner.params, version, env_steps)
            rec.add_rollout(
                rollout.episodes.done, rollout.episodes.returns, env_steps, time.perf_counter()
            )
            env_steps += B * T
            t0 = time.perf_counter()
            with shutdown.critical():  # the update donates its inputs: finish it
                if replay:
                    # learning_starts counts the samples in the buffer: a resumed run whose
                    # checkpoint left the buffer out refills it first
                    learner, rb, metrics = learn(
                        learner, rb, rollout.batch, np.int32(env_steps - replay_base)
                    )
                else:
                    learner, metrics = learn(learner, rollout.batch)
            pending.append(metrics)
            version = int(learner.version)  # waits for the update (the next act would anyway)
            t_update += time.perf_counter() - t0
            it += 1

            if it % config.log_interval == 0 or it == n_iters:
                fields = _mean_metrics(pending)
                if algo.schedules is not None:
                    fields.update({k: float(v) for k, v in algo.schedules(env_steps).items()})
                pending = []
                rec.record(env_steps, version, time.perf_counter(), fields=fields)
            if evaluation is not None and schedule.due(version, time.perf_counter()):
                evaluate()
            if rec.due(it * per_iter_updates):
                save()
        if evaluation is not None and schedule.last_version < version:
            evaluate()  # the final parameters
        completed = True
    except KeyboardInterrupt:  # Ctrl-C / SIGTERM: checkpoint and report what was done
        interrupted = True
    finally:
        # training ends with the last update; the final save is timed apart (final_checkpoint_s).
        # Interrupted inside an update, its input was donated: then the last periodic one stands
        rec.end_training(time.perf_counter())
        rec.final_checkpoint(save, tolerant=interrupted, allowed=completed or interrupted)
        if evaluation is not None:
            evaluation.close()

    train_time = rec.train_time
    return rec.result(
        params=learner.params,
        algo=algo,
        env=env,
        env_steps=env_steps,
        updates=int(learner.version),
        skipped_updates=int(learner.skipped_updates),
        compile_time_s=compile_time,
        interrupted=interrupted,
        # where the training time went: acting (env steps and policy) and learning
        extra_summary={
            "act_time_s": train_time - t_update,
            "update_time_s": t_update,
            **sample_rates(config, algo, env_steps - rec.env_steps0, train_time),
        },
    )


__all__ = ["run_host"]
