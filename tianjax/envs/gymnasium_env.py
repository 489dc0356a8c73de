"""gymnasium vector envs as a `HostEnv` (SAME_STEP auto-reset; see tianjax.envs.factory)."""

from __future__ import annotations

from typing import Any

import numpy as np

from tianjax.config import ConfigError
from tianjax.envs.host_api import HostStep, _obs_space, _prepare_actions, other_backend_hint
from tianjax.envs.spaces import action_spec


def check_env_id(env_id: str) -> None:
    """ConfigError naming 'env' unless gymnasium knows `env_id` (a "module:EnvId" imports
    module, which registers EnvId); builds nothing."""
    import gymnasium as gym

    try:
        module, _, bare_id = env_id.rpartition(":")
        if module:  # gymnasium's own "module:EnvId": importing the module registers EnvId
            import importlib

            importlib.import_module(module)
        gym.spec(bare_id)
    except Exception as e:  # noqa: BLE001 (a user module may raise anything on import)
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0].rstrip(". ")
        hint = other_backend_hint(env_id, "gymnasium")
        if hint:
            raise ConfigError(f"config key 'env': '{env_id}' is not a gymnasium env id{hint}") from None
        raise ConfigError(f"config key 'env': '{env_id}' is not a registered gymnasium env id "
                          f"({reason}); list them with `python -c \"import gymnasium; "
                          "gymnasium.pprint_registry()\"`, or register your own with "
                          "gymnasium.register") from None


class GymnasiumVectorEnv:
    """A gymnasium vector env (`gymnasium.make_vec`, SAME_STEP auto-reset).

    Any registered id works, including one the user registered (or a "module:Env-v0" id
    that gymnasium imports). Extra keyword arguments go to the env (e.g.
    `max_episode_steps`); `vectorization_mode` is "sync" (one process) by default.
    """

    def __init__(self, env_id: str, num_envs: int, seed: int = 0, vectorization_mode: str = "sync",
                 **kwargs: Any):
        import gymnasium as gym

        check_env_id(env_id)
        self.name = env_id
        self.num_envs = int(num_envs)
        self._seed = int(seed)
        self._env = gym.make_vec(env_id, num_envs=self.num_envs, vectorization_mode=vectorization_mode,
                                 vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
                                 **kwargs)
        self.obs_shape, self.obs_dtype = _obs_space(self._env.single_observation_space, env_id)
        space = self._env.single_action_space
        self.action_spec = action_spec(space, env_id)
        self._action_dtype = space.dtype if space.dtype is not None else (
            np.int64 if self.action_spec.discrete else np.float32)

    def reset(self, seed: int | None = None) -> np.ndarray:
        if seed is not None:
            self._seed = int(seed)
        obs, _ = self._env.reset(seed=self._seed if seed is not None else None)
        return np.asarray(obs, self.obs_dtype)

    def step(self, actions) -> HostStep:
        a = _prepare_actions(actions, self.action_spec, self.num_envs, self._action_dtype)
        obs, reward, terminated, truncated, info = self._env.step(a)
        obs = np.asarray(obs, self.obs_dtype)
        terminated = np.asarray(terminated, bool)
        truncated = np.asarray(truncated, bool)
        final_obs = obs
        done = terminated | truncated
        if done.any():
            mask = np.asarray(info.get("_final_obs", done), bool)
            final = info.get("final_obs")
            if final is None:
                raise RuntimeError(f"gymnasium env '{self.name}' ended an episode without "
                                   "info['final_obs'] (needs autoreset_mode SAME_STEP)")
            final_obs = obs.copy()
            for i in np.flatnonzero(mask):
                final_obs[i] = final[i]
        return HostStep(obs, np.asarray(reward, np.float32), terminated, truncated, final_obs)

    def close(self) -> None:
        self._env.close()
