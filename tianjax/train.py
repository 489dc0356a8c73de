"""`tianjax.train(config)`: one entry point for every mode, from scripts and notebooks."""

from __future__ import annotations

import os
import time
from functools import partial
from typing import Any, NamedTuple, Sequence

import numpy as np

from tianjax.config import Config, ConfigError, load_config
from tianjax.metrics import Progress, RunLogger, format_summary
from tianjax.networks.custom import use_network
from tianjax.runtime.process import compile_cache, shutdown
from tianjax.runtime.record.evaluations import is_evaluation
from tianjax.runtime.runners import runner_for


class TrainResult(NamedTuple):
    params: Any  # the final parameters (a pytree; leading seed axis if num_seeds > 1)
    summary: dict  # what summary.json holds
    # the training records of metrics.jsonl as columns (see records_to_columns)
    metrics: dict[str, np.ndarray]
    run_dir: str | None  # None: trained with save=False
    config: Config
    env: Any = None  # the env object given to train() (None: the config's env id)
    network: Any = None  # the network object given to train()
    # the evaluation records as columns (env_steps, updates = the version, eval_*); empty
    # where the run did not evaluate. Kept apart so a training column has no gaps.
    evaluations: dict[str, np.ndarray] | None = None


def records_to_columns(records: Sequence[dict]) -> dict[str, np.ndarray]:
    """Records (dicts) to columns keyed like them, one entry per record: numbers as a float
    array (NaN where a record lacks the key or holds null), integers as int64 where every
    record has one, anything else (lists, dicts, strings) as an object array."""
    keys: dict[str, None] = {}
    for r in records:
        keys.update(dict.fromkeys(r))
    out = {}
    for k in keys:
        values = [r.get(k) for r in records]
        if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            out[k] = np.asarray(values, np.int64)
        elif all(v is None or isinstance(v, (int, float)) for v in values):
            out[k] = np.asarray([np.nan if v is None else float(v) for v in values], np.float64)
        else:
            column = np.empty(len(values), object)
            column[:] = values
            out[k] = column
    return out


def _own_parts(config: Config, env, network):
    """Checks the env / network objects given to train(); returns the env as a JaxEnv."""
    in_process = config.in_process
    for key, obj in (("env", env), ("network", network)):
        if obj is not None and not in_process:
            raise ConfigError(
                f"config key '{key}': an object given to train() lives in this process "
                "and actor processes cannot rebuild it; use mode: fused, or name it "
                f"as 'module:Attr' ({'env' if key == 'env' else 'network.module'}) in "
                "a module the actors can import"
            )
    if env is None:
        return None
    from tianjax.envs.gymnax_env import make_gymnax

    return make_gymnax(env)


def train(
    config: Config | str | os.PathLike | dict | None = None,
    overrides: Sequence[str] = (),
    *,
    env: Any = None,
    network: Any = None,
    progress: bool | None = None,
    verbose: bool = True,
    run_dir: str | os.PathLike | None = None,
    save: bool = True,
    **kwargs,
) -> TrainResult:
    """Trains a config (a Config, a YAML path or a dict, plus dotted overrides).

    `env` is an env id (the config key), or your own gymnax-API env object (fused mode);
    `network` is your own flax module (or a factory(obs_shape, action_spec) returning one)
    used instead of the built-in actor-critic, in this process (fused mode, or sync with
    num_actors 0). For actor processes name them as "module:Attr" instead (config keys
    `env` and `network.module`).

    `config` may also be a shipped config's name ("ppo_cartpole"), with `overrides`.
    Writes config.yaml, metrics.jsonl and summary.json (and TensorBoard events, checkpoints)
    to `run_dir` (default: the config's, else runs/<algo>_<env>_<mode>_<time>) and returns
    the trained params with the run's metrics as columns. `save=False` leaves nothing
    behind: the run works in a temporary directory, removed when it returns, without
    checkpoints where the params come back in memory and without `loggers`
    (`result.run_dir` is None). `progress` forces the live bar on or off (default: on when
    attached to a terminal); `verbose` prints the final summary.
    """
    if run_dir is not None:
        kwargs["run_dir"] = os.fspath(run_dir)
    if isinstance(env, str):
        kwargs["env"], env = env, None
    env_obj = None
    if env is not None:
        from tianjax.envs.gymnax_env import make_gymnax

        env_obj = make_gymnax(env)
        kwargs.update(env=env_obj.name, env_backend="gymnax")
    config = load_config(config, overrides, **kwargs)
    _own_parts(config, env_obj, network)
    if not save:
        return _train_unsaved(config, env_obj, network, progress, verbose)._replace(
            env=env, network=network
        )
    with use_network(network):
        result = _train(config, env_obj, progress, verbose)
    return result._replace(env=env, network=network)


