"""The host-env protocol (`HostEnv`, `HostStep`) and the gymnasium-space conversions every
adapter shares (the action space: tianjax.envs.spaces); the semantics are in the
docstring of tianjax.envs.factory."""

from __future__ import annotations

import difflib
import inspect
import os
from typing import NamedTuple, Protocol, runtime_checkable

import numpy as np

from tianjax.config import ConfigError
from tianjax.core.types import ActionSpec

# the environment variable the launcher sets in each actor process to that actor's index, so
# that a host env can model per-actor behaviour (tianjax/envs/latency.py: slow actors)
ACTOR_INDEX_ENV = "TIANJAX_ACTOR_INDEX"


class HostStep(NamedTuple):
    obs: np.ndarray  # [B, ...] next observation (already reset where the episode ended)
    reward: np.ndarray  # [B] float32
    terminated: np.ndarray  # [B] bool, the episode reached a terminal state
    truncated: np.ndarray  # [B] bool, the episode was cut (time limit)
    final_obs: np.ndarray  # [B, ...] the observation the episode ended on (= obs elsewhere)
    score: np.ndarray | None = None  # [B] float32 the game's unclipped reward (None: = reward)
    game_over: np.ndarray | None = None  # [B] bool the whole game ended, all lives included
    # (None: = terminated | truncated)

    @property
    def report_reward(self) -> np.ndarray:
        """[B] what a reported episode return sums: the unclipped score where there is one."""
        return self.reward if self.score is None else self.score

    @property
    def report_done(self) -> np.ndarray:
        """[B] where a reported episode ends: at game over where the env tells it apart."""
        return (self.terminated | self.truncated) if self.game_over is None else self.game_over


@runtime_checkable
class HostEnv(Protocol):
    """A batch of `num_envs` host environments with same-step auto-reset."""

    num_envs: int
    obs_shape: tuple[int, ...]
    obs_dtype: np.dtype
    action_spec: ActionSpec
    name: str

    def reset(self, seed: int | None = None) -> np.ndarray:
        """Resets every env (reseeding when `seed` is given); returns obs [B, ...]."""
        ...

    def step(self, actions: np.ndarray) -> HostStep: ...

    def close(self) -> None: ...


# ----------------------------------------------------------------------------- spaces


def _obs_space(space, env_id: str) -> tuple[tuple[int, ...], np.dtype]:
    if type(space).__name__ != "Box":
        raise ConfigError(
            f"config key 'env': '{env_id}' has a {type(space).__name__} observation "
            "space; only Box (array) observations are supported"
        )
    return tuple(space.shape), np.dtype(space.dtype)


def _prepare_actions(actions, spec: ActionSpec, num_envs: int, dtype) -> np.ndarray:
    a = np.asarray(actions)
    if spec.discrete:
        a = a.reshape(num_envs).astype(dtype, copy=False)
    else:
        a = np.clip(a.reshape((num_envs,) + tuple(spec.shape)), spec.low, spec.high).astype(
            dtype, copy=False
        )
    return a


def _gymnax_ids():
    from tianjax.envs.gymnax_import import import_gymnax

    return import_gymnax().registered_envs


def _envpool_ids():
    import envpool

    return envpool.list_all_envs()


def _gymnasium_ids():
    import gymnasium as gym

    return gym.registry


def _brax_ids():
    from brax import envs as brax_envs

    return brax_envs._envs


# the backends an env id may belong to, in the order a hint names them
_BACKEND_IDS = (
    ("gymnax", _gymnax_ids),
    ("envpool", _envpool_ids),
    ("gymnasium", _gymnasium_ids),
    ("brax", _brax_ids),
)


def _knows(ids, env_id: str) -> bool:
    """Whether a backend's registry (imported on demand) holds `env_id`; False where the
    backend is not installed."""
    try:
        return env_id in ids()
    except (ImportError, AttributeError):
        return False


def other_backend_hint(env_id: str, backend: str) -> str:
    """', but it is a <other> env: set env_backend: <other> ...' where another backend
    knows `env_id`, else ''."""
    if ":" in env_id:
        return ""
    other = next(
        (name for name, ids in _BACKEND_IDS if name != backend and _knows(ids, env_id)), None
    )
    if other is None:
        return ""
    mode = (
        "mode: fused, or sync/async with actors"
        if other in ("gymnax", "brax")
        else "mode: sync or async"
    )
    article = "an" if other[0] in "aeiou" else "a"
    return f", but it is {article} {other} env: set env_backend: {other} ({mode})"


# ----------------------------------------------------------------------------- options


def accepted_options(fn) -> set[str] | None:
    """The keyword arguments an env's entry point (a class or a function) takes, or None
    where it cannot tell (it takes **kwargs, or has no signature)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind == p.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def check_options(env_id: str, given, accepted: set[str] | None) -> None:
    """A ConfigError naming the first option of `given` that the env does not take."""
    if accepted is None:
        return
    for key in sorted(given):
        if key not in accepted:
            close = difflib.get_close_matches(key, sorted(accepted), n=3)
            # of equally close names, the one that shares the longest start with it
            close.sort(key=lambda c: -len(os.path.commonprefix([c, key])))
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise ConfigError(
                f"config key 'env_options.{key}': '{env_id}' takes no option '{key}'{hint} "
                f"(it takes: {', '.join(sorted(accepted))})"
            )


__all__ = [
    "ACTOR_INDEX_ENV",
    "HostEnv",
    "HostStep",
    "accepted_options",
    "check_options",
    "other_backend_hint",
]
