"""GAE and V-trace against hand-computed values and a loop-by-loop reference of the paper."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tianjax.core import returns


@pytest.fixture(params=[False, True], ids=["eager", "jit"])
def maybe_jit(request):
    return jax.jit if request.param else (lambda f, **kw: f)


# ----------------------------------------------------------------------------- GAE


def test_gae_hand_computed_with_done_in_the_middle(maybe_jit):
    # gamma = 0.9, lambda = 0.8 (gamma * lambda = 0.72); the episode ends after step 1.
    r_t = jnp.array([1.0, 2.0, 1.0, 1.0])
    discount_t = jnp.array([0.9, 0.0, 0.9, 0.9])
    v_tm1 = jnp.array([0.5, 1.0, 2.0, 1.5])
    v_t = jnp.array([1.0, 7.0, 1.5, 3.0])  # 7.0 is the next episode's start: must not leak
    # delta = r + discount * v_t - v_tm1
    #   d0 = 1 + 0.9 * 1.0 - 0.5 = 1.4
    #   d1 = 2 + 0.0 * 7.0 - 1.0 = 1.0
    #   d2 = 1 + 0.9 * 1.5 - 2.0 = 0.35
    #   d3 = 1 + 0.9 * 3.0 - 1.5 = 2.2
    # A3 = 2.2; A2 = 0.35 + 0.72 * 2.2 = 1.934; A1 = 1.0 (done cuts the trace);
    # A0 = 1.4 + 0.72 * 1.0 = 2.12
    expected = np.array([2.12, 1.0, 1.934, 2.2])
    gae = maybe_jit(returns.gae, static_argnums=2)
    adv = gae(r_t, discount_t, 0.8, v_tm1, v_t)
    np.testing.assert_allclose(np.asarray(adv), expected, rtol=1e-6, atol=1e-6)


def test_gae_lambda_zero_is_td_error(maybe_jit):
    r_t = jnp.array([1.0, 0.0, 3.0])
    discount_t = jnp.array([0.5, 0.5, 0.0])
    v_tm1 = jnp.array([1.0, 2.0, 3.0])
    v_t = jnp.array([2.0, 3.0, 9.0])
    # lambda = 0: A = delta = [1 + 1 - 1, 0 + 1.5 - 2, 3 + 0 - 3]
    gae = maybe_jit(returns.gae, static_argnums=2)
    adv = gae(r_t, discount_t, 0.0, v_tm1, v_t)
    np.testing.assert_allclose(np.asarray(adv), [1.0, -0.5, 0.0], atol=1e-6)


def test_traced_gae_hand_computed_cuts_traces_by_the_next_steps_ratio(maybe_jit):
    # the first test's deltas [1.4, 1.0, 0.35, 2.2], gamma * lambda = 0.72 where not done;
    # c_t[s] is the trace coefficient of step s+1: c_1 = 0.5, c_2 = 1 (cut by done
    # anyway), c_3 = 0.25, and the last entry (no step after it) is never used
    r_t = jnp.array([1.0, 2.0, 1.0, 1.0])
    discount_t = jnp.array([0.9, 0.0, 0.9, 0.9])
    v_tm1 = jnp.array([0.5, 1.0, 2.0, 1.5])
    v_t = jnp.array([1.0, 7.0, 1.5, 3.0])
    c_t = jnp.array([0.5, 1.0, 0.25, 0.0])
    # A3 = 2.2; A2 = 0.35 + 0.72 * 0.25 * 2.2 = 0.746; A1 = 1.0; A0 = 1.4 + 0.72 * 0.5 * 1.0 = 1.76
    traced = maybe_jit(returns.traced_gae, static_argnums=2)
    adv = traced(r_t, discount_t, 0.8, v_tm1, v_t, c_t)
    np.testing.assert_allclose(np.asarray(adv), [1.76, 1.0, 0.746, 2.2], rtol=1e-6, atol=1e-6)
    # with every trace whole it is GAE
    np.testing.assert_allclose(
        np.asarray(traced(r_t, discount_t, 0.8, v_tm1, v_t, jnp.ones(4))),
        np.asarray(returns.gae(r_t, discount_t, 0.8, v_tm1, v_t)),
        rtol=1e-6,
    )


# ----------------------------------------------------------------------------- V-trace


def vtrace_reference(v_tm1, v_t, r_t, discount_t, rho, lambda_, rho_bar, c_bar, pg_rho_bar):
    """V-trace as rlax defines it (rlax.vtrace_td_error_and_advantage), written here from its
    definition without the project's helpers: the targets by Espeholt et al. (2018), eq.
    (1), summed literally with per-step discounts,

        v_s = V(x_s) + sum_{t >= s} (prod_{i=s}^{t-1} discount_i * c_i) * delta_t,
        delta_t = min(rho_bar, rho_t) * (r_t + discount_t * V(x_{t+1}) - V(x_t)),
        c_i = lambda * min(c_bar, rho_i),

    and the policy-gradient advantage min(pg_rho_bar, rho_s) * (q_s - V(x_s)) with
    q_s = r_s + discount_s * (lambda * v_{s+1} + (1 - lambda) * V(x_{s+1})) and, at the last
    step, q = r + discount * V(x_T). (rlax 0.1.8's own function matched this module to 6e-8
    on the targets and the advantages at lambda 1, 0.9 and 0.5, run once as an oracle; it
    cannot be a test dependency: its distributions need a tensorflow-probability that this
    JAX cannot import.)
    """
    T = len(r_t)
    v_tm1, v_t, r_t, discount_t, rho = (
        np.asarray(x, np.float64) for x in (v_tm1, v_t, r_t, discount_t, rho)
    )
    vs = np.zeros(T)
    for s in range(T):
        total = v_tm1[s]
        for t in range(s, T):
            coef = 1.0
            for i in range(s, t):
                coef *= discount_t[i] * lambda_ * min(c_bar, rho[i])
            delta = min(rho_bar, rho[t]) * (r_t[t] + discount_t[t] * v_t[t] - v_tm1[t])
            total += coef * delta
        vs[s] = total
    pg = np.zeros(T)
    q = np.zeros(T)
    for s in range(T):
        if s + 1 < T:
            boot = lambda_ * vs[s + 1] + (1.0 - lambda_) * v_tm1[s + 1]
        else:
            boot = v_t[T - 1]
        q[s] = r_t[s] + discount_t[s] * boot
        pg[s] = min(pg_rho_bar, rho[s]) * (q[s] - v_tm1[s])
    return vs, pg, q


def _random_inputs(seed, T, with_dones):
    rng = np.random.default_rng(seed)
    values = rng.normal(size=T + 1).astype(np.float32)
    v_tm1, v_t = values[:-1], values[1:]
    r_t = rng.normal(size=T).astype(np.float32)
    discount_t = np.full(T, 0.95, np.float32)
    if with_dones:
        discount_t[rng.random(T) < 0.25] = 0.0
    # log-normal ratios spread above and below 1, with a few that straddle every clip
    # threshold used below, in random places
    rho = np.exp(rng.normal(scale=1.0, size=T))
    rho[:4] = [0.2, 3.0, 0.6, 2.5]
    rho = rng.permutation(rho).astype(np.float32)
    return v_tm1, v_t, r_t, discount_t, rho


@pytest.mark.parametrize("with_dones", [False, True])
@pytest.mark.parametrize(
    "lambda_,rho_bar,c_bar,pg_rho_bar",
    [
        (1.0, 1.0, 1.0, 1.0),
        (1.0, 1.5, 0.8, 1.2),
        (0.9, 0.7, 1.3, 2.0),
    ],
)
def test_vtrace_matches_loop_reference(maybe_jit, with_dones, lambda_, rho_bar, c_bar, pg_rho_bar):
    for seed in range(3):
        v_tm1, v_t, r_t, discount_t, rho = _random_inputs(seed, 12, with_dones)
        # the ratios straddle every threshold, so each clip is exercised
        assert (rho > max(rho_bar, c_bar, pg_rho_bar)).any() and (
            rho < min(rho_bar, c_bar, pg_rho_bar)
        ).any()
        fn = maybe_jit(
            lambda *a: returns.vtrace(
                *a, lambda_=lambda_, rho_bar=rho_bar, c_bar=c_bar, pg_rho_bar=pg_rho_bar
            )
        )
        out = fn(*(jnp.asarray(x) for x in (v_tm1, v_t, r_t, discount_t, rho)))
        vs_ref, pg_ref, q_ref = vtrace_reference(
            v_tm1, v_t, r_t, discount_t, rho, lambda_, rho_bar, c_bar, pg_rho_bar
        )
        np.testing.assert_allclose(np.asarray(out.errors) + v_tm1, vs_ref, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(np.asarray(out.pg_advantage), pg_ref, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(np.asarray(out.q_estimate), q_ref, rtol=1e-4, atol=1e-4)


def test_vtrace_on_policy_is_n_step_return(maybe_jit):
    # rho = 1, lambda = 1, no clipping: v_s is the n-step return bootstrapped from V(x_T).
    # gamma = 0.9, r = [1, 2, 3], V(x_3) = 10:
    #   v_2 = 3 + 0.9 * 10 = 12;  v_1 = 2 + 0.9 * 12 = 12.8;  v_0 = 1 + 0.9 * 12.8 = 12.52
    # and V(x_0..2) (arbitrary) must not matter.
    v_tm1 = jnp.array([5.0, -3.0, 0.25])
    v_t = jnp.array([-3.0, 0.25, 10.0])
    r_t = jnp.array([1.0, 2.0, 3.0])
    discount_t = jnp.full((3,), 0.9)
    rho = jnp.ones((3,))
    out = maybe_jit(returns.vtrace)(v_tm1, v_t, r_t, discount_t, rho)
    vs = np.asarray(out.errors + v_tm1)
    np.testing.assert_allclose(vs, [12.52, 12.8, 12.0], rtol=1e-6)
    # pg advantage = r_s + gamma * v_{s+1} - V(x_s) = v_s - V(x_s) on-policy
    np.testing.assert_allclose(np.asarray(out.pg_advantage), vs - np.asarray(v_tm1), rtol=1e-6)


def test_vtrace_on_policy_with_termination(maybe_jit):
    # The episode terminates after step 1 (discount 0), a new one runs steps 2-3.
    # gamma = 0.5, r = [1, 1, 4, 2], V(x_4) = 8:
    #   v_3 = 2 + 0.5 * 8 = 6;  v_2 = 4 + 0.5 * 6 = 7;  v_1 = 1 (no bootstrap);  v_0 = 1 + 0.5 * 1 = 1.5
    v_tm1 = jnp.array([0.0, 1.0, 2.0, 3.0])
    v_t = jnp.array([1.0, 100.0, 3.0, 8.0])
    r_t = jnp.array([1.0, 1.0, 4.0, 2.0])
    discount_t = jnp.array([0.5, 0.0, 0.5, 0.5])
    out = maybe_jit(returns.vtrace)(v_tm1, v_t, r_t, discount_t, jnp.ones((4,)))
    np.testing.assert_allclose(np.asarray(out.errors + v_tm1), [1.5, 1.0, 7.0, 6.0], rtol=1e-6)


def test_vtrace_targets_carry_no_gradient():
    v_tm1, v_t, r_t, discount_t, rho = (jnp.asarray(x) for x in _random_inputs(0, 5, False))

    def f(v):
        out = returns.vtrace(v, v_t, r_t, discount_t, rho)
        return jnp.sum(out.errors) + jnp.sum(out.pg_advantage) + jnp.sum(out.q_estimate)

    np.testing.assert_array_equal(np.asarray(jax.grad(f)(v_tm1)), 0.0)
