"""Latency-bound envs: real dynamics behind a simulator whose steps take time, not CPU.

For capacity planning: "what would 32 robots, or game servers, at 20 ms a step do?". Each
actor's batch of B envs is served by one simulator, and every vector step of it waits

    d = f_a * ( step_ms * exp(sigma * z - sigma^2 / 2) + [u < hiccup_p] * hiccup_ms )
    z ~ N(0, 1), u ~ U(0, 1), f_a = slow_factor if actor a is in slow_actors else 1

milliseconds, asleep (the lognormal has mean 1, so step_ms is the mean delay, and sigma = 0
makes it fixed; the hiccups are rare long pauses, a garbage collection or a network stall).
The mean time of a vector step is f_a * (step_ms + hiccup_p * hiccup_ms), plus the dynamics'
own few microseconds per env. Sleeping models a simulator that is slow without loading this
machine, so 32 actor processes are real and cost little CPU: what is measured is waiting,
the dependency that async relaxes.

    env: tianjax/LatencyCartPole-v1          # gymnasium's CartPole-v1 dynamics (500 steps), in numpy
    env_backend: gymnasium
    env_options: {step_ms: 16, sigma: 1.0, hiccup_p: 0.01, hiccup_ms: 300, slow_actors: [0], slow_factor: 4}

`tianjax/LatencyCartPole-v1` steps its B envs' dynamics as numpy arrays
(tianjax.envs.vector_cartpole), so that the simulator's own CPU stays small beside the
policy's in each of many actor processes; with `render_mode` set it is gymnasium's own
CartPoleEnv, one env at a time.

`tianjax/LatencyLunarLander-v2` has envpool's LunarLander-v2 dynamics (the task of
configs/ppo_lunarlander_async.yaml, 1,000 steps), stepped through tianjax's envpool
adapter. Naming either id imports this module (tianjax/envs/gymnasium_env.py); so does
`import tianjax.envs.latency`, for `gymnasium.make_vec` outside tianjax.

Each actor draws its delays from its own stream, seeded by the seed its envs are reset
with (tianjax seeds every actor differently), and knows which actor it is from
`ACTOR_INDEX_ENV`, which the launcher sets in each actor process (elsewhere, e.g. the
learner's evaluation envs, it counts as no actor: never slow). The first seeded reset of an
actor's simulator prints one line to stderr, which lands in its log
(run_dir/actors/actor-<a>.log), so an experiment can check the factor each actor stepped at.
"""

from __future__ import annotations

import inspect
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from tianjax.config import ConfigError
from tianjax.envs.host_api import ACTOR_INDEX_ENV
from tianjax.envs.vector_cartpole import CartPoleVectorEnv

CARTPOLE_ID = "tianjax/LatencyCartPole-v1"
LUNARLANDER_ID = "tianjax/LatencyLunarLander-v2"
ANNOUNCE = "latency: actor {actor} steps at {factor:g}x (mean {mean_ms:.3f} ms per vector step of {num_envs} envs)"
_MAX_CREDIT_S = (
    4e-3  # oversleep credited to the next steps, at most (a late wake-up on a busy machine)
)


@dataclass(frozen=True)
class Latency:
    """The delay model of one simulator (the `env_options` of a latency env)."""

    step_ms: float = 16.0  # mean delay of a vector step, milliseconds
    sigma: float = 0.0  # lognormal spread of the delay (0: fixed)
    hiccup_p: float = 0.0  # probability that a vector step also pauses hiccup_ms
    hiccup_ms: float = 0.0
    slow_actors: tuple[int, ...] = ()  # actors whose every delay is slow_factor times longer
    slow_factor: float = 1.0

    def __post_init__(self):
        def check(ok, key, what):
            if not ok:
                raise ConfigError(
                    f"config key 'env_options.{key}': {what}, got {getattr(self, key)!r}"
                )

        for key in ("step_ms", "sigma", "hiccup_ms"):
            check(
                isinstance(getattr(self, key), (int, float)) and getattr(self, key) >= 0,
                key,
                "must be >= 0",
            )
        check(
            isinstance(self.hiccup_p, (int, float)) and 0 <= self.hiccup_p <= 1,
            "hiccup_p",
            "must be in [0, 1]",
        )
        check(
            isinstance(self.slow_factor, (int, float)) and self.slow_factor >= 1,
            "slow_factor",
            "must be >= 1",
        )
        check(
            all(isinstance(a, int) and a >= 0 for a in self.slow_actors),
            "slow_actors",
            "must be a list of actor indices (ints >= 0)",
        )

    def factor(self, actor: int) -> float:
        return float(self.slow_factor) if actor in self.slow_actors else 1.0

    def mean_ms(self, actor: int) -> float:
        return self.factor(actor) * (self.step_ms + self.hiccup_p * self.hiccup_ms)


