import dataclasses
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tianjax.algos import make_algorithm
from tianjax.algos.ppo.loss import PPOBatch, advantages, make_batch, make_loss, weighted_normalise
from tianjax.config import load_config
from tianjax.core.rollout import make_rollout
from tianjax.core.types import Trajectory
from tianjax.core.update import init_state, make_optimizer
from tianjax.envs.gymnax_env import make_gymnax


def _stub_apply(params, obs):
    # obs are sample indices; params hold each sample's logits and value directly
    return params["logits"][obs], params["v"][obs]


PARAMS = {"logits": jnp.array([[0.0, 0.0], [math.log(3.0), 0.0]]), "v": jnp.array([0.5, 2.0])}
BATCH = PPOBatch(
    obs=jnp.array([0, 1]),
    action=jnp.array([0, 0]),
    prox_log_prob=jnp.log(jnp.array([0.25, 0.75])),  # ratios 2 and 1
    prox_value=jnp.array([0.0, 2.5]),
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


def test_ppo_loss_weights_reweight_samples_and_takes_the_advantages_as_stored():
    loss_fn = make_loss(_stub_apply, clip_eps=0.2, clip_value=True, vf_coef=0.5, ent_coef=0.0)
    batch = BATCH._replace(weight=jnp.array([1.5, 0.5]), advantage=jnp.array([2.0, -0.5]))
    _, m = loss_fn(PARAMS, batch)
    # no renormalisation inside the loss: -min(2 * 2, 1.2 * 2) = -2.4 and -(1 * -0.5) = 0.5
    assert float(m["policy_loss"]) == pytest.approx((1.5 * -2.4 + 0.5 * 0.5) / 2, abs=1e-6)
    assert float(m["value_loss"]) == pytest.approx(0.5 * (1.5 * 0.64 + 0.5 * 0.09) / 2, abs=1e-6)


def test_weighted_normalise_ignores_zero_weight_samples():
    x = jnp.array([1.0, 3.0, 1000.0])
    got = weighted_normalise(x, jnp.array([1.0, 1.0, 0.0]))
    np.testing.assert_allclose(got[:2], [-1.0, 1.0], rtol=1e-6)  # mean 2, std 1 over the kept two
    equal = weighted_normalise(x, jnp.full(3, 0.7))
    np.testing.assert_allclose(equal, (x - x.mean()) / (x.std() + 1e-8), rtol=1e-6)


def test_advantages_on_a_trajectory_with_truncation_and_termination():
    # B = 1, T = 3; step 0 truncated (bootstrap value 10), step 1 terminated.
    g, lam = 0.9, 0.5
    traj = Trajectory(
        obs=jnp.zeros((3, 1, 1)),
        action=jnp.zeros((3, 1), jnp.int32),
        reward=jnp.array([[1.0], [2.0], [3.0]]),
        done=jnp.array([[True], [True], [False]]),
        bootstrap_value=jnp.array([[10.0], [0.0], [0.0]]),
        behaviour_log_prob=jnp.zeros((3, 1)),
        behaviour_value=jnp.array([[4.0], [5.0], [6.0]]),
        version=jnp.zeros((3, 1), jnp.int32),
        last_obs=jnp.zeros((1, 1)),
        trunc_obs=jnp.zeros((1, 1)),
        trunc_t=jnp.array([0], jnp.int32),
    )
    adv, target = advantages(
        traj, traj.behaviour_value, jnp.array([7.0]), traj.bootstrap_value, g, lam
    )
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
    cfg = load_config(
        "configs/ppo_cartpole.yaml",
        [
            "num_envs=4",
            "rollout_len=16",
            "staleness.schedule=polynomial",
            "staleness.max_staleness=3",
        ],
    )
    env, state, traj = _trajectory(cfg)
    corrected = make_algorithm(cfg, env.obs_shape, env.action_spec, correct_staleness=True)
    plain = make_algorithm(cfg, env.obs_shape, env.action_spec, correct_staleness=False)
    s1, m1 = jax.jit(corrected.update)(state, traj)
    s2, m2 = jax.jit(plain.update)(state, traj)
    assert float(m1["weight_min"]) == pytest.approx(1.0, abs=1e-5)
    chex.assert_trees_all_close(s1.params, s2.params, atol=1e-5)
    assert int(s1.version) == int(s2.version) == 1


def test_stale_samples_change_the_update():
    cfg = load_config(
        "configs/ppo_cartpole.yaml",
        ["num_envs=4", "rollout_len=16", "staleness.schedule=polynomial", "staleness.power=2"],
    )
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


# ---------------------------------------------------------------------------- decoupled PPO
# A linear softmax policy and a linear critic over 2-d observations, so that
# grad_W log pi(a|s) = s (e_a - softmax(W^T s))^T is known in closed form.


def _linear_apply(params, obs):
    return obs @ params["W"], obs @ params["u"]


def _wnorm(x, w):
    """(x - mean_w x) / std_w x, in float64, by its formula."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    mean = (w * x).sum() / w.sum()
    return (x - mean) / (np.sqrt((w * (x - mean) ** 2).sum() / w.sum()) + 1e-8)


def _decoupled_case(rho_bar=1.0):
    cfg = load_config(
        None,
        [
            "num_envs=2",
            "rollout_len=3",
            "total_env_steps=6",
            "ppo.num_minibatches=1",
            "staleness.schedule=polynomial",
            "staleness.power=1.0",
            f"staleness.rho_bar={rho_bar}",
            "ppo.vf_coef=0.0",
            "ppo.ent_coef=0.0",
            "ppo.behaviour_clip=false",  # (the tests that want it turn it on)
        ],
    )
    rng = np.random.default_rng(3)
    T, B, A = 3, 2, 3
    params = {
        "W": jnp.asarray(rng.normal(size=(2, A)).astype(np.float32)),
        "u": jnp.asarray(rng.normal(size=(2,)).astype(np.float32)),
    }
    obs = jnp.asarray(rng.normal(size=(T, B, 2)).astype(np.float32))
    action = jnp.asarray(rng.integers(0, A, size=(T, B)).astype(np.int32))
    logp0 = np.take_along_axis(
        np.asarray(jax.nn.log_softmax(obs @ params["W"])), np.asarray(action)[..., None], axis=-1
    )[..., 0]
    # a stale behaviour policy: pi_0 / mu spans 1/3 .. 3, far outside the clip range
    log_mu = logp0 + np.log(np.array([[3.0, 0.5], [1.0, 1 / 3], [2.0, 1.2]], np.float32))
    traj = Trajectory(
        obs=obs,
        action=action,
        reward=jnp.asarray(rng.normal(size=(T, B)).astype(np.float32)),
        done=jnp.zeros((T, B), bool),
        bootstrap_value=jnp.zeros((T, B)),
        behaviour_log_prob=jnp.asarray(log_mu, jnp.float32),
        behaviour_value=jnp.asarray(rng.normal(size=(T, B)).astype(np.float32)),
        version=jnp.array([[2, 5], [4, 5], [0, 5]], jnp.int32),
        last_obs=jnp.asarray(rng.normal(size=(B, 2)).astype(np.float32)),
        trunc_obs=jnp.zeros((B, 2)),
        trunc_t=jnp.full((B,), -1, jnp.int32),
    )
    state = init_state(params, make_optimizer(1e-3, 1.0), jax.random.key(0), version=5)
    return cfg, params, traj, state, np.exp(logp0 - log_mu)


@pytest.mark.parametrize("rho_bar", [1.0, 2.0])
def test_decoupled_gradient_at_theta0_is_the_once_corrected_policy_gradient(rho_bar):
    cfg, params, traj, state, rho = _decoupled_case(rho_bar)
    batch = make_batch(_linear_apply, cfg, state, traj, correct_staleness=True)
    flat = jax.tree.map(lambda x: x.reshape((6,) + x.shape[2:]), batch)
    loss_fn = make_loss(_linear_apply, clip_eps=0.2, clip_value=True, vf_coef=0.0, ent_coef=0.0)
    grad = jax.grad(lambda p: loss_fn(p, flat)[0])(params)["W"]

    # the closed form: -(1/N) sum_i w_i A_i grad log pi(a_i|s_i), w_i the normalised
    # w(tau_i) * min(rho_bar, pi_0/mu)_i and A_i normalised with those weights
    tau = np.array([[3, 0], [1, 0], [5, 0]], np.float64).reshape(-1)
    w = (1.0 + tau) ** -1.0 * np.minimum(rho_bar, rho.reshape(-1))
    w = w * len(w) / w.sum()
    np.testing.assert_allclose(flat.weight, w, rtol=1e-5)
    a_hat = np.asarray(flat.advantage, np.float64)  # normalised with w by make_batch (pinned below)
    assert abs((w * a_hat).sum() / w.sum()) < 1e-5 and (
        w * a_hat**2
    ).sum() / w.sum() == pytest.approx(1, rel=1e-4)
    s = np.asarray(traj.obs, np.float64).reshape(6, 2)
    pi0 = np.asarray(jax.nn.softmax(traj.obs @ params["W"]), np.float64).reshape(6, 3)
    onehot = np.eye(3)[np.asarray(traj.action).reshape(-1)]
    grad_logp = s[:, :, None] * (onehot - pi0)[:, None, :]  # [N, 2, A]
    expected = -np.einsum("i,i,ijk->jk", w, a_hat, grad_logp) / 6
    np.testing.assert_allclose(grad, expected, rtol=1e-4, atol=1e-6)

    # Each sample's own share of the code's gradient (each sample given its own copy of W):
    # it sums to the gradient above, and over the sample's textbook term A_i grad log pi_i / N
    # it gives the weight the code applied to that sample.
    per_sample_apply = lambda p, obs: (jnp.einsum("nj,njk->nk", obs, p["W"]), obs @ p["u"])  # noqa: E731
    per_sample_loss = make_loss(
        per_sample_apply, clip_eps=0.2, clip_value=True, vf_coef=0.0, ent_coef=0.0
    )
    own = {"W": jnp.broadcast_to(params["W"], (6,) + params["W"].shape), "u": params["u"]}
    g_own = np.asarray(
        jax.grad(lambda p: per_sample_loss(p, flat)[0])(own)["W"], np.float64
    )  # [N, 2, A]
    np.testing.assert_allclose(g_own.sum(0), grad, rtol=1e-4, atol=1e-6)
    term = -a_hat[:, None, None] * grad_logp / 6
    w_code = (g_own * term).sum((1, 2)) / (term * term).sum((1, 2))
    # pi_0/mu counted once: w(tau) min(rho_bar, pi_0/mu), not w(tau) (pi_0/mu)^2 (the case
    # tells the two apart)
    np.testing.assert_allclose(w_code, w, rtol=1e-4)
    squared = (1.0 + tau) ** -1.0 * np.minimum(rho_bar, rho.reshape(-1)) * rho.reshape(-1)
    assert np.abs(squared * len(w) / squared.sum() - w).max() > 0.1
    # not zeroed by a clip centred on mu: where pi_0/mu lies outside [0.8, 1.2] the textbook
    # loss (ratio against mu) has no gradient for some of them; the code keeps their share
    far = np.abs(rho.reshape(-1) - 1) > 0.2
    assert far.sum() >= 4
    assert np.all(np.abs(g_own[far]).reshape(far.sum(), -1).max(-1) > 1e-3)


def test_decoupled_loss_equals_plain_ppo_when_mu_is_pi0_and_nothing_is_stale():
    cfg, params, traj, state, _ = _decoupled_case()
    logp0 = np.take_along_axis(
        np.asarray(jax.nn.log_softmax(traj.obs @ params["W"])),
        np.asarray(traj.action)[..., None],
        axis=-1,
    )[..., 0]
    v0 = traj.obs @ params["u"]
    traj = traj._replace(
        behaviour_log_prob=jnp.asarray(logp0),
        behaviour_value=v0,
        version=jnp.full((3, 2), 5, jnp.int32),
    )
    corrected = make_batch(_linear_apply, cfg, state, traj, correct_staleness=True)
    plain = make_batch(_linear_apply, cfg, state, traj, correct_staleness=False)
    chex.assert_trees_all_close(corrected, plain, atol=1e-6)
    loss_fn = make_loss(_linear_apply, clip_eps=0.2, clip_value=True, vf_coef=0.5, ent_coef=0.01)
    flat = jax.tree.map(lambda x: x.reshape((6,) + x.shape[2:]), corrected)
    # plain PPO by its textbook formula at some theta != theta_0, ratio against mu = pi_0
    theta = jax.tree.map(lambda x: x + 0.3, params)
    logits, v = _linear_apply(theta, flat.obs)
    logp = np.take_along_axis(
        np.asarray(jax.nn.log_softmax(logits)), np.asarray(flat.action)[:, None], -1
    )[:, 0]
    r = np.exp(logp - logp0.reshape(-1))
    a = np.asarray(flat.advantage)  # normalised over the batch (every weight 1: the plain way)
    np.testing.assert_allclose([a.mean(), a.std()], [0.0, 1.0], atol=1e-5)
    pg = -np.minimum(r * a, np.clip(r, 0.8, 1.2) * a).mean()
    v_old = np.asarray(v0).reshape(-1)
    vc = v_old + np.clip(np.asarray(v) - v_old, -0.2, 0.2)
    vl = 0.5 * np.maximum((np.asarray(v) - flat.target) ** 2, (vc - flat.target) ** 2).mean()
    p = np.asarray(jax.nn.softmax(logits))
    ent = -(p * np.log(p)).sum(-1).mean()
    loss, _ = loss_fn(theta, flat)
    assert float(loss) == pytest.approx(pg + 0.5 * vl - 0.01 * ent, rel=1e-5)


def test_gae_uses_the_learners_critic_throughout():
    cfg, params, traj, state, _ = _decoupled_case()
    # a truncation at step 1 of env 0, whose final observation is stored
    final = jnp.array([[0.5, -1.0], [0.0, 0.0]])
    traj = traj._replace(
        done=traj.done.at[1, 0].set(True),
        bootstrap_value=traj.bootstrap_value.at[1, 0].set(99.0),
        trunc_obs=final,
        trunc_t=jnp.array([1, -1], jnp.int32),
    )
    batch = make_batch(_linear_apply, cfg, state, traj, correct_staleness=True)
    u = params["u"]
    v0 = traj.obs @ u
    boot = jnp.zeros((3, 2)).at[1, 0].set(final[0] @ u)  # V_0(final obs), not the actor's 99
    adv, target = advantages(traj, v0, traj.last_obs @ u, boot, cfg.ppo.gamma, cfg.ppo.gae_lambda)
    np.testing.assert_allclose(batch.prox_value, v0, rtol=1e-6)
    np.testing.assert_allclose(batch.advantage, _wnorm(adv, batch.weight), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(batch.target, target, rtol=1e-5, atol=1e-6)


def test_truncated_traces_cut_gae_by_the_later_steps_ratio_and_vanish_when_mu_is_pi0():
    cfg, params, traj, state, rho = _decoupled_case()
    cfg_traced = dataclasses.replace(cfg, ppo=dataclasses.replace(cfg.ppo, truncated_traces=True))
    batch = make_batch(_linear_apply, cfg_traced, state, traj, correct_staleness=True)
    u = params["u"]
    v0 = np.asarray(traj.obs @ u, np.float64)
    last = np.asarray(traj.last_obs @ u, np.float64)
    g, lam = cfg.ppo.gamma, cfg.ppo.gae_lambda
    # by hand, per env: A_2 = delta_2; A_s = delta_s + g lam min(1, rho_{s+1}) A_{s+1}
    r = np.asarray(traj.reward, np.float64)
    by_hand = np.zeros((3, 2))
    for b in range(2):
        v_next = np.append(v0[1:, b], last[b])
        delta = r[:, b] + g * v_next - v0[:, b]
        a2 = delta[2]
        a1 = delta[1] + g * lam * min(1.0, rho[2, b]) * a2
        a0 = delta[0] + g * lam * min(1.0, rho[1, b]) * a1
        by_hand[:, b] = [a0, a1, a2]
    np.testing.assert_allclose(batch.advantage, _wnorm(by_hand, batch.weight), rtol=1e-4, atol=1e-5)
    # mu = pi_0: every trace is whole, and the batch is plain GAE's
    logp0 = np.take_along_axis(
        np.asarray(jax.nn.log_softmax(traj.obs @ params["W"])),
        np.asarray(traj.action)[..., None],
        axis=-1,
    )[..., 0]
    on = traj._replace(behaviour_log_prob=jnp.asarray(logp0))
    chex.assert_trees_all_close(
        make_batch(_linear_apply, cfg_traced, state, on, correct_staleness=True),
        make_batch(_linear_apply, cfg, state, on, correct_staleness=True),
        atol=1e-6,
    )


def test_behaviour_clip_zeroes_exactly_the_samples_the_textbook_clip_stops_at_theta0():
    cfg, params, traj, state, rho = _decoupled_case()
    cfg_b = dataclasses.replace(cfg, ppo=dataclasses.replace(cfg.ppo, behaviour_clip=True))
    plain = make_batch(_linear_apply, cfg, state, traj, correct_staleness=True)
    clipped = make_batch(_linear_apply, cfg_b, state, traj, correct_staleness=True)
    # by hand: pi_0 has moved past [0.8, 1.2] from mu in the direction of the sample's
    # batch-normalised advantage (as stored); those samples lose their weight, the others
    # keep it (no renormalisation: the step shrinks as the textbook loss's does)
    w = np.asarray(plain.weight, np.float64)
    a_hat = np.asarray(plain.advantage, np.float64)
    moved = ((a_hat > 0) & (rho > 1.2)) | ((a_hat < 0) & (rho < 0.8))
    assert 0 < moved.sum() < moved.size  # the case has both kinds
    np.testing.assert_allclose(clipped.weight, np.where(moved, 0.0, w), rtol=1e-6)
    np.testing.assert_array_equal(clipped.cut, moved.astype(np.float32))
    chex.assert_trees_all_close(clipped._replace(weight=plain.weight, cut=plain.cut), plain)
    # the gradient at theta_0: the once-corrected policy gradient over the samples kept,
    # nothing from the ones the textbook clip (centred on mu) would stop
    loss_fn = make_loss(_linear_apply, clip_eps=0.2, clip_value=True, vf_coef=0.0, ent_coef=0.0)
    flat = jax.tree.map(lambda x: x.reshape((6,) + x.shape[2:]), clipped)
    grad = jax.grad(lambda p: loss_fn(p, flat)[0])(params)["W"]
    s = np.asarray(traj.obs, np.float64).reshape(6, 2)
    pi0 = np.asarray(jax.nn.softmax(traj.obs @ params["W"]), np.float64).reshape(6, 3)
    onehot = np.eye(3)[np.asarray(traj.action).reshape(-1)]
    grad_logp = s[:, :, None] * (onehot - pi0)[:, None, :]
    wk = np.asarray(flat.weight, np.float64)
    ak = np.asarray(flat.advantage, np.float64)  # as stored: not renormalised over the kept
    expected = -np.einsum("i,i,ijk->jk", wk, ak, grad_logp) / 6
    np.testing.assert_allclose(grad, expected, rtol=1e-4, atol=1e-6)
    # with mu = pi_0 nothing has moved: the batch is the decoupled one, unchanged
    logp0 = np.take_along_axis(
        np.asarray(jax.nn.log_softmax(traj.obs @ params["W"])),
        np.asarray(traj.action)[..., None],
        axis=-1,
    )[..., 0]
    on = traj._replace(behaviour_log_prob=jnp.asarray(logp0))
    chex.assert_trees_all_close(
        make_batch(_linear_apply, cfg_b, state, on, correct_staleness=True),
        make_batch(_linear_apply, cfg, state, on, correct_staleness=True),
        atol=1e-6,
    )


def test_behaviour_clip_eps_sets_the_range_the_behaviour_clip_cuts_beyond():
    cfg, params, traj, state, rho = _decoupled_case()
    plain = make_batch(_linear_apply, cfg, state, traj, correct_staleness=True)
    a_hat = np.asarray(plain.advantage, np.float64)
    for eps_b, want_cut in ((None, 0.2), (0.8, 0.8), (1.5, 1.5)):
        ppo = dataclasses.replace(cfg.ppo, behaviour_clip=True, behaviour_clip_eps=eps_b)
        batch = make_batch(
            _linear_apply, dataclasses.replace(cfg, ppo=ppo), state, traj, correct_staleness=True
        )
        moved = ((a_hat > 0) & (rho > 1 + want_cut)) | ((a_hat < 0) & (rho < 1 - want_cut))
        np.testing.assert_array_equal(batch.cut, moved.astype(np.float32), err_msg=str(eps_b))
    # the case tells the ranges apart: 2, 1 and 0 samples cut
    cuts = [
        int((((a_hat > 0) & (rho > 1 + e)) | ((a_hat < 0) & (rho < 1 - e))).sum())
        for e in (0.2, 0.8, 1.5)
    ]
    assert cuts == [2, 1, 0], cuts


def test_advantages_are_normalised_once_over_the_batch_before_the_mask_and_the_loss_keeps_them():
    cfg, params, traj, state, rho = _decoupled_case()
    cfg = dataclasses.replace(cfg, ppo=dataclasses.replace(cfg.ppo, behaviour_clip=True))
    batch = make_batch(_linear_apply, cfg, state, traj, correct_staleness=True)
    # GAE by hand with V_0 = obs . u (no episode ends in the case), the weights by hand
    g, lam = cfg.ppo.gamma, cfg.ppo.gae_lambda
    v0 = np.asarray(traj.obs @ params["u"], np.float64)
    last = np.asarray(traj.last_obs @ params["u"], np.float64)
    r = np.asarray(traj.reward, np.float64)
    gae = np.zeros((3, 2))
    for b in range(2):
        acc = 0.0
        for t in (2, 1, 0):
            v_next = last[b] if t == 2 else v0[t + 1, b]
            acc = r[t, b] + g * v_next - v0[t, b] + g * lam * acc
            gae[t, b] = acc
    tau = np.array([[3, 0], [1, 0], [5, 0]], np.float64)
    w = (1.0 + tau) ** -1.0 * np.minimum(1.0, rho)
    w = w * w.size / w.sum()
    a_hat = _wnorm(gae, w)  # over all 6 samples, with the weights, before any mask
    moved = ((a_hat > 0) & (rho > 1.2)) | ((a_hat < 0) & (rho < 0.8))
    assert 0 < moved.sum() < moved.size
    np.testing.assert_allclose(batch.advantage, a_hat, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(batch.weight, np.where(moved, 0.0, w), rtol=1e-5)
    np.testing.assert_allclose(batch.target, gae + v0, rtol=1e-5, atol=1e-5)  # before normalisation

    # a minibatch of three samples, one of them dropped: the loss's gradient is the formula's
    # with the stored advantages, at theta_0 and away from it
    flat = jax.tree.map(lambda x: x.reshape((6,) + x.shape[2:]), batch)
    idx = np.array([0, 2, 3])
    mb = jax.tree.map(lambda x: x[idx], flat)
    kw = np.asarray(mb.weight, np.float64)
    assert (kw == 0).sum() == 1
    loss_fn = make_loss(_linear_apply, clip_eps=0.2, clip_value=True, vf_coef=0.0, ent_coef=0.0)
    grad0 = jax.grad(lambda p: loss_fn(p, mb)[0])(params)["W"]
    s = np.asarray(traj.obs, np.float64).reshape(6, 2)[idx]
    pi0 = np.asarray(jax.nn.softmax(traj.obs @ params["W"]), np.float64).reshape(6, 3)[idx]
    onehot = np.eye(3)[np.asarray(traj.action).reshape(-1)[idx]]
    grad_logp = s[:, :, None] * (onehot - pi0)[:, None, :]
    ak = a_hat.reshape(-1)[idx]
    expected = -np.einsum("i,i,ijk->jk", kw, ak, grad_logp) / 3
    np.testing.assert_allclose(grad0, expected, rtol=1e-4, atol=1e-6)
    # renormalising over the minibatch's kept samples (what the mask is not decided on) differs
    kept = kw > 0
    renorm = ak.copy()
    renorm[kept] = _wnorm(ak[kept], kw[kept])
    assert np.abs(-np.einsum("i,i,ijk->jk", kw, renorm, grad_logp) / 3 - expected).max() > 1e-2

    def formula(p):
        logits = mb.obs @ p["W"]
        logp = jnp.take_along_axis(jax.nn.log_softmax(logits), mb.action[:, None], -1)[:, 0]
        ratio = jnp.exp(logp - mb.prox_log_prob)
        a = jnp.asarray(ak, jnp.float32)
        return jnp.mean(
            jnp.asarray(kw, jnp.float32) * -jnp.minimum(ratio * a, jnp.clip(ratio, 0.8, 1.2) * a)
        )

    theta = jax.tree.map(lambda x: x + 0.05, params)
    np.testing.assert_allclose(
        jax.grad(lambda p: loss_fn(p, mb)[0])(theta)["W"],
        jax.grad(formula)(theta)["W"],
        rtol=1e-4,
        atol=1e-6,
    )
