"""IMPALA: the V-trace loss against a numpy reference, staleness equivalence, the update."""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tianjax.algos import make_algorithm
from tianjax.algos.impala import loss as impala
from tianjax.config import load_config
from tianjax.core import distributions as D
from tianjax.core import staleness as S
from tianjax.core.types import ActionSpec, Trajectory

T, B, OBS = 6, 4, (4,)
DISCRETE = ActionSpec(discrete=True, num_actions=3)


@pytest.fixture(params=[False, True], ids=["eager", "jit"])
def maybe_jit(request):
    return jax.jit if request.param else (lambda f: f)


def make_config(**impala_kw):
    return load_config(
        {
            "algo": "impala",
            "num_envs": B,
            "rollout_len": T,
            "total_env_steps": 100 * T * B,
            "network": {"hidden": [16, 16]},
            "impala": {
                "gamma": 0.9,
                "rho_bar": 1.2,
                "c_bar": 0.9,
                "pg_rho_bar": 1.1,
                "ent_coef": 0.05,
                "lr": 1e-2,
                "anneal_lr": False,
                **impala_kw,
            },
            # a non-trivial schedule: fresh samples must still weigh exactly 1
            "staleness": {"schedule": "polynomial", "power": 1.0, "max_staleness": 3},
        }
    )


@functools.lru_cache(maxsize=None)
def jitted(num_minibatches=1, correct_staleness=True):
    """(algo, jitted update), built once per variant: compiling is the slow part here."""
    algo = impala.make(
        make_config(num_minibatches=num_minibatches),
        OBS,
        DISCRETE,
        correct_staleness=correct_staleness,
    )
    return algo, jax.jit(algo.update)


def random_traj(algo, params, seed=0, version=0, action_spec=DISCRETE):
    """An off-policy [T, B] trajectory: behaviour log-probs are the current policy's plus
    noise, so the ratios pi / mu straddle 1 and the clip thresholds."""
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(T, B) + OBS).astype(np.float32)
    if action_spec.discrete:
        action = rng.integers(0, action_spec.num_actions, size=(T, B)).astype(np.int32)
    else:
        action = rng.normal(size=(T, B) + action_spec.shape).astype(np.float32)
    dist, _ = algo.network.apply(params, jnp.asarray(obs))
    log_pi = np.asarray(D.log_prob(dist, jnp.asarray(action)))
    done = rng.random((T, B)) < 0.25
    truncated = done & (rng.random((T, B)) < 0.5)
    return Trajectory(
        obs=jnp.asarray(obs),
        action=jnp.asarray(action),
        reward=jnp.asarray(rng.normal(size=(T, B)).astype(np.float32)),
        done=jnp.asarray(done),
        bootstrap_value=jnp.asarray(
            np.where(truncated, rng.normal(size=(T, B)), 0.0).astype(np.float32)
        ),
        behaviour_log_prob=jnp.asarray(
            (log_pi + rng.normal(scale=0.7, size=(T, B))).astype(np.float32)
        ),
        behaviour_value=jnp.asarray(rng.normal(size=(T, B)).astype(np.float32)),
        version=jnp.full((T, B), version, jnp.int32),
        last_obs=jnp.asarray(rng.normal(size=(B,) + OBS).astype(np.float32)),
        trunc_obs=jnp.zeros((B,) + OBS, jnp.float32),
        trunc_t=jnp.full((B,), -1, jnp.int32),
    )


def vtrace_reference(v_tm1, v_t, r_t, discount_t, rho, rho_bar, c_bar, pg_rho_bar):
    """Espeholt et al. (2018), eq. (1) with lambda = 1, literally (per-step discounts for gamma)."""
    n = len(r_t)
    vs = np.array(v_tm1, np.float64)
    for s in range(n):
        for t in range(s, n):
            coef = np.prod([discount_t[i] * min(c_bar, rho[i]) for i in range(s, t)])
            vs[s] += coef * min(rho_bar, rho[t]) * (r_t[t] + discount_t[t] * v_t[t] - v_tm1[t])
    vs_next = np.append(vs[1:], v_t[-1])
    pg = np.minimum(pg_rho_bar, rho) * (r_t + discount_t * vs_next - v_tm1)
    return vs, pg


