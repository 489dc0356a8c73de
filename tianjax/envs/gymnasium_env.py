"""gymnasium vector envs as a `HostEnv` (SAME_STEP auto-reset; see tianjax.envs.factory)."""

from __future__ import annotations

from typing import Any

import numpy as np

from tianjax.config import ConfigError
from tianjax.envs.host_api import (
    HostStep,
    _obs_space,
    _prepare_actions,
    accepted_options,
    check_options,
    other_backend_hint,
)
from tianjax.envs.spaces import action_spec

# what gymnasium's make / make_vec take themselves, besides the env's own arguments
_MAKE_OPTIONS = ("max_episode_steps", "disable_env_checker")


def _entry_point(fn):
    """The callable behind a spec's entry point (None where it cannot be loaded: gymnasium
    then says why, when it builds the env)."""
    if isinstance(fn, str):
        from gymnasium.envs.registration import load_env_creator

        try:
            return load_env_creator(fn)
        except Exception:  # noqa: BLE001 (a user module may raise anything on import)
            return None
    return fn


def check_env_id(env_id: str) -> None:
    """ConfigError naming 'env' unless gymnasium knows `env_id` (a "module:EnvId" imports
    module, which registers EnvId); builds nothing."""
    import gymnasium as gym

    try:
        module, _, bare_id = env_id.rpartition(":")
        if module:  # gymnasium's own "module:EnvId": importing the module registers EnvId
            import importlib

            importlib.import_module(module)
        elif bare_id.startswith("tianjax/"):
            import tianjax.envs.latency  # noqa: F401 (registers the tianjax/ ids)
        gym.spec(bare_id)
    except Exception as e:  # noqa: BLE001 (a user module may raise anything on import)
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0].rstrip(". ")
        hint = other_backend_hint(env_id, "gymnasium")
        if hint:
            raise ConfigError(
                f"config key 'env': '{env_id}' is not a gymnasium env id{hint}"
            ) from None
        raise ConfigError(
            f"config key 'env': '{env_id}' is not a registered gymnasium env id "
            f'({reason}); list them with `python -c "import gymnasium; '
            'gymnasium.pprint_registry()"`, or register your own with '
            "gymnasium.register"
        ) from None


class GymnasiumVectorEnv:
    """A gymnasium vector env (`gymnasium.make_vec`, SAME_STEP auto-reset).

    Any registered id works, including one the user registered (or a "module:Env-v0" id
    that gymnasium imports), and tianjax's own "tianjax/..." ids (tianjax.envs.latency).
    Extra keyword arguments go to the env (e.g. `max_episode_steps`), checked against its
    entry point's signature where it has one, so that a misspelt option is one line naming
    it. `vectorization_mode` None: "sync" (one process), or the env's own vector entry
    point where it registered only that (it must auto-reset SAME_STEP). `render`: the envs
    render rgb_array frames (`frame()`: env 0's, for videos).
    """

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        seed: int = 0,
        vectorization_mode: str | None = None,
        render: bool = False,
        **kwargs: Any,
    ):
        import gymnasium as gym

        check_env_id(env_id)
        spec = gym.spec(env_id.rpartition(":")[2])
        self.name = env_id
        self.num_envs = int(num_envs)
        self._seed = int(seed)
        same_step = gym.vector.AutoresetMode.SAME_STEP
        # the env's own vectoriser where asked, or where it has nothing else (tianjax's latency
        # envs); gymnasium's own (CartPole's) auto-reset NEXT_STEP, so otherwise "sync"
        own = spec.vector_entry_point is not None and (
            vectorization_mode == "vector_entry_point"
            or (vectorization_mode is None and spec.entry_point is None)
        )
        fn = _entry_point(spec.vector_entry_point if own else spec.entry_point)
        accepted = accepted_options(fn)
        check_options(
            env_id,
            kwargs,
            None if accepted is None else accepted - {"num_envs"} | set(_MAKE_OPTIONS),
        )
        if render:
            kwargs = dict(kwargs, render_mode="rgb_array")
        if own:
            self._env = gym.make_vec(
                env_id, num_envs=self.num_envs, vectorization_mode="vector_entry_point", **kwargs
            )
            if self._env.metadata.get("autoreset_mode") != same_step:
                raise ConfigError(
                    f"config key 'env': '{env_id}''s vector entry point does not auto-reset "
                    "SAME_STEP; set env_options.vectorization_mode: sync"
                )
        else:
            self._env = gym.make_vec(
                env_id,
                num_envs=self.num_envs,
                vectorization_mode=vectorization_mode or "sync",
                vector_kwargs={"autoreset_mode": same_step},
                **kwargs,
            )
        self.obs_shape, self.obs_dtype = _obs_space(self._env.single_observation_space, env_id)
        space = self._env.single_action_space
        self.action_spec = action_spec(space, env_id)
        self._action_dtype = (
            space.dtype
            if space.dtype is not None
            else (np.int64 if self.action_spec.discrete else np.float32)
        )

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
                raise RuntimeError(
                    f"gymnasium env '{self.name}' ended an episode without "
                    "info['final_obs'] (needs autoreset_mode SAME_STEP)"
                )
            final_obs = obs.copy()
            for i in np.flatnonzero(mask):
                final_obs[i] = final[i]
        return HostStep(obs, np.asarray(reward, np.float32), terminated, truncated, final_obs)

    def frame(self) -> np.ndarray:
        """Env 0's frame [H, W, 3] uint8 (built with render=True)."""
        frames = self._env.render()
        return np.asarray(frames[0] if isinstance(frames, (list, tuple)) else frames)

    def close(self) -> None:
        self._env.close()


__all__ = ["GymnasiumVectorEnv", "check_env_id"]
