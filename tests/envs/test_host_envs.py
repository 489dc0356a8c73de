"""Host env adapters (tianjax.envs.factory) follow the JAX env protocol: same-step auto-reset,
`final_obs` the observation an episode ended on, terminated and truncated apart, as gymnax
reports them."""

import gymnasium
import jax
import numpy as np
import pytest

from tianjax.config import ConfigError
from tianjax.envs.factory import EnvpoolEnv, GymnasiumVectorEnv, HostEnv, HostStep, make_host_env
from tianjax.envs.gymnax_env import make_gymnax

BACKENDS = ["envpool", "gymnasium"]
B = 4
TAU = 0.02  # CartPole's Euler step: x' = x + TAU * x_dot (with the old x_dot)
RESET_BOUND = 0.05  # CartPole resets every state variable uniformly in [-0.05, 0.05]


def _env(backend, n=B, **kwargs):
    return make_host_env(backend, "CartPole-v1", n, seed=0, **kwargs)


def _fresh(obs):
    return np.all(np.abs(obs) <= RESET_BOUND)


def _fallen(obs):
    return (np.abs(obs[..., 0]) > 2.4) | (np.abs(obs[..., 2]) > 0.2095)


def _gymnax_flags(max_steps, action, n_steps):
    """(terminated, truncated) per step of one gymnax CartPole episode (one env)."""
    env = make_gymnax("CartPole-v1")
    params = env.params.replace(max_steps_in_episode=max_steps)
    jenv = type(env)(env.env, params, name="CartPole-v1")
    obs, state = jenv.reset(jax.random.key(0))
    flags, finals, nexts = [], [], []
    for t in range(n_steps):
        out = jenv.step(jax.random.key(t + 1), state, action(t))
        flags.append((bool(out.terminated), bool(out.truncated)))
        finals.append(np.asarray(out.final_obs))
        nexts.append(np.asarray(out.obs))
        state = out.state
    return flags, finals, nexts