def reference_loss(algo, params, traj, weight, cfg):
    """The IMPALA loss computed column by column in numpy (float64)."""
    dist, values = algo.network.apply(params, traj.obs)
    _, last_value = algo.network.apply(params, traj.last_obs)
    log_pi = np.asarray(D.log_prob(dist, traj.action), np.float64)
    ent = np.asarray(D.entropy(dist), np.float64)
    values = np.asarray(values, np.float64)
    last_value = np.asarray(last_value, np.float64)
    rho = np.exp(log_pi - np.asarray(traj.behaviour_log_prob, np.float64))
    r = np.asarray(traj.reward, np.float64) + cfg.gamma * np.asarray(
        traj.bootstrap_value, np.float64
    )
    disc = cfg.gamma * (1.0 - np.asarray(traj.done, np.float64))
    w = np.asarray(weight, np.float64)
    vs = np.zeros_like(values)
    pg = np.zeros_like(values)
    for b in range(values.shape[1]):
        v_t = np.append(values[1:, b], last_value[b])
        vs[:, b], pg[:, b] = vtrace_reference(
            values[:, b],
            v_t,
            r[:, b],
            disc[:, b],
            rho[:, b],
            cfg.rho_bar,
            cfg.c_bar,
            cfg.pg_rho_bar,
        )
    policy_loss = -np.mean(w * pg * log_pi)
    value_loss = 0.5 * np.mean(w * (vs - values) ** 2)
    entropy = np.mean(w * ent)
    loss = policy_loss + cfg.vf_coef * value_loss - cfg.ent_coef * entropy
    return dict(
        loss=loss,
        policy_loss=policy_loss,
        value_loss=value_loss,
        entropy=entropy,
        rho_mean=rho.mean(),
    )


# ----------------------------------------------------------------------------- the loss


@pytest.mark.parametrize("uniform_weight", [True, False])
def test_loss_matches_numpy_reference(maybe_jit, uniform_weight):
    config = make_config()
    algo = impala.make(config, OBS, DISCRETE)
    params = algo.init(jax.random.key(0)).params
    traj = random_traj(algo, params, seed=1)
    rho = np.exp(
        np.asarray(D.log_prob(algo.network.apply(params, traj.obs)[0], traj.action))
        - np.asarray(traj.behaviour_log_prob)
    )
    assert (rho > 1.2).any() and (rho < 0.9).any()  # every clip is exercised
    rng = np.random.default_rng(2)
    weight = (
        jnp.ones((T, B)) if uniform_weight else jnp.asarray(rng.uniform(0, 2, (T, B)), jnp.float32)
    )

    loss, metrics = maybe_jit(algo.loss_fn)(params, traj, weight)
    ref = reference_loss(algo, params, traj, weight, config.impala)
    np.testing.assert_allclose(float(loss), ref["loss"], rtol=1e-4, atol=1e-5)
    for k in ("policy_loss", "value_loss", "entropy", "rho_mean"):
        np.testing.assert_allclose(float(metrics[k]), ref[k], rtol=1e-4, atol=1e-5, err_msg=k)
    assert all(jnp.ndim(v) == 0 for v in metrics.values())


