"""Each PPO objective of the staleness study against jax.grad of its formula, written here
independently of tianjax.algos.ppo.loss: textbook, decoupled (its entropy and value terms
weighted too), A-3PO's interpolated proximal policy, M2PO's second-moment mask, and the
weights' normalisation over the kept samples only."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tianjax.algos.ppo.loss import make_batch, make_loss, second_moment_mask
from tianjax.config import load_config
from tianjax.core.types import Trajectory
from tianjax.core.update import init_state, make_optimizer

T, B, A = 3, 2, 3
N = T * B
EPS = 0.2


def _apply(params, obs):
    """A linear softmax policy and a linear critic over 2-d observations."""
    return obs @ params["W"], obs @ params["u"]


def _case(*overrides, versions=((2, 5), (4, 5), (0, 5))):
    cfg = load_config(
        None,
        [
            f"num_envs={B}",
            f"rollout_len={T}",
            f"total_env_steps={N}",
            "ppo.num_minibatches=1",
            "ppo.vf_coef=0.5",
            "ppo.ent_coef=0.05",
            "ppo.behaviour_clip=false",
            *overrides,
        ],
    )
    rng = np.random.default_rng(7)
    params = {
        "W": jnp.asarray(rng.normal(size=(2, A)).astype(np.float32)),
        "u": jnp.asarray(rng.normal(size=(2,)).astype(np.float32)),
    }
    obs = jnp.asarray(rng.normal(size=(T, B, 2)).astype(np.float32))
    action = jnp.asarray(rng.integers(0, A, size=(T, B)).astype(np.int32))
    logp0 = np.take_along_axis(
        np.asarray(jax.nn.log_softmax(obs @ params["W"])), np.asarray(action)[..., None], -1
    )[..., 0]
    log_mu = logp0 + np.log(np.array([[3.0, 0.5], [1.0, 1 / 3], [2.0, 1.2]], np.float32))
    traj = Trajectory(
        obs=obs,
        action=action,
        reward=jnp.asarray(rng.normal(size=(T, B)).astype(np.float32)),
        done=jnp.zeros((T, B), bool),
        bootstrap_value=jnp.zeros((T, B)),
        behaviour_log_prob=jnp.asarray(log_mu, jnp.float32),
        behaviour_value=jnp.asarray(rng.normal(size=(T, B)).astype(np.float32)),
        version=jnp.array(versions, jnp.int32),
        last_obs=jnp.asarray(rng.normal(size=(B, 2)).astype(np.float32)),
        trunc_obs=jnp.zeros((B, 2)),
        trunc_t=jnp.full((B,), -1, jnp.int32),
    )
    state = init_state(params, make_optimizer(1e-3, 1.0), jax.random.key(0), version=5)
    return cfg, params, traj, state


def _flat(batch):
    return jax.tree.map(lambda x: x.reshape((N,) + x.shape[2:]), batch)


def _loss(cfg, correction="decoupled"):
    c = cfg.ppo
    return make_loss(
        _apply,
        clip_eps=c.clip_eps,
        clip_value=c.clip_value,
        vf_coef=c.vf_coef,
        ent_coef=c.ent_coef,
        correction=correction,
        rho_bar=cfg.staleness.rho_bar,
        m2_threshold=c.m2_threshold,
    )


def _terms(p, b):
    """log pi_theta(a|s), V_theta(s) and H(pi_theta(.|s)) of the flat batch, by hand."""
    logits = b.obs @ p["W"]
    logp_all = jax.nn.log_softmax(logits)
    logp = jnp.take_along_axis(logp_all, b.action[:, None], -1)[:, 0]
    ent = -jnp.sum(jnp.exp(logp_all) * logp_all, -1)
    return logp, b.obs @ p["u"], ent


def _value_term(v, b):
    vc = b.prox_value + jnp.clip(v - b.prox_value, -EPS, EPS)
    return 0.5 * jnp.maximum((v - b.target) ** 2, (vc - b.target) ** 2)


def _assert_grads(loss_fn, formula, params, b):
    theta = jax.tree.map(lambda x: x + 0.07, params)  # away from theta_0 too
    for p in (params, theta):
        got = jax.grad(lambda q: loss_fn(q, b)[0])(p)
        want = jax.grad(formula)(p)
        for k in ("W", "u"):
            np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-6)
        assert float(loss_fn(p, b)[0]) == pytest.approx(float(formula(p)), rel=1e-5, abs=1e-6)


def test_textbook_is_ratio_and_clip_against_mu_with_the_behaviour_critic_and_weights_one():
    cfg, params, traj, state = _case()
    b = _flat(make_batch(_apply, cfg, state, traj, correct_staleness=False))
    np.testing.assert_array_equal(b.weight, np.ones(N))
    np.testing.assert_allclose(b.prox_log_prob, traj.behaviour_log_prob.reshape(-1))
    np.testing.assert_allclose(b.prox_value, traj.behaviour_value.reshape(-1))
    log_mu = traj.behaviour_log_prob.reshape(-1)

    def formula(p):
        logp, v, ent = _terms(p, b)
        r = jnp.exp(logp - log_mu)
        pg = -jnp.minimum(r * b.advantage, jnp.clip(r, 1 - EPS, 1 + EPS) * b.advantage)
        return jnp.mean(pg + 0.5 * _value_term(v, b) - 0.05 * ent)

    _assert_grads(_loss(cfg), formula, params, b)


def test_decoupled_weights_every_term_entropy_included():
    """w_i multiplies the policy, value and entropy terms: with unequal weights an
    unweighted entropy (or value) term changes the gradient."""
    cfg, params, traj, state = _case(
        "staleness.schedule=polynomial", "staleness.power=1.0", "ppo.ent_coef=0.5"
    )
    b = _flat(make_batch(_apply, cfg, state, traj, correct_staleness=True))
    w = b.weight
    assert float(jnp.max(w) - jnp.min(w)) > 0.5  # unequal weights: the case can tell

    def formula(p):
        logp, v, ent = _terms(p, b)
        r = jnp.exp(logp - b.prox_log_prob)
        pg = -jnp.minimum(r * b.advantage, jnp.clip(r, 1 - EPS, 1 + EPS) * b.advantage)
        return jnp.mean(w * (pg + 0.5 * _value_term(v, b) - 0.5 * ent))

    _assert_grads(_loss(cfg), formula, params, b)

    def unweighted_entropy(p):
        logp, v, ent = _terms(p, b)
        r = jnp.exp(logp - b.prox_log_prob)
        pg = -jnp.minimum(r * b.advantage, jnp.clip(r, 1 - EPS, 1 + EPS) * b.advantage)
        return jnp.mean(w * (pg + 0.5 * _value_term(v, b))) - 0.5 * jnp.mean(ent)

    # the two differ by far more than the tolerance above: an unweighted entropy would fail
    gap = jax.grad(formula)(params)["W"] - jax.grad(unweighted_entropy)(params)["W"]
    assert float(jnp.max(jnp.abs(gap))) > 1e-3


def test_weights_are_normalised_over_the_kept_samples_only():
    """Samples staler than max_staleness get weight 0, and the rest mean 1 over the kept:
    sum w = n_kept, not N."""
    cfg, params, traj, state = _case(
        "staleness.schedule=polynomial", "staleness.power=1.0", "staleness.max_staleness=3"
    )
    b = _flat(make_batch(_apply, cfg, state, traj, correct_staleness=True))
    tau = np.array([[3, 0], [1, 0], [5, 0]]).reshape(-1)
    kept = tau <= 3
    logp0 = np.asarray(_terms(params, b)[0], np.float64)
    rho = np.minimum(1.0, np.exp(logp0 - np.asarray(traj.behaviour_log_prob).reshape(-1)))
    raw = np.where(kept, rho / (1.0 + tau), 0.0)
    w = raw * kept.sum() / raw.sum()
    np.testing.assert_allclose(b.weight, w, rtol=1e-5)
    assert float(jnp.sum(b.weight)) == pytest.approx(kept.sum(), rel=1e-5)
    np.testing.assert_array_equal(b.kept, kept.astype(np.float32))


def test_a3po_interpolates_the_proximal_policy_by_version():
    cfg, params, traj, state = _case("ppo.correction=a3po")
    b = _flat(make_batch(_apply, cfg, state, traj, correct_staleness=True))
    log_mu = traj.behaviour_log_prob.reshape(-1)
    np.testing.assert_allclose(b.prox_log_prob, log_mu)  # the loss interpolates from mu
    tau = jnp.array([[3, 0], [1, 0], [5, 0]], jnp.float32).reshape(-1)
    np.testing.assert_array_equal(b.tau, tau)
    np.testing.assert_allclose(b.weight, np.ones(N), rtol=1e-6)  # constant w(tau), normalised

    def formula(p):
        logp, v, ent = _terms(p, b)
        alpha = tau / (tau + 1.0)  # (v_prox - v_mu) / (v_theta - v_mu), v_theta = V + 1
        log_prox = log_mu + alpha * (jax.lax.stop_gradient(logp) - log_mu)
        iw = jax.lax.stop_gradient(jnp.minimum(1.0, jnp.exp(log_prox - log_mu)))
        r = jnp.exp(logp - log_prox)
        pg = -jnp.minimum(r * b.advantage, jnp.clip(r, 1 - EPS, 1 + EPS) * b.advantage)
        return jnp.mean(b.weight * iw * (pg + 0.5 * _value_term(v, b) - 0.05 * ent))

    _assert_grads(_loss(cfg, "a3po"), formula, params, b)
    # fresh samples (tau 0): pi_prox = mu, so the ratio is pi_theta / mu
    assert float(jnp.max(jnp.abs(tau[1::2]))) == 0.0


def test_m2po_mask_keeps_the_smallest_second_moments_within_the_threshold():
    # (log r)^2 = 0.01, 0.25, 0.0025, 0.09: prefix means of the sorted values 0.0025,
    # 0.00625, 0.034, 0.088 -> the three smallest are kept at 0.04
    log_r = jnp.array([0.1, 0.5, -0.05, 0.3])
    np.testing.assert_array_equal(second_moment_mask(log_r, 0.04), [1, 0, 1, 1])
    np.testing.assert_array_equal(second_moment_mask(log_r, 0.005), [0, 0, 1, 0])
    np.testing.assert_array_equal(second_moment_mask(log_r, 1.0), [1, 1, 1, 1])
    np.testing.assert_array_equal(second_moment_mask(log_r, 0.001), [0, 0, 0, 0])


def test_m2po_is_the_masked_unclipped_ratio_against_mu():
    cfg, params, traj, state = _case("ppo.correction=m2po", "ppo.m2_threshold=0.3")
    b = _flat(make_batch(_apply, cfg, state, traj, correct_staleness=True))
    log_mu = traj.behaviour_log_prob.reshape(-1)
    np.testing.assert_allclose(b.prox_log_prob, log_mu)
    # the case's (log pi_0/mu)^2: 1.21, 0.48, 0, 1.21, 0.48, 0.03; sorted prefix means 0,
    # 0.017, 0.17, 0.25, 0.44, 0.57 -> at 0.3 the four smallest are kept, both 1.21 masked
    lr0 = np.asarray(_terms(params, b)[0]) - np.asarray(log_mu)
    m2 = lr0**2
    keep = (m2 < 1.0).astype(np.float32)
    assert keep.sum() == 4 and m2[keep > 0].mean() <= 0.3 < m2.mean()

    def formula(p):
        logp, v, ent = _terms(p, b)
        r = jnp.exp(logp - log_mu)
        return jnp.mean(b.weight * (-mask * r * b.advantage + 0.5 * _value_term(v, b) - 0.05 * ent))

    mask = jnp.asarray(keep, jnp.float32)
    loss_fn = _loss(cfg, "m2po")
    got = jax.grad(lambda q: loss_fn(q, b)[0])(params)
    want = jax.grad(formula)(params)
    np.testing.assert_allclose(got["W"], want["W"], rtol=1e-4, atol=1e-6)
    assert float(loss_fn(params, b)[1]["m2_masked_frac"]) == pytest.approx(2 / 6)


def test_behaviour_clip_is_for_the_decoupled_correction_only():
    from tianjax.config import ConfigError

    with pytest.raises(ConfigError, match="ppo.behaviour_clip"):
        load_config(None, ["ppo.correction=m2po", "ppo.behaviour_clip=true"])
    with pytest.raises(ConfigError, match="ppo.correction"):
        load_config(None, ["ppo.correction=vtrace"])
    cfg = load_config(None, ["ppo.correction=a3po"])
    assert dataclasses.replace(cfg.ppo, correction="m2po").correction == "m2po"


def _one_update(cfg, traj):
    """(params before, params after, metrics) of one PPO update of `cfg` on `traj`, from the
    params of seed 0 at learner version 5."""
    from tianjax.algos.ppo.loss import make
    from tianjax.core.types import ActionSpec

    algo = make(cfg, (2,), ActionSpec(discrete=True, num_actions=A))
    state = algo.init(jax.random.key(0))._replace(version=jnp.asarray(5, jnp.int32))
    new, metrics = algo.update(state, traj)
    return state.params, new.params, metrics


def _moved(before, after) -> float:
    return sum(
        float(jnp.sum(jnp.abs(a - b)))
        for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(before), strict=True)
    )


def _assert_same_params(p, q, rtol=1e-5):
    for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(q), strict=True):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=1e-7)


def test_a_constant_loss_weight_does_not_change_adams_step():
    """Why staleness.scale_lr exists: a batch whose samples are all tau = 4 old, weighted
    (1 + 4)^-1/2 unnormalised, takes the same step as with weights 1 (Adam divides a
    gradient scaled by a constant by the same constant, up to its eps, which matters for
    the smallest gradients; the gradient norm clip is off here, where it would bind on one
    scale and not the other)."""
    base = (
        "staleness.schedule=polynomial",
        "staleness.power=0.5",
        "ppo.lr=1e-2",
        "ppo.max_grad_norm=1e6",
    )
    four = ((1, 1), (1, 1), (1, 1))  # every sample of version 1 at learner version 5
    cfg_raw, _, traj, _ = _case(*base, "staleness.normalise=false", versions=four)
    cfg_norm, *_ = _case(*base, versions=four)
    before, unnormalised, _ = _one_update(cfg_raw, traj)
    _, normalised, _ = _one_update(cfg_norm, traj)
    # the same size of step within 10%, where a step scaled by the weight would be 0.45
    ratio = _moved(before, unnormalised) / _moved(before, normalised)
    assert ratio == pytest.approx(1, abs=0.1)


def test_scale_lr_puts_the_batch_mean_schedule_weight_on_the_step():
    """staleness.scale_lr: the update equals the unscaled one at lr * mean_i (1 + tau_i)^-1/2,
    tau = 3, 0, 1, 0, 5, 0 in _case, and Adam's first step (lr * sign(g), up to eps) is
    smaller than the unscaled one by that factor."""
    base = ("staleness.schedule=polynomial", "staleness.power=0.5", "ppo.anneal_lr=false")
    cfg, _, traj, _ = _case(*base, "ppo.lr=1e-2", "staleness.scale_lr=true")
    scale = float(np.mean((1 + np.array([3, 0, 1, 0, 5, 0], np.float64)) ** -0.5))
    assert scale == pytest.approx((0.5 + 3 + 2**-0.5 + 6**-0.5) / 6)  # 0.7692
    before, scaled, metrics = _one_update(cfg, traj)
    assert float(metrics["lr"]) == pytest.approx(1e-2 * scale, rel=1e-6)
    _, by_lr, _ = _one_update(_case(*base, f"ppo.lr={1e-2 * scale!r}")[0], traj)
    _assert_same_params(scaled, by_lr)
    _, plain, _ = _one_update(_case(*base, "ppo.lr=1e-2")[0], traj)
    assert _moved(before, scaled) / _moved(before, plain) == pytest.approx(scale, rel=0.05)