def draw_delay_s(rng: np.random.Generator, latency: Latency, factor: float) -> float:
    """One vector step's delay in seconds (the formula in the module docstring)."""
    base = latency.step_ms
    if latency.sigma > 0:
        s = latency.sigma
        base *= math.exp(s * rng.standard_normal() - 0.5 * s * s)
    hiccup = latency.hiccup_ms if latency.hiccup_p > 0 and rng.random() < latency.hiccup_p else 0.0
    return factor * (base + hiccup) / 1e3


class Sleeper:
    """Sleeps what it is asked, crediting an oversleep (time.sleep wakes ~0.1 ms late, later
    on a busy machine) to the next requests, at most `max_credit_s`; counts what it slept."""

    def __init__(
        self, clock=time.perf_counter, sleep=time.sleep, max_credit_s: float = _MAX_CREDIT_S
    ):
        self._clock, self._sleep, self.max_credit_s = clock, sleep, float(max_credit_s)
        self.owed = 0.0
        self.slept = 0.0

    def pay(self, seconds: float) -> None:
        self.owed += seconds
        if self.owed > 0:
            t = self._clock()
            self._sleep(self.owed)
            took = self._clock() - t
            self.slept += took
            self.owed = max(self.owed - took, -self.max_credit_s)


def actor_index() -> int:
    """The actor this process serves (the launcher's ACTOR_INDEX_ENV), -1 for none."""
    try:
        return int(os.environ.get(ACTOR_INDEX_ENV, "-1"))
    except ValueError:
        return -1


class LatencyVectorEnv(gym.vector.VectorWrapper):
    """A gymnasium vector env whose every step waits one drawn delay (one simulator serving
    all its envs). `actor` None: the process's (actor_index())."""

    def __init__(
        self,
        env: gym.vector.VectorEnv,
        latency: Latency,
        actor: int | None = None,
        sleeper: Sleeper | None = None,
    ):
        super().__init__(env)
        self.latency = latency
        self.actor = actor_index() if actor is None else int(actor)
        self.factor = latency.factor(self.actor)
        self.sleeper = sleeper or Sleeper()
        self._rng = np.random.default_rng([max(self.actor, 0), 0x1A7E])
        self._announced = False

    def reset(self, *, seed=None, options=None):
        if seed is not None:  # this actor's own stream (tianjax seeds each actor differently)
            self._rng = np.random.default_rng([int(seed) % 2**63, 0x1A7E])
            self._announce()
        return self.env.reset(seed=seed, options=options)

    def step(self, actions):
        out = self.env.step(actions)
        self.sleeper.pay(draw_delay_s(self._rng, self.latency, self.factor))
        return out

    def _announce(self) -> None:
        if self.actor >= 0 and not self._announced:
            self._announced = True
            print(
                ANNOUNCE.format(
                    actor=self.actor,
                    factor=self.factor,
                    mean_ms=self.latency.mean_ms(self.actor),
                    num_envs=self.num_envs,
                ),
                file=sys.stderr,
                flush=True,
            )