def test_value_gradient_flows_only_through_values():
    """The targets are constants: d value_loss / d V(x_s) = w_s * (V(x_s) - v_s) / (T B)."""
    algo = impala.make(make_config(), OBS, DISCRETE)
    traj = random_traj(algo, algo.init(jax.random.key(0)).params, seed=3)
    # A single-row "network": values are free parameters, the policy is fixed.
    apply_fn = lambda p, obs: (
        jnp.zeros(obs.shape[:-1] + (3,)),  # noqa: E731
        p["v"] if obs.ndim == 3 else p["last"],
    )
    loss_fn = impala.make_loss(
        apply_fn, gamma=0.9, rho_bar=1.0, c_bar=1.0, pg_rho_bar=1.0, vf_coef=1.0, ent_coef=0.0
    )
    p = {
        "v": jnp.asarray(np.random.default_rng(0).normal(size=(T, B)), jnp.float32),
        "last": jnp.zeros((B,), jnp.float32),
    }
    w = jnp.asarray(np.random.default_rng(1).uniform(0.5, 1.5, (T, B)), jnp.float32)

    def value_loss(p):
        return loss_fn(p, traj, w)[1]["value_loss"]

    g = jax.grad(value_loss)(p)
    v_t = np.vstack([np.asarray(p["v"])[1:], np.asarray(p["last"])[None]])
    vs = np.zeros((T, B))
    rho = np.exp(-np.asarray(traj.behaviour_log_prob) + np.log(1 / 3))
    r = np.asarray(traj.reward) + 0.9 * np.asarray(traj.bootstrap_value)
    disc = 0.9 * (1 - np.asarray(traj.done, np.float64))
    for b in range(B):
        vs[:, b], _ = vtrace_reference(
            np.asarray(p["v"])[:, b], v_t[:, b], r[:, b], disc[:, b], rho[:, b], 1.0, 1.0, 1.0
        )
    expected = np.asarray(w) * (np.asarray(p["v"]) - vs) / (T * B)
    np.testing.assert_allclose(np.asarray(g["v"]), expected, rtol=1e-4, atol=1e-6)
    # the bootstrap value only enters the targets: no gradient
    np.testing.assert_array_equal(np.asarray(g["last"]), 0.0)


