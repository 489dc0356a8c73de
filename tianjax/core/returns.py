"""Return estimators, written for one trajectory [T] and vmapped by the caller.

Names follow rlax: `_tm1` is the value at the step the action was taken from, `_t` the
step after it. `discount_t = gamma * (1 - done_t)`; truncation bootstrapping is folded
into `r_t` by the caller (r_t + gamma * V(final obs)).

- GAE: Schulman et al., "High-Dimensional Continuous Control Using GAE", 2016; with
  truncated importance traces (Retrace, Munos et al., 2016) for a learner policy other
  than the behaviour policy.
- V-trace: Espeholt et al., "IMPALA", 2018, eq. (1) and the policy-gradient advantage;
  with lambda < 1 as rlax defines it (`vtrace_td_error_and_advantage`): the traces are
  c_s = lambda min(c_bar, rho_s), and the action's value estimate bootstraps from the
  lambda-mix of the next state's target and value, q_s = r_s + discount_s (lambda v_{s+1} +
  (1 - lambda) V(x_{s+1})). With lambda = 1 (IMPALA's) both are the paper's.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

Array = jax.Array


def gae(r_t: Array, discount_t: Array, lambda_: float, v_tm1: Array, v_t: Array) -> Array:
    """Generalised advantage estimates A_tm1 [T].

    Args:
      r_t: rewards [T]. discount_t: [T]. v_tm1: V(s_t) [T]. v_t: V(s_{t+1}) [T].
    """
    chex.assert_rank([r_t, discount_t, v_tm1, v_t], 1)
    chex.assert_equal_shape([r_t, discount_t, v_tm1, v_t])
    delta = r_t + discount_t * v_t - v_tm1

    def body(acc, x):
        d, disc = x
        acc = d + disc * lambda_ * acc
        return acc, acc

    _, adv = jax.lax.scan(body, jnp.zeros_like(delta[0]), (delta, discount_t), reverse=True)
    return adv


def traced_gae(
    r_t: Array, discount_t: Array, lambda_: float, v_tm1: Array, v_t: Array, c_t: Array
) -> Array:
    """GAE whose traces are cut by importance ratios, A_tm1 [T]:

        A_s = delta_s + discount_s * lambda * c_{s+1} * A_{s+1},   delta_s = r_s + discount_s V(x_{s+1}) - V(x_s)

    with `c_t` [T] the trace coefficient of the step after each one (c_t[s] = c_{s+1}, e.g.
    min(1, pi(a_{s+1}|x_{s+1}) / mu(a_{s+1}|x_{s+1}))). A_s is the advantage of the action
    taken at s when pi acts from s+1 on: the action at s itself is not reweighted (the
    caller's per-sample weight does that, once), and each later step counts only as far as
    pi would have taken mu's actions (Retrace's truncated traces, Munos et al., 2016). With
    c = 1 it is `gae`.
    """
    chex.assert_rank([r_t, discount_t, v_tm1, v_t, c_t], 1)
    chex.assert_equal_shape([r_t, discount_t, v_tm1, v_t, c_t])
    delta = r_t + discount_t * v_t - v_tm1

    def body(acc, x):
        d, disc, c = x
        acc = d + disc * lambda_ * c * acc
        return acc, acc

    _, adv = jax.lax.scan(body, jnp.zeros_like(delta[0]), (delta, discount_t, c_t), reverse=True)
    return adv


class VTraceOutput(NamedTuple):
    errors: Array  # [T] v_s - V(x_s)
    pg_advantage: Array  # [T] min(pg_rho_bar, rho) * (q_s - V(x_s))
    q_estimate: Array  # [T] q_s = r + discount * (lambda v_{s+1} + (1 - lambda) V(x_{s+1}))


def vtrace(
    v_tm1: Array,
    v_t: Array,
    r_t: Array,
    discount_t: Array,
    rho_tm1: Array,
    lambda_: float = 1.0,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    pg_rho_bar: float = 1.0,
) -> VTraceOutput:
    """V-trace targets and policy-gradient advantages for one trajectory [T].

    Args:
      v_tm1: V(x_s) [T]. v_t: V(x_{s+1}) [T]. r_t: rewards [T]. discount_t: [T].
      rho_tm1: importance ratios pi(a_s|x_s) / mu(a_s|x_s) [T] (not clipped).
    Targets carry no gradient.
    """
    chex.assert_rank([v_tm1, v_t, r_t, discount_t, rho_tm1], 1)
    chex.assert_equal_shape([v_tm1, v_t, r_t, discount_t, rho_tm1])
    clipped_rho = jnp.minimum(rho_bar, rho_tm1)
    c_tm1 = lambda_ * jnp.minimum(c_bar, rho_tm1)
    td = clipped_rho * (r_t + discount_t * v_t - v_tm1)

    def body(acc, x):
        td_s, disc, c = x
        acc = td_s + disc * c * acc
        return acc, acc

    _, errors = jax.lax.scan(body, jnp.zeros_like(td[0]), (td, discount_t, c_tm1), reverse=True)
    vs = errors + v_tm1
    # the last step bootstraps from V(x_T); before it, the lambda-mix of target and value
    vs_next = jnp.concatenate([lambda_ * vs[1:] + (1.0 - lambda_) * v_tm1[1:], v_t[-1:]])
    q = r_t + discount_t * vs_next
    pg_adv = jnp.minimum(pg_rho_bar, rho_tm1) * (q - v_tm1)
    sg = jax.lax.stop_gradient
    return VTraceOutput(sg(errors), sg(pg_adv), sg(q))


__all__ = ["VTraceOutput", "gae", "traced_gae", "vtrace"]