@pytest.mark.parametrize("backend", BACKENDS)
def test_protocol_shapes_and_dtypes(backend):
    env = _env(backend)
    try:
        assert isinstance(env, HostEnv)
        assert isinstance(env, EnvpoolEnv if backend == "envpool" else GymnasiumVectorEnv)
        assert env.num_envs == B and env.obs_shape == (4,) and env.obs_dtype == np.float32
        assert env.action_spec.discrete and env.action_spec.num_actions == 2
        assert env.name == "CartPole-v1"
        obs = env.reset(0)
        assert obs.shape == (B, 4) and obs.dtype == np.float32 and _fresh(obs)
        step = env.step(np.zeros(B, np.int32))
        assert isinstance(step, HostStep)
        assert step.obs.shape == (B, 4) and step.final_obs.shape == (B, 4)
        assert step.reward.shape == (B,) and step.reward.dtype == np.float32
        assert step.terminated.shape == (B,) and step.terminated.dtype == bool
        assert step.truncated.shape == (B,) and step.truncated.dtype == bool
        np.testing.assert_array_equal(step.final_obs, step.obs)  # nothing ended
        np.testing.assert_allclose(
            step.obs[:, 0], obs[:, 0] + TAU * obs[:, 1], rtol=1e-5, atol=1e-6
        )
    finally:
        env.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_reset_is_seeded(backend):
    env = _env(backend)
    try:
        a, b, c = env.reset(0), env.reset(1), env.reset(0)
        np.testing.assert_array_equal(a, c)
        assert not np.allclose(a, b)
    finally:
        env.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_truncation_resets_in_the_same_step(backend):
    limit = 5
    alternate = lambda t: t % 2  # noqa: E731  (keeps the pole up for far more than 5 steps)
    env = _env(backend, max_episode_steps=limit)
    try:
        obs = env.reset(0)
        for t in range(limit):
            prev, step = obs, env.step(np.full(B, alternate(t), np.int32))
            obs = step.obs
            if t < limit - 1:
                assert not step.truncated.any() and not step.terminated.any()
        # the step that hit the time limit: truncated, not terminated, as gymnax says
        flags, g_final, g_next = _gymnax_flags(limit, alternate, limit)
        assert flags[-1] == (False, True) and all(f == (False, False) for f in flags[:-1])
        assert step.truncated.all() and not step.terminated.any()
        assert np.allclose(g_final[-1][0], g_next[-2][0] + TAU * g_next[-2][1], atol=1e-6)
        # final_obs is where the episode ended (the dynamics continue from prev) ...
        np.testing.assert_allclose(
            step.final_obs[:, 0], prev[:, 0] + TAU * prev[:, 1], rtol=1e-5, atol=1e-6
        )
        assert not _fresh(step.final_obs)
        # ... and obs is already the first observation of the next episode
        assert _fresh(step.obs)
        assert not np.allclose(step.obs, step.final_obs)
        assert np.all(step.reward == 1.0)
        # the next step acts from the reset obs (envpool would swallow it: reward 0)
        nxt = env.step(np.zeros(B, np.int32))
        assert np.all(nxt.reward == 1.0) and not (nxt.terminated | nxt.truncated).any()
        np.testing.assert_allclose(nxt.obs[:, 0], obs[:, 0] + TAU * obs[:, 1], rtol=1e-5, atol=1e-6)
    finally:
        env.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_termination_resets_in_the_same_step(backend):
    push_right = lambda t: 1  # noqa: E731  (the pole falls within a few dozen steps)
    env = _env(backend)
    try:
        env.reset(0)
        ended = np.zeros(B, bool)
        for t in range(100):
            step = env.step(np.ones(B, np.int32))
            done = step.terminated | step.truncated
            live = ~done
            np.testing.assert_array_equal(step.final_obs[live], step.obs[live])
            if done.any():
                assert step.terminated[done].all() and not step.truncated.any()
                assert _fallen(step.final_obs[done]).all()
                assert _fresh(step.obs[done])
            assert not _fallen(step.obs).any()
            ended |= done
            if ended.all():
                break
        assert ended.all()
        flags, g_final, _ = _gymnax_flags(500, push_right, 100)
        end = next(i for i, f in enumerate(flags) if any(f))
        assert flags[end] == (True, False) and _fallen(g_final[end])
    finally:
        env.close()


