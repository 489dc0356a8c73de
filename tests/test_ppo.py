import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tianjax.algos import make_algorithm
from tianjax.algos.ppo import PPOBatch, advantages, make_loss
from tianjax.config import load_config
from tianjax.envs.jax_env import make_gymnax
from tianjax.rollout import make_rollout


def _stub_apply(params, obs):
    # obs are sample indices; params hold each sample's logits and value directly
    return params["logits"][obs], params["v"][obs]


PARAMS = {"logits": jnp.array([[0.0, 0.0], [math.log(3.0), 0.0]]), "v": jnp.array([0.5, 2.0])}
BATCH = PPOBatch(
    obs=jnp.array([0, 1]),
    action=jnp.array([0, 0]),
    behaviour_log_prob=jnp.log(jnp.array([0.25, 0.75])),  # ratios 2 and 1
    behaviour_value=jnp.array([0.0, 2.5]),
    advantage=jnp.array([1.0, -1.0]),  # already zero mean, unit std
    target=jnp.array([1.0, 2.0]),
    weight=jnp.ones(2),
)


@pytest.mark.parametrize("jit", [False, True])
def test_ppo_loss_known_values(jit):
    loss_fn = make_loss(_stub_apply, clip_eps=0.2, clip_value=True, vf_coef=0.5, ent_coef=0.01)
    f = jax.jit(loss_fn) if jit else loss_fn
    loss, m = f(PARAMS, BATCH)
    # policy: -min(2 * 1, 1.2 * 1) = -1.2 and -min(1 * -1, 1 * -1) = 1  -> mean -0.1
    assert float(m["policy_loss"]) == pytest.approx(-0.1, abs=1e-6)
    # value: max((0.5-1)^2, (0.2-1)^2) = 0.64 and max(0, (2.3-2)^2) = 0.09 -> 0.5 * 0.365
    assert float(m["value_loss"]) == pytest.approx(0.1825, abs=1e-6)
    ent = (math.log(2) + -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))) / 2
    assert float(m["entropy"]) == pytest.approx(ent, abs=1e-6)
    assert float(loss) == pytest.approx(-0.1 + 0.5 * 0.1825 - 0.01 * ent, abs=1e-6)
    assert float(m["clip_frac"]) == pytest.approx(0.5)


def test_ppo_loss_weights_reweight_samples():
    loss_fn = make_loss(_stub_apply, clip_eps=0.2, clip_value=True, vf_coef=0.5, ent_coef=0.0)
    _, m = loss_fn(PARAMS, BATCH._replace(weight=jnp.array([2.0, 0.0])))
    assert float(m["policy_loss"]) == pytest.approx(-1.2, abs=1e-6)  # (2 * -1.2 + 0) / 2
    assert float(m["value_loss"]) == pytest.approx(0.5 * 0.64, abs=1e-6)


def test_advantages_on_a_trajectory_with_truncation_and_termination():
    # B = 1, T = 3; step 0 truncated (bootstrap value 10), step 1 terminated.
    from tianjax.types import Trajectory

    g, lam = 0.9, 0.5
    traj = Trajectory(
        obs=jnp.zeros((3, 1, 1)), action=jnp.zeros((3, 1), jnp.int32),
        reward=jnp.array([[1.0], [2.0], [3.0]]), done=jnp.array([[True], [True], [False]]),
        bootstrap_value=jnp.array([[10.0], [0.0], [0.0]]),
        behaviour_log_prob=jnp.zeros((3, 1)), behaviour_value=jnp.array([[4.0], [5.0], [6.0]]),
        version=jnp.zeros((3, 1), jnp.int32), last_obs=jnp.zeros((1, 1)))
    adv, target = advantages(traj, jnp.array([7.0]), g, lam)
    a2 = 3 + g * 7 - 6  # bootstraps from the last value
    a1 = 2 - 5  # terminated: no bootstrap
    a0 = 1 + g * 10 - 4  # truncated: bootstraps from V(final obs), nothing leaks from step 1
    np.testing.assert_allclose(adv[:, 0], [a0, a1, a2], rtol=1e-6)
    np.testing.assert_allclose(target[:, 0], [a0 + 4, a1 + 5, a2 + 6], rtol=1e-6)


def _trajectory(cfg):
    env = make_gymnax(cfg.env)
    algo = make_algorithm(cfg, env.obs_shape, env.action_spec)
    init, rollout = make_rollout(env, algo, cfg.num_envs, cfg.rollout_len)
    state = algo.init(jax.random.key(0))
    _, traj, _ = rollout(state.params, state.version, init(jax.random.key(1)))
    return env, state, traj


def test_corrected_update_equals_plain_update_when_nothing_is_stale():
    cfg = load_config("configs/ppo_cartpole.yaml", ["num_envs=4", "rollout_len=16",
                                                    "staleness.schedule=polynomial", "staleness.max_staleness=3"])
    env, state, traj = _trajectory(cfg)
    corrected = make_algorithm(cfg, env.obs_shape, env.action_spec, correct_staleness=True)
    plain = make_algorithm(cfg, env.obs_shape, env.action_spec, correct_staleness=False)
    s1, m1 = jax.jit(corrected.update)(state, traj)
    s2, m2 = jax.jit(plain.update)(state, traj)
    assert float(m1["weight_min"]) == pytest.approx(1.0, abs=1e-5)
    chex.assert_trees_all_close(s1.params, s2.params, atol=1e-5)
    assert int(s1.version) == int(s2.version) == 1


def test_stale_samples_change_the_update():
    cfg = load_config("configs/ppo_cartpole.yaml", ["num_envs=4", "rollout_len=16",
                                                    "staleness.schedule=polynomial", "staleness.power=2"])
    env, state, traj = _trajectory(cfg)
    algo = make_algorithm(cfg, env.obs_shape, env.action_spec)
    half_stale = traj._replace(version=traj.version.at[:, :2].set(-6))  # tau = 6 on two envs
    s_fresh, _ = algo.update(state, traj)
    s_stale, m = algo.update(state, half_stale)
    assert float(m["weight_min"]) < 0.1 < 1.0 < float(m["weight_max"])
    diff = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), s_fresh.params, s_stale.params)
    assert max(jax.tree.leaves(diff)) > 1e-6


def test_update_with_non_finite_batch_is_skipped_and_counted():
    cfg = load_config("configs/ppo_cartpole.yaml", ["num_envs=4", "rollout_len=16"])
    env, state, traj = _trajectory(cfg)
    algo = make_algorithm(cfg, env.obs_shape, env.action_spec)
    bad = traj._replace(reward=traj.reward.at[0, 0].set(jnp.nan))
    new, m = jax.jit(algo.update)(state, bad)
    chex.assert_trees_all_equal(new.params, state.params)
    assert int(new.version) == 0 and int(new.skipped_updates) == 1
    assert float(m["update_skipped"]) == 1.0


def test_update_does_not_retrace():
    cfg = load_config("configs/ppo_cartpole.yaml", ["num_envs=2", "rollout_len=8"])
    env, state, traj = _trajectory(cfg)
    algo = make_algorithm(cfg, env.obs_shape, env.action_spec)
    update = jax.jit(chex.assert_max_traces(algo.update, n=1))
    for _ in range(3):
        state, _ = update(state, traj)
    assert int(state.version) == 3