def _train_unsaved(config: Config, env, network, progress, verbose) -> TrainResult:
    """train(save=False): the run in a temporary directory, removed at the end (actor
    processes and a learner process hand over metrics and params through files)."""
    import dataclasses
    import shutil
    import tempfile

    if config.run_dir is not None:
        raise ConfigError(
            f"config key 'run_dir': save=False writes nothing, but run_dir is "
            f"{config.run_dir!r}; drop one of them"
        )
    if config.resume:
        raise ConfigError(
            "config key 'resume': save=False cannot continue a run (it writes no checkpoint)"
        )
    in_process = config.in_process
    changes = dict(loggers=())
    if in_process:  # the params come back in memory: no checkpoint needed
        changes["checkpoint"] = dataclasses.replace(config.checkpoint, every=0, final=False)
    tmp = tempfile.mkdtemp(prefix="tianjax-unsaved-")
    try:
        config = dataclasses.replace(config, run_dir=tmp, **changes)
        with use_network(network):
            result = _train(config, env, progress, verbose, saved=False)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result.summary["run_dir"] = None
    return result._replace(run_dir=None, config=dataclasses.replace(result.config, run_dir=None))


def _train(config: Config, env, progress, verbose, saved: bool = True) -> TrainResult:
    shutdown.requested.clear()  # a stop asked of an earlier run in this process is done
    if not config.in_process:
        from tianjax.launch.placement import place_learner

        place_learner(config)  # before anything starts JAX here: the learner's devices
    runner = runner_for(config)
    if env is not None:
        runner = partial(runner, env=env)
    from tianjax.runtime.runners import preflight

    preflight.check(config, env_given=env is not None)  # before the run directory exists
    compile_cache.enable(config.compile_cache)
    if config.resume:
        if not os.path.isdir(config.resume):
            raise ConfigError(f"config key 'resume': '{config.resume}' is not a run directory")
        # metrics append to the run being continued (unless told to write elsewhere)
        logger = RunLogger(config, run_dir=config.run_dir or config.resume)
    else:
        logger = RunLogger(config)
    bar = Progress(
        config.total_env_steps * config.num_seeds,
        enabled=progress,
        desc=f"{config.algo} {config.env} [{config.mode}]",
    )
    t0 = time.perf_counter()
    try:
        out = runner(config, logger, bar)
    except BaseException as e:
        try:
            logger.close(
                failing=e
            )  # keep what was logged (TensorBoard queues events) when a run fails
        except OSError:
            pass  # a full disk fails this too: the run's own error is the one to report
        raise
    finally:
        bar.close()
    wall = time.perf_counter() - t0
    summary = {
        "mode": config.mode,
        "algo": config.algo,
        "env": config.env,
        "env_backend": config.env_backend,
        "seed": config.seed,
        "num_seeds": config.num_seeds,
        "env_steps": out.env_steps,
        "updates": out.updates,
        "wall_time_s": out.wall_offset_s + wall,  # a resumed run counts its past
        "compile_time_s": out.compile_time_s,
        "env_steps_per_s": out.env_steps_per_s,
        "episodes": out.episodes,
        "final_return": out.final_return,
        "target_return": config.target_return,
        "convergence_time_s": out.convergence_time_s,
        "convergence_env_steps": out.convergence_env_steps,
        "skipped_updates": out.skipped_updates,
        # the final and the best evaluation, and the versions they evaluated (the runner's
        # figures below fill them in where the run evaluated: eval.episodes)
        "eval_return": None,
        "eval_version": None,
        "eval_best_return": None,
        "eval_best_version": None,
        "run_dir": logger.run_dir,
    }
    if out.final_win_rate is not None:  # envs that report wins (SMAX)
        summary["final_win_rate"] = out.final_win_rate
        summary["target_win_rate"] = config.target_win_rate
    summary["interrupted"] = bool(out.interrupted)  # stopped by Ctrl-C / SIGTERM
    # ended early by stop_at_target (not by the budget, nor a signal)
    summary["stopped_at_target"] = bool(
        config.stop_at_target
        and out.convergence_time_s is not None
        and not out.interrupted
        and out.env_steps < config.total_env_steps
    )
    if out.resumed_from_step is not None:
        summary["resumed_from_step"] = out.resumed_from_step
    summary.update(out.extra_summary)
    if out.final_return_per_seed is not None:
        summary["final_return_per_seed"] = out.final_return_per_seed
    summary = logger.write_summary(summary)
    records = logger.read_records()
    logger.close()
    if verbose:
        print(
            format_summary(dict(summary, run_dir=logger.run_dir if saved else "(not saved)")),
            flush=True,
        )
    evals = [r for r in records if is_evaluation(r)]
    trained = [r for r in records if not is_evaluation(r)]
    return TrainResult(
        out.params,
        summary,
        records_to_columns(trained),
        logger.run_dir,
        config,
        evaluations=records_to_columns(evals),
    )


__all__ = ["TrainResult", "records_to_columns", "train"]
