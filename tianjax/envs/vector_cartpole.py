"""CartPole as one numpy vector env: B carts stepped by a few array operations per step,
not B Python envs (the simulator behind tianjax/LatencyCartPole-v1, tianjax.envs.latency).

The dynamics are gymnasium's CartPole-v1 (Barto, Sutton & Anderson 1983), in float64, one
Euler step of tau = 0.02 s per action:

    F          = +10 N if a = 1 else -10 N
    temp       = (F + m l θ̇² sin θ) / (m + M)
    θ̈          = (g sin θ - cos θ temp) / (l (4/3 - m cos² θ / (m + M)))
    ẍ          = temp - m l θ̈ cos θ / (m + M)
    x, ẋ, θ, θ̇ += tau (ẋ, ẍ, θ̇, θ̈)          (every right side at the old state)

with g = 9.8, M = 1 (cart), m = 0.1 (pole), l = 0.5 (half the pole). An episode terminates
when |x| > 2.4 or |θ| > 12° and is truncated after `max_episode_steps` steps (both can
hold at once); every step rewards 1 (`sutton_barto_reward`: 0, and -1 on the terminating
step). A cart starts at a state drawn uniformly from [-0.05, 0.05]^4.

Auto-reset is SAME_STEP, as tianjax's host envs expect: the step that ends an episode
returns the next episode's first observation, with the last one in info["final_obs"]
([B, 4], rows valid where info["_final_obs"]). Each cart draws its start states from its
own numpy Generator; a reset with seed s seeds cart i with s + i, as gymnasium's
SyncVectorEnv seeds its envs, so a seed starts the same carts as gymnasium's CartPole-v1.
"""

from __future__ import annotations

import math
from typing import Sequence

import gymnasium as gym
import numpy as np

from tianjax.config import ConfigError

GRAVITY = 9.8
MASS_CART = 1.0
MASS_POLE = 0.1
TOTAL_MASS = MASS_POLE + MASS_CART
HALF_LENGTH = 0.5
POLE_MOMENT = MASS_POLE * HALF_LENGTH  # m l
FORCE = 10.0
TAU = 0.02
X_LIMIT = 2.4
THETA_LIMIT = 12 * 2 * math.pi / 360  # 12 degrees, in radians
START_BOUND = 0.05


class CartPoleVectorEnv(gym.vector.VectorEnv):
    """`num_envs` CartPoles in arrays (gymnasium's vector API, SAME_STEP auto-reset)."""

    metadata = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP, "render_modes": []}

    def __init__(
        self, num_envs: int = 1, *, sutton_barto_reward: bool = False, max_episode_steps: int = 500
    ):
        if (
            isinstance(max_episode_steps, bool)
            or not isinstance(max_episode_steps, int)
            or max_episode_steps < 1
        ):
            raise ConfigError(
                "config key 'env_options.max_episode_steps': must be an int >= 1, "
                f"got {max_episode_steps!r}"
            )
        self.num_envs = int(num_envs)
        self.max_episode_steps = max_episode_steps
        self.sutton_barto_reward = bool(sutton_barto_reward)
        bound = np.array([2 * X_LIMIT, np.inf, 2 * THETA_LIMIT, np.inf], np.float32)
        self.single_observation_space = gym.spaces.Box(-bound, bound, dtype=np.float32)
        self.single_action_space = gym.spaces.Discrete(2)
        self.observation_space = gym.vector.utils.batch_space(
            self.single_observation_space, self.num_envs
        )
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)
        # rows x, ẋ, θ, θ̇: each quantity contiguous over the carts
        self._state = np.zeros((4, self.num_envs), np.float64)
        self._steps = np.zeros(self.num_envs, np.int64)  # steps into the current episode
        self._rngs = [np.random.default_rng() for _ in range(self.num_envs)]  # until a seeded reset

    def reset(self, *, seed: int | Sequence[int] | None = None, options: dict | None = None):
        """Every cart to a new start state. `seed`: an int s (cart i gets s + i), one per
        cart, or None (each cart's stream goes on). `options` may narrow the start box,
        {"low": ..., "high": ...}."""
        if seed is not None:
            seeds = (
                [seed + i for i in range(self.num_envs)] if isinstance(seed, int) else list(seed)
            )
            if len(seeds) != self.num_envs:
                raise ValueError(f"reset: {len(seeds)} seeds for {self.num_envs} envs")
            self._rngs = [np.random.default_rng(s) for s in seeds]
        options = dict(options or {})
        low, high = options.pop("low", -START_BOUND), options.pop("high", START_BOUND)
        if options or not low <= high:
            raise ValueError(f"reset: options take low <= high only, got {options or (low, high)}")
        for i in range(self.num_envs):
            self._start(i, low, high)
        return self._state.T.astype(np.float32, order="C"), {}

    def _start(self, i: int, low: float = -START_BOUND, high: float = START_BOUND) -> None:
        self._state[:, i] = self._rngs[i].uniform(low, high, 4)
        self._steps[i] = 0

    def step(self, actions):
        """One step of every cart: (obs [B, 4] float32, reward [B] float64, terminated [B],
        truncated [B], info), the carts that ended already restarted."""
        a = np.asarray(actions)
        if a.shape != (self.num_envs,) or not ((a == 0) | (a == 1)).all():
            raise ValueError(
                f"CartPole takes one action in {{0, 1}} per env ({self.num_envs}), got {actions!r}"
            )
        x, x_dot, theta, theta_dot = self._state
        force = np.where(a == 1, FORCE, -FORCE)
        cos, sin = np.cos(theta), np.sin(theta)
        # NOTE: each product is grouped as in gymnasium's CartPoleEnv, so that the float64
        # states agree to the bit, not only to rounding
        temp = (force + POLE_MOMENT * np.square(theta_dot) * sin) / TOTAL_MASS
        theta_acc = (GRAVITY * sin - cos * temp) / (
            HALF_LENGTH * (4.0 / 3.0 - MASS_POLE * np.square(cos) / TOTAL_MASS)
        )
        x_acc = temp - POLE_MOMENT * theta_acc * cos / TOTAL_MASS
        self._state = np.stack(
            (
                x + TAU * x_dot,
                x_dot + TAU * x_acc,
                theta + TAU * theta_dot,
                theta_dot + TAU * theta_acc,
            )
        )
        x, theta = self._state[0], self._state[2]
        terminated = (np.abs(x) > X_LIMIT) | (np.abs(theta) > THETA_LIMIT)
        self._steps += 1
        truncated = self._steps >= self.max_episode_steps
        if self.sutton_barto_reward:
            reward = np.where(terminated, -1.0, 0.0)
        else:
            reward = np.ones(self.num_envs)
        obs = self._state.T.astype(np.float32, order="C")
        done = terminated | truncated
        if not done.any():
            return obs, reward, terminated, truncated, {}
        final = obs.copy()
        for i in np.flatnonzero(done):
            self._start(i)
        obs[done] = self._state.T[done]
        return (
            obs,
            reward,
            terminated,
            truncated,
            {"final_obs": final, "_final_obs": done, "final_info": {}, "_final_info": done},
        )

    def close(self, **kwargs):
        self.closed = True


__all__ = ["CartPoleVectorEnv"]
