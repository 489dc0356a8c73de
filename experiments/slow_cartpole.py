"""SlowCartPole-v1: gymnasium CartPole-v1 whose steps cost time, one actor's k times more.

Importing this module registers the id, so a config names it as gymnasium's own
`module:EnvId` and the actor processes import it too (the launcher hands them this
process's sys.path):

    env: slow_cartpole:SlowCartPole-v1
    env_backend: gymnasium
    env_options: {step_cost_s: 1.25e-4, slow_actor: 0, slowdown: 4}

Every env step costs `step_cost_s` of sleep (a vector env of B envs: B times that per
vector step), and `slowdown` times as much in the envs of actor `slow_actor`. Sleeping
models an env that is slow without loading the CPU, so the actors do not compete with the
learner for cores: what is measured is waiting, the dependency that async relaxes.

Which actor am I? tianjax seeds actor a's envs from `seed + 7919 * (a + 1)` (plus the env's
index in its batch), so the first seeded reset gives the index: `seed // 7919 - 1`
(while seed + num_envs < 7919). An env never reset with such a seed (the learner's probe
env, seeded with the config's seed) counts as no actor and steps at the base cost. The
first env of an actor process that learns its index prints one line saying so, which ends
up in that actor's log (run_dir/actors/actor-<a>.log).
"""

from __future__ import annotations

import sys
import time

import gymnasium as gym
from gymnasium.envs.classic_control import CartPoleEnv

ENV_ID = "SlowCartPole-v1"
ACTOR_SEED_STRIDE = 7919  # tianjax.runtime.actor.actor: actor a is seeded with seed + 7919 * (a + 1)
ANNOUNCE = "slow_cartpole: actor {actor} steps at {factor:g}x ({cost_ms:.3f} ms per env step)"


def actor_index(seed: int) -> int:
    """The actor whose envs were seeded with `seed`; -1 for none (the learner's probe)."""
    return int(seed) // ACTOR_SEED_STRIDE - 1


class SleepDebt:
    """Sleep owed by the envs of one process, paid in sleeps of at least `min_s`.

    time.sleep overshoots by ~0.1 ms, so many tiny sleeps would cost more than asked: the
    envs add what they owe, and the debt is paid once it reaches `min_s`, the time actually
    slept being subtracted (an overshoot, or a late wake-up on a busy machine, is credited
    to the next payments, at most 4 `min_s`).
    """

    def __init__(self, min_s: float = 1e-3, clock=time.perf_counter, sleep=time.sleep):
        self.min_s = float(min_s)
        self.owed = 0.0
        self.slept = 0.0
        self._clock, self._sleep = clock, sleep

    def add(self, seconds: float) -> None:
        self.owed += seconds
        if self.owed >= self.min_s:
            t = self._clock()
            self._sleep(self.owed)
            took = self._clock() - t
            self.slept += took
            self.owed = max(self.owed - took, -4 * self.min_s)


_DEBT = SleepDebt()  # one per process: every env of an actor's batch adds to it
_announced = False


class SlowSteps(gym.Wrapper):
    """Each step sleeps `step_cost_s`, times `slowdown` when this env belongs to actor
    `slow_actor` (learnt from its first seeded reset)."""

    def __init__(self, env: gym.Env, step_cost_s: float, slow_actor: int, slowdown: float,
                 debt: SleepDebt | None = None):
        super().__init__(env)
        if step_cost_s < 0 or slowdown < 1:
            raise ValueError(f"{ENV_ID}: step_cost_s must be >= 0 and slowdown >= 1, "
                             f"got {step_cost_s} and {slowdown}")
        self.step_cost_s, self.slow_actor, self.slowdown = float(step_cost_s), int(slow_actor), float(slowdown)
        self.actor = -1
        self.cost_s = self.step_cost_s
        self._debt = _DEBT if debt is None else debt

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.actor = actor_index(seed)
            self.cost_s = self.step_cost_s * (self.slowdown if self.actor == self.slow_actor else 1.0)
            self._announce()
        return self.env.reset(seed=seed, options=options)

    def _announce(self) -> None:
        global _announced
        if self.actor >= 0 and not _announced:
            _announced = True
            factor = self.cost_s / self.step_cost_s if self.step_cost_s else 1.0
            print(ANNOUNCE.format(actor=self.actor, factor=factor, cost_ms=self.cost_s * 1e3),
                  file=sys.stderr, flush=True)

    def step(self, action):
        out = self.env.step(action)
        self._debt.add(self.cost_s)
        return out


def make(step_cost_s: float = 1.25e-4, slow_actor: int = 0, slowdown: float = 1.0,
         render_mode: str | None = None) -> gym.Env:
    """CartPole-v1's dynamics with SlowSteps; the registration adds its 500-step limit."""
    return SlowSteps(CartPoleEnv(render_mode=render_mode), step_cost_s, slow_actor, slowdown)


if ENV_ID not in gym.registry:
    gym.register(ENV_ID, entry_point=make, max_episode_steps=500, reward_threshold=475.0)
