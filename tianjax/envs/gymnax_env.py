"""JAX environments: any gymnax env (by name) or any object that follows the gymnax API.

The adapter binds the static EnvParams and exposes one stateless protocol:

    reset(key) -> (obs, state)
    step(key, state, action) -> JaxStep(obs, state, reward, terminated, truncated, final_obs)

with auto-reset: `obs` is already the first observation of the next episode where the
episode ended, and `final_obs` is the observation the episode ended on (truncation
bootstraps from it; termination does not). Functions are written for one env and
vmapped by the caller.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from tianjax.config import ConfigError
from tianjax.core.types import JaxStep
from tianjax.envs.gymnax_import import import_gymnax
from tianjax.envs.spaces import action_spec


class JaxEnv:
    """A gymnax-API environment with its params bound (stateless, jittable)."""

    def __init__(self, env, params=None, name: str | None = None):
        self.env = env
        self.params = env.default_params if params is None else params
        self.name = name or getattr(env, "name", type(env).__name__)
        obs_space = env.observation_space(self.params)
        if getattr(obs_space, "shape", None) is None:
            raise ConfigError(
                f"config key 'env': '{self.name}' has a {type(obs_space).__name__} "
                "observation space; only array (Box) observations are supported"
            )
        self.obs_shape = tuple(obs_space.shape)
        self.obs_dtype = np.dtype(getattr(obs_space, "dtype", np.float32))
        self.action_spec = action_spec(env.action_space(self.params))

    def reset(self, key):
        return self.env.reset(key, self.params)

    def step(self, key, state, action) -> JaxStep:
        # the gymnax >= 1.0 API: terminated and truncated apart (truncation bootstraps)
        obs, state, reward, terminated, truncated, info = self.env.step(
            key, state, action, self.params
        )
        final_obs = info.get("final_observation", obs)
        return JaxStep(
            obs,
            state,
            reward.astype(jnp.float32),
            terminated.astype(bool),
            truncated.astype(bool),
            final_obs,
        )


def _is_gymnax_env(obj) -> bool:
    return all(
        hasattr(obj, a)
        for a in ("reset", "step", "default_params", "observation_space", "action_space")
    )


def from_reference(text: str, params=None) -> JaxEnv:
    """A JaxEnv from "module:Attr": Attr is a gymnax-API env instance, or a class or
    function that returns one (or (env, params)) when called without arguments."""
    from tianjax.config.references import resolve_reference

    obj = resolve_reference(text, "env")
    if isinstance(obj, type) or (not _is_gymnax_env(obj) and callable(obj)):
        obj = obj()
    env_params = None
    if isinstance(obj, tuple) and len(obj) == 2:
        obj, env_params = obj
    if not _is_gymnax_env(obj):
        raise ConfigError(
            f"config key 'env': {text!r} is not a gymnax-API env (needs reset, step, "
            "default_params, observation_space and action_space)"
        )
    return JaxEnv(obj, params if params is not None else env_params, name=text)


def make_gymnax(name_or_env, params=None) -> JaxEnv:
    """A JaxEnv from a gymnax registry name, from "module:Attr" naming your own env, or
    from an env object following the gymnax API."""
    if isinstance(name_or_env, JaxEnv):
        return name_or_env
    if not isinstance(name_or_env, str):
        return JaxEnv(name_or_env, params)
    if ":" in name_or_env:
        return from_reference(name_or_env, params)
    gymnax = import_gymnax()

    if name_or_env not in gymnax.registered_envs:
        from tianjax.envs.host_api import other_backend_hint

        hint = other_backend_hint(name_or_env, "gymnax")
        raise ConfigError(
            f"config key 'env': '{name_or_env}' is not a gymnax environment"
            + (hint or f" (known: {', '.join(sorted(gymnax.registered_envs))})")
        )
    env, default_params = gymnax.make(name_or_env)
    return JaxEnv(env, default_params if params is None else params, name=name_or_env)


__all__ = ["JaxEnv", "from_reference", "make_gymnax"]
