"""tianjax/envs/latency.py: the delay model, one delay per vector step, per-actor streams and
slow actors, CartPole's own dynamics, and env_options checked against the env's signature."""

import math

import gymnasium as gym
import numpy as np
import pytest

from tianjax.config import ConfigError
from tianjax.envs import latency as L
from tianjax.envs.factory import make_host_env
from tianjax.envs.vector_cartpole import CartPoleVectorEnv


class FakeTime:
    """A clock that moves only when slept on, oversleeping by `over` each time."""

    def __init__(self, over: float = 0.0):
        self.now, self.over, self.sleeps = 0.0, over, []

    def clock(self):
        return self.now

    def sleep(self, s):
        self.sleeps.append(s)
        self.now += s + self.over


def _vec(latency, actor, n=3, over=0.0):
    t = FakeTime(over)
    return L.LatencyVectorEnv(
        CartPoleVectorEnv(n), latency, actor=actor, sleeper=L.Sleeper(t.clock, t.sleep)
    ), t


def test_fixed_delay_with_a_certain_hiccup_and_a_slow_factor():
    rng = np.random.default_rng(0)
    lat = L.Latency(step_ms=16, sigma=0.0, hiccup_p=1.0, hiccup_ms=300)
    assert L.draw_delay_s(rng, lat, 1.0) == pytest.approx(0.316)
    assert L.draw_delay_s(rng, lat, 4.0) == pytest.approx(4 * 0.316)
    assert L.draw_delay_s(rng, L.Latency(step_ms=16), 1.0) == pytest.approx(0.016)
    assert L.Latency(
        step_ms=16, hiccup_p=0.01, hiccup_ms=300, slow_actors=(2,), slow_factor=4
    ).mean_ms(2) == pytest.approx(4 * 19.0)


def test_lognormal_delay_has_mean_step_ms_and_median_below_it():
    rng = np.random.default_rng(1)
    lat = L.Latency(step_ms=16, sigma=1.0)
    d = np.array([L.draw_delay_s(rng, lat, 1.0) for _ in range(40_000)]) * 1e3
    # mean-preserving: E[exp(sigma z - sigma^2 / 2)] = 1; the median is exp(-sigma^2 / 2) of it
    assert d.mean() == pytest.approx(16.0, rel=0.03)
    assert np.median(d) == pytest.approx(16.0 * math.exp(-0.5), rel=0.03)
    # log(d) is normal with sd sigma
    assert np.log(d).std() == pytest.approx(1.0, rel=0.02)


def test_hiccups_come_at_their_rate():
    rng = np.random.default_rng(2)
    lat = L.Latency(step_ms=1, hiccup_p=0.05, hiccup_ms=100)
    d = np.array([L.draw_delay_s(rng, lat, 1.0) for _ in range(20_000)])
    assert (d > 0.05).mean() == pytest.approx(0.05, abs=0.006)


def test_sleeper_credits_oversleep_up_to_its_cap():
    t = FakeTime(over=0.0002)
    s = L.Sleeper(t.clock, t.sleep, max_credit_s=0.004)
    s.pay(0.001)
    s.pay(0.001)  # the 0.2 ms overslept is taken off
    assert np.allclose(t.sleeps, [0.001, 0.0008])
    t.over = 0.05  # a very late wake-up is credited at most 4 ms
    s.pay(0.001)
    assert s.owed == pytest.approx(-0.004)
    s.pay(0.003)  # still owed less than nothing: no sleep
    assert len(t.sleeps) == 3


def test_one_delay_per_vector_step_and_the_slow_actor_waits_k_times_as_long():
    lat = L.Latency(step_ms=10, slow_actors=(1,), slow_factor=4)
    owed = {}
    for actor in (0, 1):
        env, t = _vec(lat, actor, n=5)
        env.reset(seed=3)
        for _ in range(3):
            env.step(np.zeros(5, np.int64))
        assert len(t.sleeps) == 3  # one simulator serving its 5 envs: one wait per vector step
        owed[actor] = t.now
    assert owed[0] == pytest.approx(0.030) and owed[1] == pytest.approx(0.120)