def test_vtrace_by_hand_with_time_limit_cuts_inside_the_trajectories():
    """V-trace targets v_s and policy-gradient advantages, per step, on a hand-worked case
    with time-limit truncations inside the rollout (trunc_t >= 0).

    A table "network": obs are row indices, values V free parameters, logits 0 (pi = 1/2
    over 2 actions), so rho = (1/2) / mu. gamma 0.9, rho_bar 1.5, c_bar 1, pg_rho_bar 1.2.
    The per-step values are read from the real loss's gradients:
    d value_loss / d V(x_s) = -(v_s - V(x_s)) / N and
    d policy_loss / d logit(x_s, a_s) = -pg_s (1 - pi(a_s)) / N, with N = T B = 8.

    env 0: cut by the time limit after step 1 (trunc_t 1). Its bootstrap is the learner's
      V(trunc_obs) = 10, not the actor's stale 99, and nothing leaks from step 2.
      V = [1, 2, 3, 4], V(last) = 5, r = [1, 0, -1, 2], rho = [2, 0.5, 1, 1.5]
      r' = r + gamma boot = [1, 9, -1, 2], discount = [.9, 0, .9, .9]
      v_3 = 4 + 1.5 (2 + .9*5 - 4)                    = 7.75
      v_2 = 3 + 1 (-1 + .9*4 - 3) + .9*1 (7.75 - 4)   = 5.975
      v_1 = 2 + .5 (9 - 2)                            = 5.5
      v_0 = 1 + 1.5 (1 + .9*2 - 1) + .9*1 (5.5 - 2)   = 6.85
      pg  = [1.2 (1 + .9*5.5 - 1), .5 (9 - 2), 1 (-1 + .9*7.75 - 3), 1.2 (2 + .9*5 - 4)]
          = [5.94, 3.5, 2.975, 3.0]
    env 1: two cuts: after step 0 (an earlier one: the actor's bootstrap 7 is kept) and
      after step 2 (the last one, trunc_t 2: the learner's V(trunc_obs) = -2, not the 50
      the actor stored).
      V = [2, -1, .5, 1], V(last) = 3, r = [.5, 1, 2, -1], rho = [1, 1.5, .8, .5]
      r' = [.5 + .9*7, 1, 2 + .9*(-2), -1] = [6.8, 1, .2, -1], discount = [0, .9, 0, .9]
      v_3 = 1 + .5 (-1 + .9*3 - 1)                     = 1.35
      v_2 = .5 + .8 (.2 - .5)                          = .26
      v_1 = -1 + 1.5 (1 + .9*.5 + 1) + .9*1 (.26 - .5) = 2.459
      v_0 = 2 + 1 (6.8 - 2)                            = 6.8
      pg  = [1 (6.8 - 2), 1.2 (1 + .9*.26 + 1), .8 (.2 - .5), .5 (-1 + .9*3 - 1)]
          = [4.8, 2.6808, -.24, .35]
    """
    T_, B_ = 4, 2
    values = np.array([[1, 2, 3, 4], [2, -1, 0.5, 1]], np.float32).T  # [T, B]
    table_v = np.concatenate([values.reshape(-1), [5.0, 3.0], [10.0, -2.0]]).astype(np.float32)
    obs = np.arange(T_ * B_).reshape(T_, B_)  # row t * B + b holds V(x_t) of env b
    rho = np.array([[2, 0.5, 1, 1.5], [1, 1.5, 0.8, 0.5]]).T
    traj = Trajectory(
        obs=jnp.asarray(obs),
        action=jnp.asarray(np.array([[0, 1], [1, 0], [0, 0], [1, 1]]), jnp.int32),
        reward=jnp.asarray(np.array([[1, 0, -1, 2], [0.5, 1, 2, -1]], np.float32).T),
        done=jnp.asarray(np.array([[False, True, False, False], [True, False, True, False]]).T),
        bootstrap_value=jnp.asarray(np.array([[0, 99, 0, 0], [7, 0, 50, 0]], np.float32).T),
        behaviour_log_prob=jnp.asarray(np.log(0.5 / rho), jnp.float32),
        behaviour_value=jnp.zeros((T_, B_)),
        version=jnp.zeros((T_, B_), jnp.int32),
        last_obs=jnp.array([8, 9]),
        trunc_obs=jnp.array([10, 11]),
        trunc_t=jnp.array([1, 2], jnp.int32),
    )
    loss_fn = impala.make_loss(
        lambda p, o: (p["logits"][o], p["v"][o]),
        gamma=0.9,
        rho_bar=1.5,
        c_bar=1.0,
        pg_rho_bar=1.2,
        vf_coef=1.0,
        ent_coef=0.0,
    )
    params = {"logits": jnp.zeros((12, 2)), "v": jnp.asarray(table_v)}
    g_v = jax.grad(lambda p: loss_fn(p, traj, jnp.ones((T_, B_)))[1]["value_loss"])(params)["v"]
    g_pi = jax.grad(lambda p: loss_fn(p, traj, jnp.ones((T_, B_)))[1]["policy_loss"])(params)[
        "logits"
    ]
    n = T_ * B_
    vs = values - n * np.asarray(g_v)[:n].reshape(T_, B_)
    rows = np.arange(n)
    pg = -n / 0.5 * np.asarray(g_pi)[rows, np.asarray(traj.action).reshape(-1)].reshape(T_, B_)
    np.testing.assert_allclose(vs[:, 0], [6.85, 5.5, 5.975, 7.75], rtol=1e-5)
    np.testing.assert_allclose(vs[:, 1], [6.8, 2.459, 0.26, 1.35], rtol=1e-5)
    np.testing.assert_allclose(pg[:, 0], [5.94, 3.5, 2.975, 3.0], rtol=1e-5)
    np.testing.assert_allclose(pg[:, 1], [4.8, 2.6808, -0.24, 0.35], rtol=1e-5)
    # the bootstrap rows (last and final observations) are targets only: no gradient
    np.testing.assert_array_equal(np.asarray(g_v)[n:], 0.0)
    # the same per-step numbers give the loss's scalars
    loss, m = loss_fn(params, traj, jnp.ones((T_, B_)))
    expected_vs = np.array([[6.85, 5.5, 5.975, 7.75], [6.8, 2.459, 0.26, 1.35]]).T
    np.testing.assert_allclose(float(m["vs_mean"]), expected_vs.mean(), rtol=1e-5)
    np.testing.assert_allclose(
        float(m["value_loss"]), 0.5 * np.mean((expected_vs - values) ** 2), rtol=1e-5
    )
    expected_pg = np.array([[5.94, 3.5, 2.975, 3.0], [4.8, 2.6808, -0.24, 0.35]]).T
    np.testing.assert_allclose(
        float(m["policy_loss"]), -np.mean(expected_pg * np.log(0.5)), rtol=1e-5
    )


