"""The env factory, and the host-env protocol: batches of envs stepped from Python
(envpool, gymnasium vector envs).

Every adapter follows one protocol, `HostEnv`, with the SAME semantics as the JAX envs
(tianjax.envs.gymnax_env):

    reset(seed) -> obs [B, ...]
    step(actions [B, ...]) -> HostStep(obs, reward, terminated, truncated, final_obs)

with same-step auto-reset: where an episode ended at this step (terminated or truncated),
`obs` is already the first observation of the next episode and `final_obs` is the
observation the episode ended on (truncation bootstraps from it; termination does not);
where it did not end, `final_obs` equals `obs`. `terminated` and `truncated` are reported
apart, exactly as the backend reports them (both may be set when an episode fails on its
last allowed step). Continuous actions are clipped to the action bounds before stepping.

Backends differ in how they reset:

- envpool (1.2.5, checked empirically) auto-resets on the NEXT step: the step after an
  episode end ignores its action and returns the reset observation with reward 0. The
  adapter instead resets the finished envs at once with envpool's partial reset,
  `env.reset(np.array(env_ids))`, which leaves the others untouched; the following step
  then acts normally in every env (elapsed steps restart at 1, dynamics continue from
  the reset observation), so no step is wasted and none is mislabelled. A lost life with
  Atari's `episodic_life` is the exception: a reset there would start a new game, so the
  adapter instead steps just those envs once, which runs envpool's end-of-life restart
  (action ignored, reward 0, the game and its step count go on). One difference
  remains: envpool computes terminated = done & ~truncated, so an episode that fails on
  its last allowed step is reported as truncated only (gymnax and gymnasium set both).
- gymnasium vector envs are built with `autoreset_mode=SAME_STEP`, whose semantics are
  already these; the final observations come from `info["final_obs"]`.

Learning and reporting may see different episodes. With envpool's Atari options
`reward_clip` and `episodic_life`, `reward` is clipped to -1, 0, +1 and a lost life ends
the episode for learning (`terminated`), while the game goes on. The step then also says
what a person would call the episode: `score` is the game's own (unclipped) reward, from
envpool's `info["reward"]`, and `game_over` marks the end of the whole game (all lives
lost, envpool's `info["terminated"]`, or a time limit). The returns tianjax reports sum
`score` from one game over to the next (`HostStep.report_reward`, `report_done`); envs
without those keys report what they learn from.

The factory builds every env a config names: `make_host_env(backend, env_id, num_envs,
seed)` either host backend, `make_jax_env(backend, name, options)` a gymnax, brax or
JaxMARL env, and `env_spec(config)` the configured env's spaces without stepping it. An
unknown env id is a one-line `ConfigError` naming the config key 'env'.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from tianjax.config import Config, ConfigError
from tianjax.envs.envpool_env import EnvpoolEnv
from tianjax.envs.gymnasium_env import GymnasiumVectorEnv
from tianjax.envs.gymnax_env import make_gymnax
from tianjax.envs.host_api import HostEnv, HostStep, other_backend_hint

BACKENDS = ("envpool", "gymnasium")


def make_host_env(
    backend: str, env_id: str, num_envs: int, seed: int = 0, **kwargs: Any
) -> HostEnv:
    """A HostEnv of `num_envs` envs of `env_id` from `backend` ("envpool" or "gymnasium")."""
    if backend == "envpool":
        return EnvpoolEnv(env_id, num_envs, seed, **kwargs)
    if backend == "gymnasium":
        return GymnasiumVectorEnv(env_id, num_envs, seed, **kwargs)
    raise ConfigError(
        f"config key 'env_backend': '{backend}' is not a host env backend "
        f"(known: {', '.join(BACKENDS)})"
    )


def make_jax_env(backend: str, name: str, options: dict | None = None):
    """The JAX env `name` of `backend` ('gymnax', 'brax' with its env_options, or 'jaxmarl',
    the multi-agent one)."""
    if backend == "brax":
        from tianjax.envs.brax_env import make_brax

        return make_brax(name, options)
    if backend == "jaxmarl":
        from tianjax.envs.marl import make_jaxmarl

        return make_jaxmarl(name)
    return make_gymnax(name)


def env_spec(config: Config):
    """(obs_shape, obs_dtype, action_spec) of the configured env, without stepping it."""
    if config.env_backend == "gymnax":
        env = make_gymnax(config.env)
        return env.obs_shape, jax.dtypes.canonicalize_dtype(env.obs_dtype), env.action_spec
    if config.env_backend in ("jaxmarl", "brax"):  # float32 obs (jaxmarl: an MAObs of shapes)
        env = make_jax_env(config.env_backend, config.env, config.env_options)
        return env.obs_shape, np.dtype(np.float32), env.action_spec
    env = make_host_env(config.env_backend, config.env, 1, config.seed, **config.env_options)
    try:
        return tuple(env.obs_shape), jax.dtypes.canonicalize_dtype(env.obs_dtype), env.action_spec
    finally:
        env.close()


__all__ = [
    "BACKENDS",
    "EnvpoolEnv",
    "GymnasiumVectorEnv",
    "HostEnv",
    "HostStep",
    "env_spec",
    "make_host_env",
    "make_jax_env",
    "other_backend_hint",
]