def test_termination_on_the_last_allowed_step_matches_gymnax():
    """Both flags are set when an episode fails on its last allowed step (gymnax and
    gymnasium). envpool reports it as truncated only (its gymnasium wrapper computes
    terminated = done & ~truncated), a documented difference of that backend."""
    env = _env("gymnasium", n=1)
    try:
        env.reset(0)
        for n in range(1, 100):
            step = env.step(np.ones(1, np.int32))
            if step.terminated[0]:
                break
    finally:
        env.close()
    env = _env("gymnasium", n=1, max_episode_steps=n)
    try:
        env.reset(0)
        for _ in range(n):
            step = env.step(np.ones(1, np.int32))
        assert step.terminated[0] and step.truncated[0]
    finally:
        env.close()
    flags, _, _ = _gymnax_flags(500, lambda t: 1, 100)
    end = next(i for i, f in enumerate(flags) if any(f)) + 1
    flags, _, _ = _gymnax_flags(end, lambda t: 1, end)
    assert flags[-1] == (True, True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_random_play_never_loses_a_step(backend):
    """Across many episodes ending at different times, every step acts: reward 1, and the
    dynamics continue from the returned obs (reset or not)."""
    rng = np.random.default_rng(0)
    env = _env(backend, n=8, max_episode_steps=20)
    try:
        obs = env.reset(0)
        episodes = 0
        for _ in range(300):
            step = env.step(rng.integers(0, 2, 8))
            assert np.all(step.reward == 1.0)
            np.testing.assert_allclose(
                step.final_obs[:, 0], obs[:, 0] + TAU * obs[:, 1], rtol=1e-4, atol=1e-5
            )
            done = step.terminated | step.truncated
            assert _fresh(step.obs[done])
            episodes += int(done.sum())
            obs = step.obs
        assert episodes > 100
    finally:
        env.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_continuous_actions_are_clipped(backend):
    envs = [make_host_env(backend, "Pendulum-v1", 3, seed=0) for _ in range(2)]
    try:
        spec = envs[0].action_spec
        assert not spec.discrete and spec.shape == (1,)
        np.testing.assert_allclose(spec.low, [-2.0]) and np.testing.assert_allclose(
            spec.high, [2.0]
        )
        for e in envs:
            e.reset(0)
        big = envs[0].step(np.array([[50.0], [-50.0], [0.5]], np.float32))
        clipped = envs[1].step(np.array([[2.0], [-2.0], [0.5]], np.float32))
        np.testing.assert_allclose(big.obs, clipped.obs, rtol=1e-6)
        np.testing.assert_allclose(big.reward, clipped.reward, rtol=1e-6)
    finally:
        for e in envs:
            e.close()


class _Corridor(gymnasium.Env):
    """A user's own env: walk right 3 cells to finish."""

    observation_space = gymnasium.spaces.Box(0.0, 3.0, (1,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.pos = max(0, self.pos + (1 if action == 1 else -1))
        return (
            np.array([self.pos], np.float32),
            1.0 if self.pos == 3 else 0.0,
            self.pos == 3,
            False,
            {},
        )


def test_gymnasium_takes_a_user_registered_env():
    gymnasium.register("TianjaxTestCorridor-v0", entry_point=_Corridor, max_episode_steps=10)
    env = make_host_env("gymnasium", "TianjaxTestCorridor-v0", 2, seed=0)
    try:
        assert env.obs_shape == (1,) and env.action_spec.num_actions == 2
        env.reset(0)
        for t in range(3):
            step = env.step(np.array([1, 0]))
        assert step.terminated.tolist() == [True, False] and step.reward.tolist() == [1.0, 0.0]
        assert step.final_obs[0, 0] == 3.0 and step.obs[0, 0] == 0.0
    finally:
        env.close()


@pytest.mark.parametrize(
    "backend,env_id",
    [
        ("envpool", "NoSuchEnv-v0"),
        ("gymnasium", "NoSuchEnv-v0"),
        ("gymnasium", "CartPole-v9"),
        ("gymnasium", "nomodule:Env-v0"),
    ],
)
def test_unknown_env_id_is_a_config_error(backend, env_id):
    with pytest.raises(ConfigError, match=r"^config key 'env': .*list them with") as e:
        make_host_env(backend, env_id, 2)
    assert "\n" not in str(e.value)


def test_unknown_backend_is_a_config_error():
    with pytest.raises(ConfigError, match="config key 'env_backend'"):
        make_host_env("gymnax", "CartPole-v1", 2)


class _ScriptedAtari:
    """Stands in for an envpool Atari pool (B = 2): each step returns the next scripted
    (clipped reward, terminated, info reward, info terminated), and it records the calls."""

    def __init__(self, script):
        self.script = list(script)
        self.calls = []

    def step(self, actions, env_ids):
        ids = np.asarray(env_ids)
        self.calls.append(("step", ids.tolist()))
        if len(ids) < 2:  # envpool's end-of-life restart: obs 7, reward 0
            return (
                np.full((len(ids), 1), 7, np.uint8),
                np.zeros(len(ids), np.float32),
                np.zeros(len(ids), bool),
                np.zeros(len(ids), bool),
                {
                    "env_id": ids,
                    "reward": np.zeros(len(ids), np.float32),
                    "terminated": np.zeros(len(ids), np.int32),
                },
            )
        reward, term, score, over = (np.asarray(x) for x in self.script.pop(0))
        return (
            np.full((2, 1), 1, np.uint8),
            reward.astype(np.float32),
            term.astype(bool),
            np.zeros(2, bool),
            {
                "env_id": ids,
                "reward": score.astype(np.float32),
                "terminated": over.astype(np.int32),
            },
        )

    def reset(self, env_ids=None):
        ids = np.arange(2) if env_ids is None else np.asarray(env_ids)
        self.calls.append(("reset", ids.tolist()))
        return np.full((len(ids), 1), 9, np.uint8), {"env_id": ids}


def test_envpool_reports_the_unclipped_score_and_the_game_over_apart():
    """With reward_clip and episodic_life: `reward` clipped, `terminated` at a lost life;
    `score` is info["reward"], `game_over` info["terminated"]; a lost life is not reset (that
    would start a new game) but restarted by stepping that env alone."""
    env = EnvpoolEnv("Breakout-v5", 2, seed=0, episodic_life=True, reward_clip=True)
    env._env.close()
    fake = env._env = _ScriptedAtari(
        [
            ([1, 1], [False, False], [4, 1], [0, 0]),  # env 0 hits a 4-point brick
            ([0, 1], [True, False], [0, 7], [0, 0]),  # env 0 loses a life; env 1 scores 7
            ([0, 0], [False, True], [0, 0], [0, 1]),  # env 1's game is over
        ]
    )
    s = env.step(np.zeros(2))
    np.testing.assert_array_equal(s.reward, [1, 1])
    np.testing.assert_array_equal(s.score, [4, 1])
    np.testing.assert_array_equal(s.report_reward, [4, 1])
    assert not s.game_over.any() and not s.report_done.any()

    s = env.step(np.zeros(2))
    np.testing.assert_array_equal(s.terminated, [True, False])
    np.testing.assert_array_equal(s.game_over, [False, False])
    assert fake.calls[-1] == ("step", [0])  # restarted, not reset
    np.testing.assert_array_equal(s.obs[:, 0], [7, 1])
    np.testing.assert_array_equal(s.final_obs[:, 0], [1, 1])

    s = env.step(np.zeros(2))
    np.testing.assert_array_equal(s.terminated, [False, True])
    np.testing.assert_array_equal(s.game_over, [False, True])
    np.testing.assert_array_equal(s.report_done, [False, True])
    assert fake.calls[-1] == ("reset", [1])  # a new game
    np.testing.assert_array_equal(s.obs[:, 0], [1, 9])


def test_steps_without_a_score_report_what_they_learn_from():
    """A HostStep without score / game_over (other envs, or a user's HostEnv) reports its
    reward and ends its reported episode where it terminates or is truncated."""
    s = HostStep(
        np.zeros((2, 1)),
        np.array([0.5, 2.0], np.float32),
        np.array([True, False]),
        np.array([False, True]),
        np.zeros((2, 1)),
    )
    np.testing.assert_array_equal(s.report_reward, [0.5, 2.0])
    np.testing.assert_array_equal(s.report_done, [True, True])
    env = _env("envpool", 2)
    try:
        env.reset(0)
        step = env.step(np.zeros(2, np.int32))
        np.testing.assert_array_equal(step.score, step.reward)
        np.testing.assert_array_equal(step.game_over, step.terminated | step.truncated)
    finally:
        env.close()


def test_lunarlander_continuous_config_builds_a_gaussian_policy():
    from tianjax.algos import make_algorithm
    from tianjax.config import load_config
    from tianjax.core.distributions import Gaussian
    from tianjax.envs.factory import env_spec

    config = load_config("configs/ppo_lunarlander_continuous.yaml")
    assert (config.env, config.env_backend, config.algo, config.target_return) == (
        "LunarLanderContinuous-v2",
        "envpool",
        "ppo",
        200,
    )
    obs_shape, obs_dtype, spec = env_spec(config)
    assert tuple(obs_shape) == (8,) and np.dtype(obs_dtype) == np.float32
    assert not spec.discrete and spec.shape == (2,)
    np.testing.assert_array_equal(spec.low, [-1, -1])
    np.testing.assert_array_equal(spec.high, [1, 1])
    algo = make_algorithm(config, obs_shape, spec, obs_dtype=obs_dtype)
    params = jax.jit(algo.init)(jax.random.key(0)).params
    dist, value = algo.network.apply(params, np.zeros((3, 8), np.float32))
    assert isinstance(dist, Gaussian) and dist.mean.shape == (3, 2) and value.shape == (3,)
    out = jax.jit(algo.act)(params, np.zeros((3, 8), np.float32), jax.random.key(1), 0)
    assert out.action.shape == (3, 2) and out.log_prob.shape == (3,)
