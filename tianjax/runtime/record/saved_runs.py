"""`tianjax eval`: play a trained policy from a run directory or one of its checkpoints.

The run's config.yaml says which env and network; the newest readable checkpoint (or the
one named) gives the parameters. JAX envs are evaluated in one jitted loop
(tianjax.core.evaluation); host envs (envpool, gymnasium) by stepping `episodes` envs from Python
with the jitted policy until each has finished one episode.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import numpy as np

from tianjax.algos import make_algorithm
from tianjax.checkpoint import store as ckpt
from tianjax.config import Config, ConfigError, load_config


@dataclass(frozen=True)
class EvalResult:
    returns: np.ndarray  # [episodes] (x seeds, flattened)
    step: int  # the checkpoint's step (updates)
    run_dir: str
    won: np.ndarray | None = None  # [episodes] bool, for envs that report wins (SMAX); else None
    seeds: int = 1  # a fused run of num_seeds policies: `episodes` each, flattened in `returns`

    @property
    def win_rate(self) -> float | None:
        """The share of episodes won (each env's first battle), or None where the env reports no wins."""
        return None if self.won is None else float(np.mean(self.won))

    def line(self) -> str:
        r = self.returns
        wins = "" if self.won is None else f"  win rate {self.win_rate:.3f}"
        count = (
            f"{len(r) // self.seeds} episodes x {self.seeds} seeds"
            if self.seeds > 1
            else f"{len(r)} episodes"
        )
        return (
            f"eval {count} (checkpoint step {self.step}): mean {r.mean():.2f}  "
            f"std {r.std():.2f}  min {r.min():.2f}  max {r.max():.2f}{wins}"
        )


def locate(path: str) -> tuple[str, int | None]:
    """(run directory, checkpoint step or None for the newest) for a run directory or a
    checkpoint step directory (RUN_DIR/checkpoints/STEP)."""
    path = os.path.abspath(path)
    if not os.path.exists(path):
        raise ConfigError(f"eval: '{path}' does not exist")
    parent = os.path.dirname(path)
    if os.path.basename(parent) == ckpt.CHECKPOINT_DIR and os.path.basename(path).isdigit():
        return os.path.dirname(parent), int(os.path.basename(path))
    if not os.path.isfile(os.path.join(path, "config.yaml")):
        raise ConfigError(
            f"eval: '{path}' is neither a run directory (no config.yaml) nor a "
            f"checkpoint (RUN_DIR/{ckpt.CHECKPOINT_DIR}/STEP)"
        )
    return path, None


def require_checkpoint(run_dir: str, what: str = "eval") -> None:
    """ConfigError saying so when a run directory holds no checkpoint to read params from."""
    if not ckpt.has_checkpoint(run_dir):
        raise ConfigError(
            f"{what}: the run in '{run_dir}' has no checkpoints, so there are no params to "
            "evaluate (it stopped before its first, or trained with checkpoint.final=false and "
            "checkpoint.every=0); train it with checkpoint.final=true"
        )


class SavedRun(NamedTuple):
    config: Config  # the run's config.yaml (resume cleared)
    params: Any  # the checkpoint's parameters, as restored (nested dicts)
    step: int  # the checkpoint's step (updates)
    run_dir: str
    version: int | None = None  # the learner's version it holds (None: not recorded)


def read_run(path: str, what: str = "eval") -> SavedRun:
    """The config and parameters of a run directory's newest readable checkpoint, or of
    the checkpoint directory named (RUN_DIR/checkpoints/STEP); `what` names the caller in
    the error of a run without checkpoints."""
    run_dir, step = locate(path)
    config = load_config(os.path.join(run_dir, "config.yaml"), saved=True, resume=None)
    if step is None:
        require_checkpoint(run_dir, what)
        step, state, meta = ckpt.restore_latest(run_dir)
    else:
        step, state, meta = ckpt.restore_step(run_dir, step)
    version = meta.get("updates")
    return SavedRun(
        config,
        state["learner"]["params"],
        int(step),
        run_dir,
        None if version is None else int(version),
    )


def _host_returns(
    config: Config, algo, action_spec, params, episodes: int, greedy: bool, seed: int, key
) -> np.ndarray:
    from tianjax.envs.factory import make_host_env
    from tianjax.runtime.evaluation.play import host_policy, play_host

    env = make_host_env(config.env_backend, config.env, episodes, seed, **config.env_options)
    try:
        policy = host_policy(algo, action_spec, greedy)
        return play_host(env, policy, params, key, episodes, seed)[0]
    finally:
        env.close()


def evaluate_run(
    path: str, episodes: int = 10, greedy: bool = True, seed: int | None = None
) -> EvalResult:
    """Evaluates the newest readable checkpoint of a run (or the named checkpoint)."""
    if episodes < 1:
        raise ConfigError(f"eval: episodes must be >= 1, got {episodes}")
    run = read_run(path)
    returns, won = evaluate_policy(
        run.config, run.params, episodes, greedy, seed, version=run.version
    )
    return EvalResult(returns, run.step, run.run_dir, won, seeds=policy_seeds(run.config))


def policy_seeds(config: Config) -> int:
    """The policies a run's checkpoint holds: num_seeds for a fused run, else one."""
    return config.num_seeds if config.mode == "fused" else 1


def evaluate_params(
    config: Config,
    params,
    episodes: int = 10,
    greedy: bool = True,
    seed: int | None = None,
    env=None,
) -> np.ndarray:
    """Returns [episodes] (x seeds, flattened) of the policy `params` in the config's env
    (`env`: a JaxEnv or gymnax-API object to use instead of the config's)."""
    return evaluate_policy(config, params, episodes, greedy, seed, env)[0]


def evaluate_policy(
    config: Config,
    params,
    episodes: int = 10,
    greedy: bool = True,
    seed: int | None = None,
    env=None,
    version: int | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """(returns, won): as evaluate_params, with each episode's win [episodes] bool (x seeds,
    flattened) where the env reports wins (SMAX), else None. Without a `seed`, the episodes
    are those the run's own evaluation of `version` played (where it is known)."""
    from tianjax.runtime.evaluation.play import eval_key

    key = (
        eval_key(config, version)
        if seed is None and version is not None
        else jax.random.key(config.seed + 1 if seed is None else seed)
    )
    seed = config.seed + 1 if seed is None else seed
    if config.env_backend in ("gymnax", "jaxmarl", "brax"):
        from tianjax.core.evaluation import make_evaluator
        from tianjax.envs.factory import make_jax_env
        from tianjax.envs.gymnax_env import make_gymnax

        env = (
            make_jax_env(config.env_backend, config.env, config.env_options)
            if env is None
            else make_gymnax(env)
        )
        algo = make_algorithm(
            config,
            env.obs_shape,
            env.action_spec,
            correct_staleness=False,
            obs_dtype=getattr(env, "obs_dtype", None),
        )
        params = _as_tree_of(jax.eval_shape(algo.init, jax.random.key(0)).params, params)
        wins = bool(getattr(env, "reports_wins", False))
        evaluate = make_evaluator(env, algo, episodes, greedy=greedy, wins=wins)
        if config.mode == "fused" and config.num_seeds > 1:  # one policy per seed, one at a time
            outs = [
                evaluate(jax.tree.map(lambda x, i=i: x[i], params), key)
                for i in range(config.num_seeds)
            ]
        else:
            outs = [evaluate(params, key)]
        if not wins:
            return np.asarray(outs, np.float64).reshape(-1), None
        rets, won = zip(*outs)
        return np.asarray(rets, np.float64).reshape(-1), np.asarray(won, bool).reshape(-1)
    from tianjax.envs.factory import env_spec

    obs_shape, obs_dtype, action_spec = env_spec(config)
    algo = make_algorithm(
        config, obs_shape, action_spec, correct_staleness=False, obs_dtype=obs_dtype
    )
    return _host_returns(config, algo, action_spec, params, episodes, greedy, seed, key), None


def _as_tree_of(template, restored):
    """Restored params (nested dicts, as read without a template) in the structure of the
    algorithm's own params: NamedTuples (QMIX, MADDPG) are rebuilt from their field names."""
    if isinstance(template, tuple) and hasattr(template, "_fields") and isinstance(restored, dict):
        return type(template)(
            *[_as_tree_of(getattr(template, f), restored[f]) for f in template._fields]
        )
    if isinstance(template, dict) and isinstance(restored, dict):
        return {
            k: _as_tree_of(template[k], restored[k]) if k in template else v
            for k, v in restored.items()
        }
    return restored


__all__ = [
    "EvalResult",
    "SavedRun",
    "evaluate_params",
    "evaluate_policy",
    "evaluate_run",
    "locate",
    "policy_seeds",
    "read_run",
]
