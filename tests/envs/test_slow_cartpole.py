"""experiments/slow_cartpole.py, the straggler experiment's env: which actor an env belongs
to, what its steps cost, and that tianjax builds it from `module:EnvId`."""

import os
import sys

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "experiments"))

import slow_cartpole  # noqa: E402

from tianjax.envs.factory import make_host_env  # noqa: E402


class FakeTime:
    """A clock that moves only when slept on, oversleeping by `over` each time."""

    def __init__(self, over: float = 0.0):
        self.now, self.over, self.sleeps = 0.0, over, []

    def clock(self):
        return self.now

    def sleep(self, s):
        self.sleeps.append(s)
        self.now += s + self.over


def test_actor_index_follows_the_seeds_tianjax_gives_actors():
    # actor a: seed + 7919 * (a + 1), plus the env's index in its batch
    assert [slow_cartpole.actor_index(s + 7919 * (a + 1) + i) for a, s, i in
            [(0, 0, 0), (0, 2, 15), (2, 1, 3), (7, 0, 0)]] == [0, 0, 2, 7]
    assert slow_cartpole.actor_index(0) == slow_cartpole.actor_index(3) == -1  # the learner's probe env


def test_sleep_debt_pays_in_chunks_and_credits_oversleep():
    t = FakeTime(over=0.0002)
    debt = slow_cartpole.SleepDebt(min_s=0.001, clock=t.clock, sleep=t.sleep)
    for _ in range(9):
        debt.add(0.00025)  # 9 x 0.25 ms = 2.25 ms owed
    # paid once 1 ms is owed; the 0.2 ms overslept is credited, so the second payment
    # comes one step later: slept = owed + the last oversleep
    assert np.allclose(t.sleeps, [0.001, 0.00105])
    assert np.isclose(t.now, 0.00225 + 0.0002) and np.isclose(debt.owed, -0.0002)
    # a very late wake-up is credited at most 4 min_s
    t.over = 0.05
    debt.add(0.002)
    assert np.isclose(debt.owed, -0.004)


def test_the_slow_actor_steps_k_times_the_base_cost():
    t = FakeTime()
    costs = {}
    for actor in (0, 1):
        debt = slow_cartpole.SleepDebt(min_s=1.0, clock=t.clock, sleep=t.sleep)  # never paid: counts
        env = slow_cartpole.SlowSteps(slow_cartpole.CartPoleEnv(), 0.001, slow_actor=1, slowdown=4, debt=debt)
        env.reset(seed=5 + 7919 * (actor + 1))
        for _ in range(3):
            env.step(0)
        costs[actor] = debt.owed
    assert np.isclose(costs[0], 0.003) and np.isclose(costs[1], 0.012)


def test_tianjax_builds_it_from_module_env_id():
    env = make_host_env("gymnasium", f"slow_cartpole:{slow_cartpole.ENV_ID}", 2, 0, step_cost_s=0.0)
    obs = env.reset(0)
    assert obs.shape == (2, 4) and env.action_spec.num_actions == 2
    out = env.step(np.zeros(2, np.int64))
    assert out.reward.tolist() == [1.0, 1.0]
    env.close()
