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

import importlib
import importlib.util
import sys
import types

import jax.numpy as jnp
import numpy as np

from tianjax.config import ConfigError
from tianjax.core.types import JaxStep
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


class _Deferred(types.ModuleType):
    """Stands in sys.modules for a module not loaded yet, and loads it at the first read of
    an attribute it lacks: it then puts the real module in sys.modules and takes on its
    namespace, so that whoever imported the stand-in reads the real names through it.
    (importlib.util.LazyLoader does not do here: on Python 3.11 an `import` statement
    reads the module's __spec__, which loads it.)"""

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        name = self.__name__
        if sys.modules.get(name) is self:
            del sys.modules[name]
        real = importlib.import_module(name)
        self.__dict__.update(real.__dict__)
        return getattr(real, attr)


def import_gymnax():
    """gymnax, without loading seaborn until something reads from it. gymnax's Pong module
    imports seaborn at its top for a palette its renderer draws with, and seaborn brings
    scipy.stats and pandas: about 1 s of every process that makes a gymnax env (1.6 s for
    `import seaborn` against 2.5 s for `import gymnax`, 2 cores). Where seaborn is not
    loaded yet, a stand-in takes its place in sys.modules until then (`_Deferred`)."""
    if "gymnax" not in sys.modules and "seaborn" not in sys.modules:
        spec = importlib.util.find_spec("seaborn")
        if spec is not None:
            stand_in = _Deferred("seaborn")
            stand_in.__spec__ = spec
            stand_in.__path__ = spec.submodule_search_locations  # its submodules import
            sys.modules["seaborn"] = stand_in
    import gymnax

    return gymnax


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


__all__ = ["JaxEnv", "from_reference", "import_gymnax", "make_gymnax"]