def test_zero_weight_samples_do_not_matter():
    config = make_config()
    algo = impala.make(config, OBS, DISCRETE)
    params = algo.init(jax.random.key(0)).params
    traj = random_traj(algo, params, seed=4)
    w = jnp.ones((T, B)).at[:, 2].set(0.0)  # env 2's trajectory dropped
    other = traj._replace(
        reward=traj.reward.at[:, 2].add(100.0),
        behaviour_log_prob=traj.behaviour_log_prob.at[:, 2].add(-1.0),
    )
    g1 = jax.grad(lambda p: algo.loss_fn(p, traj, w)[0])(params)
    g2 = jax.grad(lambda p: algo.loss_fn(p, other, w)[0])(params)
    chex.assert_trees_all_close(g1, g2, rtol=1e-5, atol=1e-7)


# ----------------------------------------------------------------------------- staleness


def test_fresh_staleness_weights_give_the_plain_loss(maybe_jit):
    config = make_config()
    algo = impala.make(config, OBS, DISCRETE)
    params = algo.init(jax.random.key(0)).params
    traj = random_traj(algo, params, seed=5, version=7)
    w, mask = S.staleness_weights(7, traj.version, config.staleness)
    np.testing.assert_array_equal(np.asarray(w), 1.0)
    np.testing.assert_array_equal(np.asarray(mask), 1.0)
    loss_fn = maybe_jit(algo.loss_fn)
    loss_w, m_w = loss_fn(params, traj, w)
    loss_1, m_1 = loss_fn(params, traj, jnp.ones((T, B)))
    assert float(loss_w) == float(loss_1)
    chex.assert_trees_all_equal(m_w, m_1)


@pytest.mark.parametrize("num_minibatches", [1, 2])
def test_fresh_corrected_update_equals_plain_update(num_minibatches):
    """With every sample fresh (tau = 0), the staleness-corrected update is the plain one,
    even though the batch is off-policy (V-trace, not the staleness weights, corrects it)."""
    # jitted only: the loss-level equivalence above is checked eagerly too
    (corrected, up_c), (_plain, up_p) = (
        jitted(num_minibatches, True),
        jitted(num_minibatches, False),
    )
    state = corrected.init(jax.random.key(1))._replace(version=jnp.asarray(5, jnp.int32))
    traj = random_traj(corrected, state.params, seed=6, version=5)
    s_c, m_c = up_c(state, traj)
    s_p, m_p = up_p(state, traj)
    assert float(m_c["weight_min"]) == float(m_c["weight_max"]) == 1.0
    chex.assert_trees_all_close(s_c.params, s_p.params, rtol=1e-6, atol=1e-7)
    chex.assert_trees_all_close(m_c, m_p, rtol=1e-6, atol=1e-7)
    assert int(s_c.version) == int(s_p.version) == 6


