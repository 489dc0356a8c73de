"""envpool as a `HostEnv`: same-step auto-reset by partial reset, and Atari's per-life ends
stepped through envpool's own restart (see tianjax.envs.factory)."""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

import numpy as np

from tianjax.config import ConfigError
from tianjax.envs.host_api import (
    HostStep,
    _obs_space,
    _prepare_actions,
    check_options,
    other_backend_hint,
)
from tianjax.envs.spaces import action_spec


@contextlib.contextmanager
def _quiet_spaces():
    """Silences gymnasium's warning about envpool's float64 Box bounds cast to float32."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*precision lowered.*")
        yield


def check_env_id(env_id: str) -> None:
    """ConfigError naming 'env' unless envpool knows `env_id` (builds nothing)."""
    import envpool

    if env_id not in envpool.list_all_envs():
        raise ConfigError(
            f"config key 'env': '{env_id}' is not an envpool task id"
            + (
                other_backend_hint(env_id, "envpool")
                or ' (list them with `python -c "import envpool; print(envpool.list_all_envs())"`)'
            )
        )


class EnvpoolEnv:
    """An envpool batch (gymnasium API, sync mode) with same-step auto-reset.

    Extra keyword arguments go to `envpool.make` (e.g. `max_episode_steps`, `num_threads`,
    Atari options). `render`: the pool renders (`frame()`: env 0's screen, for videos).
    """

    def __init__(
        self, env_id: str, num_envs: int, seed: int = 0, render: bool = False, **kwargs: Any
    ):
        import envpool

        check_env_id(env_id)
        # tianjax sets the batch and the seeds itself; every other key of the task's config
        # is an option (a misspelt one: one line naming it)
        ours = {"num_envs", "batch_size", "seed"}
        check_options(env_id, kwargs, set(envpool.make_spec(env_id)._config_keys) - ours)
        self.name = env_id
        self.num_envs = int(num_envs)
        self._kwargs = dict(kwargs, **({"render_mode": "rgb_array"} if render else {}))
        self._seed = int(seed)
        try:
            self._env = self._make(self._seed)
        except Exception as e:  # noqa: BLE001 (envpool checks options with asserts and KeyErrors)
            if not kwargs:
                raise
            line = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise ConfigError(
                f"config key 'env_options': envpool refused {sorted(kwargs)} for "
                f"'{env_id}' ({type(e).__name__}: {line})"
            ) from None
        with _quiet_spaces():
            obs_space, act_space = self._env.observation_space, self._env.action_space
        self.obs_shape, self.obs_dtype = _obs_space(obs_space, env_id)
        self.action_spec = action_spec(act_space, env_id)
        self._action_dtype = np.int32 if self.action_spec.discrete else act_space.dtype
        self._ids = np.arange(self.num_envs, dtype=np.int32)

    def _make(self, seed: int):
        import envpool

        with _quiet_spaces():
            return envpool.make(
                self.name, env_type="gymnasium", num_envs=self.num_envs, seed=seed, **self._kwargs
            )

    def _ordered(self, info, *arrays):
        """Reorders per-env arrays by env id (a no-op in sync mode, where they come sorted)."""
        ids = np.asarray(info["env_id"])
        if np.array_equal(ids, self._ids):
            return arrays
        order = np.argsort(ids)
        return tuple(np.asarray(a)[order] for a in arrays)

    def reset(self, seed: int | None = None) -> np.ndarray:
        if seed is not None and int(seed) != self._seed:
            # envpool seeds at construction only: a new seed means a new pool.
            self._env.close()
            self._seed = int(seed)
            self._env = self._make(self._seed)
        obs, info = self._env.reset()
        (obs,) = self._ordered(info, obs)
        return obs

    def step(self, actions) -> HostStep:
        a = _prepare_actions(actions, self.action_spec, self.num_envs, self._action_dtype)
        obs, reward, terminated, truncated, info = self._env.step(a, self._ids)
        # Atari's info: the unclipped reward and the real game over (episodic_life aside)
        score, game_end = info.get("reward"), info.get("terminated")
        score = reward if score is None else score
        game_end = terminated if game_end is None else game_end
        obs, reward, terminated, truncated, score, game_end = self._ordered(
            info, obs, reward, terminated, truncated, score, game_end
        )
        terminated = np.asarray(terminated, bool)
        truncated = np.asarray(truncated, bool)
        final_obs = obs
        done = terminated | truncated
        game_over = (terminated & np.asarray(game_end, bool)) | truncated
        if done.any():
            # Start the next episode now (envpool would only do it on the next step,
            # swallowing that step's action): obs becomes the next episode's first obs.
            obs = np.array(obs, copy=True)
            over = np.flatnonzero(game_over).astype(np.int32)
            if len(over):  # a new game: envpool's partial reset
                reset_obs, reset_info = self._env.reset(over)
                obs[np.asarray(reset_info["env_id"])] = reset_obs
            lost = np.flatnonzero(done & ~game_over).astype(np.int32)
            if len(lost):
                # NOTE: a lost life (episodic_life) must not reset: envpool's reset starts a
                # new game. Stepping only those envs runs envpool's own end-of-life restart
                # (the action is ignored, the reward is 0, lives and the step count go on).
                noop = np.zeros((len(lost),) + tuple(self.action_spec.shape), self._action_dtype)
                life_obs, *_, life_info = self._env.step(noop, lost)
                obs[np.asarray(life_info["env_id"])] = life_obs
        return HostStep(
            obs,
            np.asarray(reward, np.float32),
            terminated,
            truncated,
            final_obs,
            np.asarray(score, np.float32),
            game_over,
        )

    def frame(self) -> np.ndarray:
        """Env 0's screen [H, W, 3] uint8 (built with render=True)."""
        return np.asarray(self._env.render(np.zeros(1, np.int32)))[0]

    def close(self) -> None:
        self._env.close()


__all__ = ["EnvpoolEnv", "check_env_id"]
