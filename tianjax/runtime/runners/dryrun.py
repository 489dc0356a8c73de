"""`tianjax train CONFIG --dry-run`: everything a run checks and builds before it trains,
without training or writing anything.

It runs the preflight checks (extras, env id, loggers), builds the env (a host env's
batch too) and the algorithm with its network, and says what the run would do: the
observation and action spaces, the parameter count (from shapes: nothing is compiled),
the batch sizes and how many updates and metrics records the budget gives.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import numpy as np

from tianjax.config import Config


class DryRun(NamedTuple):
    obs: str
    actions: str
    parameters: int
    lines: list[str]  # what `tianjax train --dry-run` prints

    def text(self) -> str:
        return "\n".join(self.lines)


def _spec_text(spec) -> str:
    if spec.discrete:
        return f"discrete, {spec.num_actions} actions"
    low, high = np.min(spec.low), np.max(spec.high)
    return f"continuous, shape {tuple(spec.shape)}, bounds [{low:g}, {high:g}]"


def _obs_text(shape, dtype) -> str:
    if hasattr(shape, "_asdict"):  # multi-agent: observation, global state, action mask
        return ", ".join(f"{k} {tuple(v)}" for k, v in shape._asdict().items())
    return f"shape {tuple(shape)}" + (f", {np.dtype(dtype).name}" if dtype is not None else "")


def _build_env(config: Config):
    """(obs_shape, obs_dtype, action_spec, what) of the config's env, built and closed."""
    if config.env_backend in ("envpool", "gymnasium"):
        from tianjax.envs.factory import make_host_env

        env = make_host_env(
            config.env_backend, config.env, config.num_envs, config.seed, **config.env_options
        )
        try:
            return (
                env.obs_shape,
                env.obs_dtype,
                env.action_spec,
                f"{config.num_envs} envs per actor",
            )
        finally:
            env.close()
    from tianjax.envs.factory import make_jax_env

    env = make_jax_env(config.env_backend, config.env, config.env_options)
    agents = getattr(env, "num_agents", None)
    what = f"{agents} agents" if agents else "single agent"
    return env.obs_shape, getattr(env, "obs_dtype", None), env.action_spec, what


def dry_run(config: Config) -> DryRun:
    from tianjax.algos import make_algorithm
    from tianjax.runtime.runners import preflight

    preflight.check(config)
    obs_shape, obs_dtype, spec, what = _build_env(config)
    algo = make_algorithm(config, obs_shape, spec, obs_dtype=obs_dtype)
    shapes = jax.eval_shape(algo.init, jax.random.key(config.seed))
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes.params))
    obs, act = _obs_text(obs_shape, obs_dtype), _spec_text(spec)
    T, B, n = config.rollout_len, config.num_envs, config.batch_trajectories
    lines = [
        f"dry run: {config.algo} on {config.env} ({config.env_backend}, {what}), mode {config.mode}"
        + (
            f", {config.num_actors} actor processes"
            if config.mode != "fused" and config.num_actors
            else ""
        ),
        f"  observations  {obs}",
        f"  actions       {act}",
        f"  parameters    {n_params:,} ({algo.name}, network torso {_torso(config, obs_shape, obs_dtype)})",
        f"  rollout       [T={T}, B={B}] = {T * B:,} env steps"
        + (" per actor" if config.mode != "fused" and config.num_actors else ""),
    ]
    spec = config.spec
    if not algo.buffer.replayed:
        batch = config.steps_per_update
        lines.append(
            f"  batch         {n} trajector{'y' if n == 1 else 'ies'} x {T * B:,} = {batch:,} samples "
            "per update"
        )
    else:
        rc = config.replay_config
        lines.append(
            f"  replay        {rc.buffer_size:,} {algo.buffer.items}, batches of {rc.batch_size}, learning "
            f"from {rc.learning_starts:,}, replay ratio {config.replay_ratio:g}"
        )
    describe = spec.resolve("describe")
    if describe is not None:
        lines += describe(config)
    if spec.target_networks:
        lines.append(f"  targets       target copies of {', '.join(spec.target_networks)}")
    lines.append(
        f"  budget        {config.total_env_steps:,} env steps: about {config.planned_updates:,} "
        f"{'iterations' if config.in_process else 'updates'}, "
        f"a metrics record every {config.log_interval} "
        f"(about {max(1, config.planned_updates // config.log_interval)} records)"
    )
    lines.append(
        "  checks        config, extras, env id, network and loggers: ok (nothing written)"
    )
    return DryRun(obs, act, n_params, lines)


def _torso(config: Config, obs_shape, obs_dtype) -> str:
    from tianjax.networks import resolve_network

    if config.network.module:
        return config.network.module
    from tianjax.networks.torsos import resolve_torso

    per_agent = getattr(obs_shape, "obs", None)
    if per_agent is not None:  # multi-agent (MAObs of shapes [N, D]): each agent's network sees [D]
        try:
            return resolve_torso(config.network.torso, tuple(per_agent)[1:])
        except Exception:  # noqa: BLE001 (the algorithm's own checks name what is wrong)
            return config.network.torso
    try:
        return resolve_network(config.network, obs_shape, obs_dtype).torso
    except Exception:  # noqa: BLE001
        return config.network.torso


__all__ = ["DryRun", "dry_run"]
