"""Host environments: batches of envs stepped from Python (envpool, gymnasium vector envs).

Every adapter follows one protocol, `HostEnv`, with the SAME semantics as the JAX envs
(tianjax.envs.jax_env):

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

`make_host_env(backend, env_id, num_envs, seed)` builds either and turns an unknown env id
into a one-line `ConfigError` naming the config key 'env'.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

from tianjax.config import ConfigError
from tianjax.networks import ActionSpec


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

    def step(self, actions: np.ndarray) -> HostStep:
        ...

    def close(self) -> None:
        ...


# ----------------------------------------------------------------------------- spaces


def action_spec_from_space(space, env_id: str) -> ActionSpec:
    """An ActionSpec from a gymnasium-style single-env action space."""
    kind = type(space).__name__
    if kind == "Discrete":
        if int(getattr(space, "start", 0)) != 0:
            raise ConfigError(f"config key 'env': '{env_id}' has a Discrete action space starting "
                              f"at {space.start}; only actions 0..n-1 are supported")
        return ActionSpec(discrete=True, num_actions=int(space.n))
    if kind == "Box":
        return ActionSpec(discrete=False, shape=tuple(space.shape),
                          low=np.asarray(space.low, np.float32), high=np.asarray(space.high, np.float32))
    raise ConfigError(f"config key 'env': '{env_id}' has a {kind} action space; "
                      "only Discrete and Box are supported")


def _obs_space(space, env_id: str) -> tuple[tuple[int, ...], np.dtype]:
    if type(space).__name__ != "Box":
        raise ConfigError(f"config key 'env': '{env_id}' has a {type(space).__name__} observation "
                          "space; only Box (array) observations are supported")
    return tuple(space.shape), np.dtype(space.dtype)


def _prepare_actions(actions, spec: ActionSpec, num_envs: int, dtype) -> np.ndarray:
    a = np.asarray(actions)
    if spec.discrete:
        a = a.reshape(num_envs).astype(dtype, copy=False)
    else:
        a = np.clip(a.reshape((num_envs,) + tuple(spec.shape)), spec.low, spec.high).astype(dtype, copy=False)
    return a


# ----------------------------------------------------------------------------- envpool


@contextlib.contextmanager
def _quiet_spaces():
    """Silences gymnasium's warning about envpool's float64 Box bounds cast to float32."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*precision lowered.*")
        yield


class EnvpoolEnv:
    """An envpool batch (gymnasium API, sync mode) with same-step auto-reset.

    Extra keyword arguments go to `envpool.make` (e.g. `max_episode_steps`, `num_threads`,
    Atari options).
    """

    def __init__(self, env_id: str, num_envs: int, seed: int = 0, **kwargs: Any):
        import envpool

        if env_id not in envpool.list_all_envs():
            raise ConfigError(f"config key 'env': '{env_id}' is not an envpool task id"
                              + (other_backend_hint(env_id, "envpool") or " (list them with `python -c "
                                 "\"import envpool; print(envpool.list_all_envs())\"`)"))
        self.name = env_id
        self.num_envs = int(num_envs)
        self._kwargs = dict(kwargs)
        self._seed = int(seed)
        try:
            self._env = self._make(self._seed)
        except Exception as e:  # noqa: BLE001 (envpool checks options with asserts and KeyErrors)
            if not kwargs:
                raise
            line = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise ConfigError(f"config key 'env_options': envpool refused {sorted(kwargs)} for "
                              f"'{env_id}' ({type(e).__name__}: {line})") from None
        with _quiet_spaces():
            obs_space, act_space = self._env.observation_space, self._env.action_space
        self.obs_shape, self.obs_dtype = _obs_space(obs_space, env_id)
        self.action_spec = action_spec_from_space(act_space, env_id)
        self._action_dtype = np.int32 if self.action_spec.discrete else act_space.dtype
        self._ids = np.arange(self.num_envs, dtype=np.int32)

    def _make(self, seed: int):
        import envpool

        with _quiet_spaces():
            return envpool.make(self.name, env_type="gymnasium", num_envs=self.num_envs, seed=seed,
                                **self._kwargs)

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
            info, obs, reward, terminated, truncated, score, game_end)
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
        return HostStep(obs, np.asarray(reward, np.float32), terminated, truncated, final_obs,
                        np.asarray(score, np.float32), game_over)

    def close(self) -> None:
        self._env.close()


# ----------------------------------------------------------------------------- gymnasium


class GymnasiumVectorEnv:
    """A gymnasium vector env (`gymnasium.make_vec`, SAME_STEP auto-reset).

    Any registered id works, including one the user registered (or a "module:Env-v0" id
    that gymnasium imports). Extra keyword arguments go to the env (e.g.
    `max_episode_steps`); `vectorization_mode` is "sync" (one process) by default.
    """

    def __init__(self, env_id: str, num_envs: int, seed: int = 0, vectorization_mode: str = "sync",
                 **kwargs: Any):
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
        self.name = env_id
        self.num_envs = int(num_envs)
        self._seed = int(seed)
        self._env = gym.make_vec(env_id, num_envs=self.num_envs, vectorization_mode=vectorization_mode,
                                 vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
                                 **kwargs)
        self.obs_shape, self.obs_dtype = _obs_space(self._env.single_observation_space, env_id)
        space = self._env.single_action_space
        self.action_spec = action_spec_from_space(space, env_id)
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


# ----------------------------------------------------------------------------- factory


def other_backend_hint(env_id: str, backend: str) -> str:
    """', but it is a <other> env: set env_backend: <other> ...' where another backend
    knows `env_id`, else ''."""
    if ":" in env_id:
        return ""
    found = []
    if backend != "gymnax":
        try:
            import gymnax

            if env_id in gymnax.registered_envs:
                found.append("gymnax")
        except ImportError:
            pass
    if backend != "envpool":
        try:
            import envpool

            if env_id in envpool.list_all_envs():
                found.append("envpool")
        except ImportError:
            pass
    if backend != "gymnasium":
        try:
            import gymnasium as gym

            if env_id in gym.registry:
                found.append("gymnasium")
        except ImportError:
            pass
    if not found:
        return ""
    other = found[0]
    mode = "mode: fused, or sync/async with actors" if other == "gymnax" else "mode: sync or async"
    article = "an" if other[0] in "aeiou" else "a"
    return f", but it is {article} {other} env: set env_backend: {other} ({mode})"

BACKENDS = ("envpool", "gymnasium")


def make_host_env(backend: str, env_id: str, num_envs: int, seed: int = 0, **kwargs: Any) -> HostEnv:
    """A HostEnv of `num_envs` envs of `env_id` from `backend` ("envpool" or "gymnasium")."""
    if backend == "envpool":
        return EnvpoolEnv(env_id, num_envs, seed, **kwargs)
    if backend == "gymnasium":
        return GymnasiumVectorEnv(env_id, num_envs, seed, **kwargs)
    raise ConfigError(f"config key 'env_backend': '{backend}' is not a host env backend "
                      f"(known: {', '.join(BACKENDS)})")


__all__ = ["BACKENDS", "EnvpoolEnv", "GymnasiumVectorEnv", "HostEnv", "HostStep",
           "action_spec_from_space", "make_host_env", "other_backend_hint"]
