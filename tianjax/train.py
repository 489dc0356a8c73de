"""`tianjax.train(config)`: one entry point for every mode, from scripts and notebooks."""

from __future__ import annotations

import os
import time
from functools import partial
from typing import Any, NamedTuple, Sequence

import jax
import numpy as np

from tianjax.config import Config, ConfigError, load_config
from tianjax.metrics import Progress, RunLogger, format_summary
from tianjax.networks.custom import use_network
from tianjax.runtime.process import compile_cache, shutdown


class TrainResult(NamedTuple):
    params: Any  # the final parameters (a pytree; leading seed axis if num_seeds > 1)
    summary: dict  # what summary.json holds
    metrics: list[dict]  # the metrics.jsonl records
    run_dir: str
    config: Config
    env: Any = None  # the env object given to train() (None: the config's env id)
    network: Any = None  # the network object given to train()


def _runner(config: Config):
    if config.mode == "fused":
        from tianjax.runtime.runners.fused import run_fused

        return run_fused
    if config.num_actors == 0:
        from tianjax.runtime.runners.host import run_host

        return run_host
    from tianjax.launch.local import run_local

    return run_local


def _own_parts(config: Config, env, network):
    """Checks the env / network objects given to train(); returns the env as a JaxEnv."""
    in_process = config.mode == "fused" or config.num_actors == 0
    for key, obj in (("env", env), ("network", network)):
        if obj is not None and not in_process:
            raise ConfigError(f"config key '{key}': an object given to train() lives in this process "
                              "and actor processes cannot rebuild it; use mode: fused, or name it "
                              f"as 'module:Attr' ({'env' if key == 'env' else 'network.module'}) in "
                              "a module the actors can import")
    if env is None:
        return None
    from tianjax.envs.gymnax_env import make_gymnax

    return make_gymnax(env)


def train(config: Config | str | os.PathLike | dict | None = None, overrides: Sequence[str] = (),
          *, env: Any = None, network: Any = None, progress: bool | None = None, verbose: bool = True,
          **kwargs) -> TrainResult:
    """Trains a config (a Config, a YAML path or a dict, plus dotted overrides).

    `env` is an env id (the config key), or your own gymnax-API env object (fused mode);
    `network` is your own flax module (or a factory(obs_shape, action_spec) returning one)
    used instead of the built-in actor-critic, in this process (fused mode, or sync with
    num_actors 0). For actor processes name them as "module:Attr" instead (config keys
    `env` and `network.module`).

    Writes config.yaml, metrics.jsonl and summary.json to the run directory and returns
    the trained params with the run's metrics. `progress` forces the live bar on or off
    (default: on when attached to a terminal); `verbose` prints the final summary.
    """
    if isinstance(env, str):
        kwargs["env"], env = env, None
    env_obj = None
    if env is not None:
        from tianjax.envs.gymnax_env import make_gymnax

        env_obj = make_gymnax(env)
        kwargs.update(env=env_obj.name, env_backend="gymnax")
    config = load_config(config, overrides, **kwargs)
    _own_parts(config, env_obj, network)
    with use_network(network):
        result = _train(config, env_obj, progress, verbose)
    return result._replace(env=env, network=network)


def _train(config: Config, env, progress, verbose) -> TrainResult:
    shutdown.requested.clear()  # a stop asked of an earlier run in this process is done
    runner = _runner(config)
    if env is not None:
        runner = partial(runner, env=env)
    compile_cache.enable(config.compile_cache)
    if config.resume:
        if not os.path.isdir(config.resume):
            raise ConfigError(f"config key 'resume': '{config.resume}' is not a run directory")
        # metrics append to the run being continued (unless told to write elsewhere)
        logger = RunLogger(config, run_dir=config.run_dir or config.resume)
    else:
        logger = RunLogger(config)
    bar = Progress(config.total_env_steps * config.num_seeds, enabled=progress,
                   desc=f"{config.algo} {config.env} [{config.mode}]")
    t0 = time.perf_counter()
    try:
        out = runner(config, logger, bar)
    except BaseException:
        try:
            logger.close()  # keep what was logged (TensorBoard queues events) when a run fails
        except OSError:
            pass  # a full disk fails this too: the run's own error is the one to report
        raise
    finally:
        bar.close()
    wall = time.perf_counter() - t0
    eval_return = eval_win_rate = None
    if config.eval_episodes and config.mode == "fused" and config.num_seeds == 1:
        from tianjax.core.evaluation import make_evaluator

        wins = getattr(out.env, "reports_wins", False)
        evaluate = make_evaluator(out.env, out.algo, config.eval_episodes, wins=wins)
        rets = evaluate(out.params, jax.random.key(config.seed + 1))
        if wins:  # SMAX: the greedy policy's share of battles won
            rets, won = rets
            eval_win_rate = float(np.mean(np.asarray(won)))
        eval_return = float(np.mean(np.asarray(rets)))
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
        "eval_return": eval_return,
        "run_dir": logger.run_dir,
    }
    if out.final_win_rate is not None:  # envs that report wins (SMAX)
        summary["final_win_rate"] = out.final_win_rate
        summary["target_win_rate"] = config.target_win_rate
        if eval_win_rate is not None:
            summary["eval_win_rate"] = eval_win_rate
    summary["interrupted"] = bool(out.interrupted)  # stopped by Ctrl-C / SIGTERM
    if out.resumed_from_step is not None:
        summary["resumed_from_step"] = out.resumed_from_step
    summary.update(out.extra_summary)
    if out.final_return_per_seed is not None:
        summary["final_return_per_seed"] = out.final_return_per_seed
    summary = logger.write_summary(summary)
    records = logger.read_records()
    logger.close()
    if verbose:
        print(format_summary(summary), flush=True)
    return TrainResult(out.params, summary, records, logger.run_dir, config)
