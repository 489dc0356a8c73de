"""tianjax/envs/vector_cartpole.py against gymnasium's CartPoleEnv: the same start states from
a seed, and from them, with the same actions, the same observations, rewards, terminations,
truncations and final observations, step by step and across auto-resets; a first step
from rest computed by hand; and its options checked as the latency env's."""

import numpy as np
import pytest
from gymnasium.envs.classic_control import CartPoleEnv
from gymnasium.wrappers import TimeLimit

from tianjax.config import ConfigError
from tianjax.envs import latency as L
from tianjax.envs.factory import make_host_env
from tianjax.envs.vector_cartpole import CartPoleVectorEnv


class Reference:
    """B gymnasium CartPoles under its TimeLimit, auto-reset on the step that ends one (SAME_STEP)."""

    def __init__(self, n, limit, **kwargs):
        self.envs = [TimeLimit(CartPoleEnv(**kwargs), limit) for _ in range(n)]

    def reset(self, seed):
        return np.stack([e.reset(seed=seed + i)[0] for i, e in enumerate(self.envs)])

    def step(self, actions):
        out = [list(e.step(int(a))) for e, a in zip(self.envs, actions)]
        final = {}
        for i, (e, o) in enumerate(zip(self.envs, out)):
            if o[2] or o[3]:
                final[i] = o[0]
                o[0] = e.reset()[0]
        obs, reward, term, trunc = (np.array([o[k] for o in out]) for k in range(4))
        return obs, reward, term, trunc, final


def _balance(obs):
    """Pushes the cart under the pole: episodes long enough to reach the time limit."""
    return (obs[:, 2] + 0.5 * obs[:, 3] > 0).astype(np.int64)


def test_a_seed_starts_the_carts_that_gymnasium_starts():
    env = CartPoleVectorEnv(5)
    obs, info = env.reset(seed=11)
    assert obs.dtype == np.float32 and obs.shape == (5, 4) and info == {}
    np.testing.assert_array_equal(obs, Reference(5, 500).reset(11))
    assert np.abs(obs).max() <= 0.05


@pytest.mark.parametrize("sutton_barto", [False, True])
def test_step_by_step_as_gymnasiums_cartpole_across_resets(sutton_barto):
    B, limit = 6, 40
    env = CartPoleVectorEnv(B, max_episode_steps=limit, sutton_barto_reward=sutton_barto)
    ref = Reference(B, limit, sutton_barto_reward=sutton_barto)
    obs, ref_obs = env.reset(seed=3)[0], ref.reset(3)
    rng = np.random.default_rng(0)
    ends = {"terminated": 0, "truncated": 0}
    for _ in range(600):
        # carts 0-2 random (they fall), 3-5 balanced (they reach the limit)
        actions = np.concatenate([rng.integers(0, 2, 3), _balance(obs)[3:]])
        obs, reward, term, trunc, info = env.step(actions)
        ref_obs, ref_reward, ref_term, ref_trunc, ref_final = ref.step(actions)
        np.testing.assert_allclose(obs, ref_obs, rtol=0, atol=1e-6)
        np.testing.assert_array_equal(reward, ref_reward)
        np.testing.assert_array_equal(term, ref_term)
        np.testing.assert_array_equal(trunc, ref_trunc)
        done = term | trunc
        if done.any():
            np.testing.assert_array_equal(info["_final_obs"], done)
            for i, final in ref_final.items():
                np.testing.assert_allclose(info["final_obs"][i], final, rtol=0, atol=1e-6)
        else:
            assert info == {}
        ends["terminated"] += int(term.sum())
        ends["truncated"] += int(trunc.sum())
    # both ends happened, each followed by a reset from the cart's own stream
    assert ends["terminated"] > 20 and ends["truncated"] > 20, ends


def test_a_first_step_from_rest_computed_by_hand():
    env = CartPoleVectorEnv(2)
    obs, _ = env.reset(options={"low": 0.0, "high": 0.0})
    np.testing.assert_array_equal(obs, np.zeros((2, 4), np.float32))
    obs, reward, term, trunc, info = env.step(np.array([1, 0]))
    # F = 10 N: temp = F / 1.1 = 100/11; theta'' = -temp / (0.5 (4/3 - 0.1/1.1)) = -600/41;
    # x'' = temp - 0.05 theta'' / 1.1 = 4400/451; one Euler step of 0.02 s from rest
    right = np.array([0.0, 0.02 * 4400 / 451, 0.0, -0.02 * 600 / 41], np.float32)
    np.testing.assert_allclose(obs, np.stack([right, -right]), rtol=1e-6)
    np.testing.assert_array_equal(reward, [1.0, 1.0])
    assert not term.any() and not trunc.any() and info == {}


def test_the_time_limit_truncates_and_restarts_the_cart():
    env = CartPoleVectorEnv(1, max_episode_steps=3)
    env.reset(seed=0, options={"low": 0.0, "high": 0.0})
    ref = CartPoleEnv()
    ref.reset(seed=0)
    ref.state = np.zeros(4)  # the same start, at rest
    for a in (1, 0):
        _, _, term, trunc, _ = env.step(np.array([a]))
        ref.step(a)
        assert not term[0] and not trunc[0]
    obs, reward, term, trunc, info = env.step(np.array([1]))
    assert trunc[0] and not term[0] and reward[0] == 1.0
    np.testing.assert_allclose(
        info["final_obs"][0], ref.step(1)[0], rtol=0, atol=1e-6
    )  # the last state
    assert np.abs(obs[0]).max() <= 0.05 and not np.array_equal(
        obs[0], info["final_obs"][0]
    )  # a new start
    _, _, _, trunc, _ = env.step(np.array([1]))
    assert not trunc[0]  # the count started again


def test_actions_outside_the_space_are_refused():
    env = CartPoleVectorEnv(2)
    env.reset(seed=0)
    for bad in (np.array([0, 2]), np.array([1]), np.array([[0, 1]])):
        with pytest.raises(ValueError, match="one action in"):
            env.step(bad)


def test_the_latency_env_steps_these_carts_and_checks_their_options():
    env = make_host_env(
        "gymnasium", L.CARTPOLE_ID, 3, 5, step_ms=0.0, max_episode_steps=7, sutton_barto_reward=True
    )
    assert isinstance(env._env.unwrapped, CartPoleVectorEnv)  # noqa: SLF001
    env.reset(5)
    for _ in range(7):
        s = env.step(np.array([1, 0, 1]))
    assert s.truncated.all() and s.reward.dtype == np.float32
    env.close()
    # rendering is gymnasium's own CartPoleEnv's (built, not drawn: no display needed)
    env = make_host_env("gymnasium", L.CARTPOLE_ID, 2, 0, step_ms=0.0, render_mode="rgb_array")
    assert not isinstance(env._env.unwrapped, CartPoleVectorEnv)  # noqa: SLF001
    env.close()
    for bad, value in (("max_episode_steps", 0), ("max_episode_steps", 2.5)):
        with pytest.raises(ConfigError) as e:
            make_host_env("gymnasium", L.CARTPOLE_ID, 2, 0, **{bad: value})
        assert "\n" not in str(e.value) and f"env_options.{bad}" in str(e.value)
    with pytest.raises(ConfigError) as e:
        make_host_env("gymnasium", L.CARTPOLE_ID, 2, 0, sutton_barto=True)
    assert "\n" not in str(e.value) and "env_options.sutton_barto" in str(e.value)