def test_stale_samples_change_the_update():
    (corrected, up_c), (_plain, up_p) = jitted(1, True), jitted(1, False)
    state = corrected.init(jax.random.key(1))._replace(version=jnp.asarray(5, jnp.int32))
    traj = random_traj(corrected, state.params, seed=6)
    traj = traj._replace(version=jnp.asarray(np.array([5, 4, 3, 0])[None].repeat(T, 0), jnp.int32))
    s_c, m_c = up_c(state, traj)
    s_p, _ = up_p(state, traj)
    # tau = [0, 1, 2, 5]; w = 1 / (1 + tau) with tau = 5 > max_staleness dropped, renormalised
    w = np.array([1.0, 0.5, 1 / 3, 0.0])
    w = w * 3 / w.sum()
    np.testing.assert_allclose(
        [float(m_c["weight_min"]), float(m_c["weight_max"])], [0.0, w[0]], rtol=1e-6
    )
    diff = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), s_c.params, s_p.params)
    assert max(jax.tree.leaves(diff)) > 1e-6


# ----------------------------------------------------------------------------- the update


def test_split_batch_keeps_whole_trajectories():
    config = make_config()
    algo = impala.make(config, OBS, DISCRETE)
    traj = random_traj(algo, algo.init(jax.random.key(0)).params, seed=7)
    w = jnp.arange(T * B, dtype=jnp.float32).reshape(T, B)
    chunks, wc = impala.split_batch(traj, w, 2)
    assert chunks.obs.shape == (2, T, B // 2) + OBS
    assert chunks.last_obs.shape == (2, B // 2) + OBS
    for k in range(2):
        cols = slice(k * B // 2, (k + 1) * B // 2)
        np.testing.assert_array_equal(
            np.asarray(chunks.reward[k]), np.asarray(traj.reward[:, cols])
        )
        np.testing.assert_array_equal(np.asarray(chunks.obs[k]), np.asarray(traj.obs[:, cols]))
        np.testing.assert_array_equal(
            np.asarray(chunks.last_obs[k]), np.asarray(traj.last_obs[cols])
        )
        np.testing.assert_array_equal(np.asarray(wc[k]), np.asarray(w[:, cols]))


def test_update_is_traced_once_and_learns_the_batch():
    algo, _ = jitted(2, True)
    chex.clear_trace_counter()
    update = jax.jit(chex.assert_max_traces(lambda s, t: algo.update(s, t), n=1))
    state = algo.init(jax.random.key(2))
    traj = random_traj(algo, state.params, seed=8)
    losses = []
    for i in range(30):
        # new values of the same shapes never retrace
        traj = traj._replace(version=jnp.full((T, B), i, jnp.int32))
        _, m = algo.loss_fn(state.params, traj, jnp.ones((T, B)))
        losses.append(float(m["value_loss"]))
        state, metrics = update(state, traj)
        assert int(state.version) == i + 1
        assert float(metrics["update_skipped"]) == 0.0
        assert all(np.isfinite(float(v)) for v in metrics.values())
    assert losses[-1] < 0.5 * losses[0]  # the critic fits the fixed batch


def test_non_finite_batch_is_skipped():
    algo, update = jitted(1, True)
    state = algo.init(jax.random.key(3))
    traj = random_traj(algo, state.params, seed=9)
    bad = traj._replace(reward=traj.reward.at[0, 0].set(jnp.nan))
    new, metrics = update(state, bad)
    assert float(metrics["update_skipped"]) == 1.0
    assert int(new.skipped_updates) == 1 and int(new.version) == int(state.version)
    chex.assert_trees_all_equal(new.params, state.params)


def test_continuous_actions_and_registry():
    spec = ActionSpec(discrete=False, shape=(2,), low=-1.0, high=1.0)
    config = make_config()
    algo = make_algorithm(config, OBS, spec)
    assert algo.name == "impala" and algo.buffer == "onpolicy"
    state = algo.init(jax.random.key(4))
    out = algo.act(state.params, jnp.zeros((B,) + OBS), jax.random.key(5))
    assert out.action.shape == (B, 2) and out.log_prob.shape == (B,) and out.value.shape == (B,)
    assert algo.greedy(state.params, jnp.zeros((B,) + OBS)).shape == (B, 2)
    traj = random_traj(algo, state.params, seed=10, action_spec=spec)
    new, metrics = jax.jit(algo.update)(state, traj)
    assert float(metrics["update_skipped"]) == 0.0 and int(new.version) == 1