class _EnvpoolVector(gym.vector.VectorEnv):
    """envpool's batch through tianjax's adapter (same-step auto-reset), as a gymnasium
    vector env with SAME_STEP semantics (final observations in info["final_obs"])."""

    def __init__(self, task_id: str, num_envs: int, **kwargs: Any):
        import envpool

        from tianjax.envs.envpool_env import EnvpoolEnv

        self._env = EnvpoolEnv(task_id, num_envs, 0, **kwargs)
        self.num_envs = num_envs
        spec = envpool.make_spec(task_id)
        self.single_observation_space = spec.gymnasium_observation_space
        self.single_action_space = spec.gymnasium_action_space
        self.observation_space = gym.vector.utils.batch_space(
            self.single_observation_space, num_envs
        )
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self.metadata = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}

    def reset(self, *, seed=None, options=None):
        return self._env.reset(seed), {}

    def step(self, actions):
        s = self._env.step(actions)
        done = s.terminated | s.truncated
        info = {"final_obs": s.final_obs, "_final_obs": done} if done.any() else {}
        return s.obs, s.reward, s.terminated, s.truncated, info

    def close(self, **kwargs):
        self._env.close()


def _latency(options: dict) -> Latency:
    names = {f for f in Latency.__dataclass_fields__}
    kw = {k: options.pop(k) for k in list(options) if k in names}
    if "slow_actors" in kw:
        sa = kw["slow_actors"]
        kw["slow_actors"] = tuple(sa) if isinstance(sa, (list, tuple)) else (sa,)
    return Latency(**kw)


def _cartpole(num_envs: int = 1, **options) -> gym.vector.VectorEnv:
    latency = _latency(options)
    if options.get("render_mode") is None:
        options.pop("render_mode", None)
        return LatencyVectorEnv(CartPoleVectorEnv(num_envs, **options), latency)
    # rendering is gymnasium's CartPoleEnv's own: its envs, one by one
    from gymnasium.envs.classic_control import CartPoleEnv

    limit = options.pop("max_episode_steps", 500)
    base = gym.vector.SyncVectorEnv(
        [lambda: gym.wrappers.TimeLimit(CartPoleEnv(**options), limit) for _ in range(num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    return LatencyVectorEnv(base, latency)


def _lunarlander(num_envs: int = 1, **options) -> gym.vector.VectorEnv:
    latency = _latency(options)
    return LatencyVectorEnv(_EnvpoolVector("LunarLander-v2", num_envs, **options), latency)


def _with_signature(fn, base_params: list[inspect.Parameter]):
    """`fn` with a signature naming every option it takes (num_envs, the Latency fields, the
    dynamics' own), so that tianjax can check env_options against it."""
    kw = inspect.Parameter.KEYWORD_ONLY
    params = [inspect.Parameter("num_envs", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=1)]
    params += [
        inspect.Parameter(name, kw, default=f.default)
        for name, f in Latency.__dataclass_fields__.items()
    ]
    params += [p.replace(kind=kw) for p in base_params]
    fn.__signature__ = inspect.Signature(params)
    return fn


def _cartpole_params() -> list[inspect.Parameter]:
    kw = inspect.Parameter.KEYWORD_ONLY
    own = [
        p
        for name, p in inspect.signature(CartPoleVectorEnv).parameters.items()
        if name != "num_envs"
    ]
    return [*own, inspect.Parameter("render_mode", kw, default=None)]


def _lunarlander_params() -> list[inspect.Parameter]:
    # the envpool options of LunarLander-v2 that make sense per run (not its batching, its
    # threads or its seeds, which tianjax sets)
    kw = inspect.Parameter.KEYWORD_ONLY
    return [
        inspect.Parameter("max_episode_steps", kw, default=1000),
        inspect.Parameter("reward_threshold", kw, default=200.0),
    ]


def register() -> None:
    """Registers both ids with gymnasium (once; importing this module does it)."""
    if CARTPOLE_ID not in gym.registry:
        gym.register(
            CARTPOLE_ID,
            vector_entry_point=_with_signature(_cartpole, _cartpole_params()),
            max_episode_steps=500,
            reward_threshold=475.0,
        )
    if LUNARLANDER_ID not in gym.registry:
        gym.register(
            LUNARLANDER_ID,
            vector_entry_point=_with_signature(_lunarlander, _lunarlander_params()),
            max_episode_steps=1000,
            reward_threshold=200.0,
        )


register()

__all__ = [
    "ACTOR_INDEX_ENV",
    "CARTPOLE_ID",
    "LUNARLANDER_ID",
    "Latency",
    "LatencyVectorEnv",
    "Sleeper",
    "actor_index",
    "draw_delay_s",
    "register",
]
