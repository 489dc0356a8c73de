"""Finished runs from Python, one call each: `tianjax.load(run_dir)` and `tianjax.evaluate(run)`.

    run = tianjax.load("runs/ppo_CartPole-v1_fused_...")   # config, params, policy
    actions = run.policy(obs)                                # greedy actions [B, ...], jitted
    res = tianjax.evaluate(run, episodes=20)                 # or a run dir, or a TrainResult
    print(res.line(), res.returns.mean())

A run directory's config.yaml says which env, algorithm and network; its newest readable
checkpoint (or the checkpoint directory named, RUN_DIR/checkpoints/STEP) gives the
parameters. A run trained on your own env or network objects (`tianjax.train(config,
env=..., network=...)`) is loaded and evaluated with the same objects passed again
(a TrainResult remembers them).
"""

from __future__ import annotations

import os
from typing import Any, Callable, NamedTuple

import jax
import numpy as np

from tianjax.algos import Algorithm, make_algorithm
from tianjax.config import Config, ConfigError
from tianjax.networks.custom import use_network
from tianjax.runtime.record.saved_runs import EvalResult, evaluate_policy, policy_seeds, read_run


class LoadedRun(NamedTuple):
    config: Config
    params: Any  # a pytree (leading seed axis if the run trained num_seeds > 1)
    policy: Callable  # policy(obs [B, ...]) -> greedy actions [B, ...] (jitted; first seed)
    algo: Algorithm
    step: int  # the checkpoint's step (updates)
    run_dir: str
    obs_shape: tuple[int, ...]  # one observation's shape (the policy takes [B, *obs_shape])
    env: Any = None  # the env object given to load() (None: the config's env)
    network: Any = None  # the network object given to load()
    version: int | None = None  # the learner's version the checkpoint holds


def load(path: str | os.PathLike, *, env: Any = None, network: Any = None) -> LoadedRun:
    """Loads a run directory (newest readable checkpoint) or one checkpoint directory."""
    config, params, step, run_dir, version = read_run(os.fspath(path), "load")
    with use_network(network):
        algo, obs_shape = _algorithm(config, env)
    first = params if config.num_seeds == 1 else jax.tree.map(lambda x: x[0], params)
    greedy = jax.jit(algo.greedy)
    return LoadedRun(
        config,
        params,
        lambda obs: greedy(first, obs),
        algo,
        step,
        run_dir,
        obs_shape,
        env,
        network,
        version,
    )


def _algorithm(config: Config, env) -> tuple[Algorithm, tuple[int, ...]]:
    if config.env_backend == "gymnax":
        from tianjax.envs.gymnax_env import make_gymnax

        e = make_gymnax(config.env if env is None else env)
        obs_shape, obs_dtype, action_spec = e.obs_shape, e.obs_dtype, e.action_spec
    else:
        from tianjax.envs.factory import env_spec

        obs_shape, obs_dtype, action_spec = env_spec(config)
    return (
        make_algorithm(
            config, obs_shape, action_spec, correct_staleness=False, obs_dtype=obs_dtype
        ),
        tuple(obs_shape),
    )


def evaluate(
    run,
    episodes: int = 10,
    *,
    greedy: bool = True,
    seed: int | None = None,
    env: Any = None,
    network: Any = None,
) -> EvalResult:
    """Plays `episodes` episodes with a run's policy; returns an EvalResult (returns
    [episodes], x seeds for a multi-seed run; on envs that report wins, SMAX, also each
    episode's win and `win_rate`).

    `run` is a run directory or checkpoint directory, a LoadedRun, or the TrainResult of
    `tianjax.train` (its params are used as they are, no checkpoint read). The default
    episodes (no `seed`) are those the run's own evaluation of that version played, so a
    run's final `eval_return` comes out again.
    """
    if episodes < 1:
        raise ConfigError(f"evaluate: episodes must be >= 1, got {episodes}")
    from tianjax.train import TrainResult

    if isinstance(run, TrainResult):
        config, params, run_dir = run.config, run.params, run.run_dir
        step = version = int(run.summary.get("updates", 0))
        env = run.env if env is None else env
        network = run.network if network is None else network
    elif isinstance(run, LoadedRun):
        config, params, step, run_dir = run.config, run.params, run.step, run.run_dir
        version = run.version
        env = run.env if env is None else env
        network = run.network if network is None else network
    else:
        loaded = load(run, env=env, network=network)
        config, params, step, run_dir = loaded.config, loaded.params, loaded.step, loaded.run_dir
        version = loaded.version
    with use_network(network):
        returns, won = evaluate_policy(
            config, params, episodes, greedy, seed, env=env, version=version
        )
    return EvalResult(
        np.asarray(returns, np.float64), step, run_dir, won, seeds=policy_seeds(config)
    )


__all__ = ["LoadedRun", "evaluate", "load"]