def test_each_actor_draws_from_its_own_seed():
    lat = L.Latency(step_ms=10, sigma=1.0, hiccup_p=0.1, hiccup_ms=50)

    def delays(seed):
        env, t = _vec(lat, 0, n=2)
        env.reset(seed=seed)
        for _ in range(20):
            env.step(np.zeros(2, np.int64))
        return np.array(t.sleeps)

    np.testing.assert_allclose(delays(7919), delays(7919))  # reproducible
    assert not np.allclose(delays(7919), delays(2 * 7919))  # another actor's seed: another stream


def test_the_dynamics_are_cartpoles_own():
    env = make_host_env("gymnasium", L.CARTPOLE_ID, 3, 5, step_ms=0.0)
    ref = gym.make_vec(
        "CartPole-v1",
        3,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
    )
    obs = env.reset(5)
    ref_obs, _ = ref.reset(seed=5)
    np.testing.assert_array_equal(obs, ref_obs)
    rng = np.random.default_rng(0)
    ends = 0
    for _ in range(60):
        a = rng.integers(0, 2, 3)
        s = env.step(a)
        o, r, term, trunc, info = ref.step(a)
        np.testing.assert_array_equal(s.obs, o)
        np.testing.assert_array_equal(s.terminated, term)
        ends += int(term.sum())
        if term.any():
            np.testing.assert_array_equal(
                s.final_obs[term],
                info["final_obs"][term].astype(np.float32)
                if info["final_obs"].dtype != object
                else np.stack(info["final_obs"][term]),
            )
    assert ends > 0  # episodes ended, and the auto-reset matched
    env.close()
    ref.close()


def test_lunarlander_builds_from_envpool_dynamics():
    pytest.importorskip("envpool")
    env = make_host_env("gymnasium", L.LUNARLANDER_ID, 2, 0, step_ms=0.0)
    assert env.obs_shape == (8,) and env.action_spec.num_actions == 4
    env.reset(0)
    s = env.step(np.zeros(2, np.int64))
    assert s.obs.shape == (2, 8) and s.reward.shape == (2,)
    env.close()


@pytest.mark.parametrize(
    "backend, env_id, bad, hint",
    [
        ("gymnasium", L.CARTPOLE_ID, "step_mss", "step_ms"),
        ("gymnasium", L.CARTPOLE_ID, "slow_actor", "slow_actors"),
        ("gymnasium", "CartPole-v1", "max_episode_step", "max_episode_steps"),
        ("envpool", "CartPole-v1", "max_episode_step", "max_episode_steps"),
    ],
)
def test_a_misspelt_option_is_one_line_naming_it(backend, env_id, bad, hint):
    if backend == "envpool":
        pytest.importorskip("envpool")
    with pytest.raises(ConfigError) as e:
        make_host_env(backend, env_id, 2, 0, **{bad: 1})
    msg = str(e.value)
    assert "\n" not in msg and f"env_options.{bad}" in msg and f"did you mean '{hint}'" in msg


def test_bad_latency_values_name_the_key():
    with pytest.raises(ConfigError, match=r"env_options\.hiccup_p"):
        make_host_env("gymnasium", L.CARTPOLE_ID, 2, 0, hiccup_p=1.5)
    with pytest.raises(ConfigError, match=r"env_options\.slow_factor"):
        make_host_env("gymnasium", L.CARTPOLE_ID, 2, 0, slow_factor=0.5)


def test_the_actor_index_comes_from_the_launcher(monkeypatch):
    monkeypatch.setenv(L.ACTOR_INDEX_ENV, "3")
    assert L.actor_index() == 3
    monkeypatch.delenv(L.ACTOR_INDEX_ENV)
    assert L.actor_index() == -1  # no actor (the learner's own envs): never slow
