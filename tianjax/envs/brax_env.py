"""Brax environments behind tianjax's JAX env protocol (env_backend: brax).

Brax (Freeman et al. 2021, "Brax - A Differentiable Physics Engine for Large Scale Rigid
Body Simulation") steps rigid-body physics in JAX, so its envs run inside the fused loop
like gymnax's. The adapter takes the raw registered env (no brax wrappers) and adds the
time limit and the auto-reset itself, so that the rule is tianjax's, not brax's:

    reset(key) -> (obs, state)
    step(key, state, action) -> JaxStep(obs, state, reward, terminated, truncated, final_obs)

- terminated: the env's own `done` (e.g. the pole fell); the value target does not
  bootstrap;
- truncated: the episode reached `episode_length` steps without terminating; the value
  target bootstraps from `final_obs`;
- where either holds, `obs` and `state` are already those of a fresh episode, drawn with
  the step's key (brax's AutoResetWrapper instead replays one cached first state forever).

Actions are brax's: a Box in [-1, 1]^action_size. Brax is an optional extra
(`pip install -e .[brax]`) and is imported only when a brax env is built.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import warnings
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from tianjax.config import ConfigError
from tianjax.core.types import ActionSpec, JaxStep

DEFAULT_EPISODE_LENGTH = 1000  # brax.envs.create's default, and its training pipelines'


class BraxState(NamedTuple):
    env_state: Any  # brax.envs.State of the current episode
    step: jax.Array  # [] int32, steps taken in the current episode


def import_brax():
    """brax.envs, or one line naming env_backend when the optional extra is missing."""
    try:
        # NOTE: mujoco's mjx prints "Failed to import warp" to stdout when the optional
        # warp GPU kernels are absent; that is not an error for any brax pipeline.
        with contextlib.redirect_stdout(io.StringIO()):
            from brax import envs
    except ImportError as e:
        raise ConfigError(
            "config key 'env_backend': 'brax' needs the brax package, which is not "
            f"installed ({e}); install it with `pip install -e .[brax]`"
        ) from None
    return envs


def _resolve(envs, name: str) -> str:
    """The registered brax name for `name`; "module:EnvId" imports module first (which
    registers EnvId with brax.envs.register_environment)."""
    if ":" in name:
        module, name = name.split(":", 1)
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise ConfigError(f"config key 'env': cannot import module '{module}' ({e})") from None
    known = getattr(envs, "_envs", None)
    if known is not None and name not in known:
        raise ConfigError(
            f"config key 'env': '{name}' is not a brax environment (known: "
            f"{', '.join(sorted(known))}; add yours with "
            "brax.envs.register_environment)"
        )
    return name


class BraxEnv:
    """A brax env with tianjax's time limit and same-step auto-reset (stateless, jittable)."""

    reports_wins = False

    def __init__(self, env, name: str, episode_length: int = DEFAULT_EPISODE_LENGTH):
        if (
            isinstance(episode_length, bool)
            or not isinstance(episode_length, int)
            or episode_length < 1
        ):
            raise ConfigError(
                "config key 'env_options.episode_length': must be an int >= 1, got "
                f"{episode_length!r}"
            )
        self.env = env
        self.name = name
        self.episode_length = int(episode_length)
        self.obs_shape = (int(env.observation_size),)
        self.obs_dtype = np.dtype(np.float32)
        n = int(env.action_size)
        self.action_spec = ActionSpec(
            discrete=False, shape=(n,), low=-np.ones(n, np.float32), high=np.ones(n, np.float32)
        )

    def _start(self, key) -> tuple[jax.Array, BraxState]:
        s = self.env.reset(key)
        # NOTE: brax steps return a weakly typed python-float reward; fixing the dtypes here
        # keeps the scan carry (and the jit cache key) the same before and after a step.
        s = s.replace(
            obs=s.obs.astype(jnp.float32),
            reward=jnp.asarray(s.reward, jnp.float32),
            done=jnp.asarray(s.done, jnp.float32),
        )
        return s.obs, BraxState(s, jnp.zeros((), jnp.int32))

    def reset(self, key) -> tuple[jax.Array, BraxState]:
        return self._start(key)

    def step(self, key, state: BraxState, action) -> JaxStep:
        """One env (vmapped by the caller): action [action_size] in [-1, 1]."""
        s = self.env.step(state.env_state, jnp.asarray(action, jnp.float32))
        s = s.replace(
            obs=s.obs.astype(jnp.float32),
            reward=jnp.asarray(s.reward, jnp.float32),
            done=jnp.asarray(s.done, jnp.float32),
        )
        t = state.step + 1
        terminated = s.done > 0
        truncated = (t >= self.episode_length) & ~terminated
        ended = terminated | truncated
        first_obs, first = self._start(key)
        nxt = jax.tree.map(lambda a, b: jnp.where(ended, a, b), first, BraxState(s, t))
        obs = jnp.where(ended, first_obs, s.obs)
        return JaxStep(obs, nxt, s.reward, terminated, truncated, s.obs)


def make_brax(name: str, options: dict | None = None) -> BraxEnv:
    """A BraxEnv of the registered brax env `name` (or "module:EnvId").

    options (config key env_options): `episode_length` (default 1000) and `backend`
    ('generalized', 'positional', 'spring' or 'mjx'; default the env's own), and any other
    keyword argument of the env's constructor."""
    envs = import_brax()
    options = dict(options or {})
    episode_length = options.pop("episode_length", DEFAULT_EPISODE_LENGTH)
    registered = _resolve(envs, name)
    try:
        with warnings.catch_warnings():  # brax's notice that MJX is maintained and it is not
            warnings.filterwarnings("ignore", message="Brax System", category=UserWarning)
            env = envs.get_environment(registered, **options)
    except (TypeError, ValueError, KeyError, NotImplementedError) as e:
        raise ConfigError(
            f"config key 'env_options': brax env '{registered}' does not take "
            f"{options} ({type(e).__name__}: {e})"
        ) from None
    return BraxEnv(env, name, episode_length)


__all__ = ["DEFAULT_EPISODE_LENGTH", "BraxEnv", "BraxState", "import_brax", "make_brax"]
