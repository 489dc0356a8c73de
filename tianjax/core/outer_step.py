"""The outer step of learner groups: how the groups' parameter changes become one average.

TianJi (He et al., arXiv 2502.20190) trains several groups, each a learner with its own
actors, and has a root average their models from time to time; DiLoCo (Douillard et al.,
arXiv 2311.08105) treats such a change as a pseudo-gradient and applies an outer optimiser
to it. Here no group waits for another: deltas arrive when they arrive, and one computed
against an older average is weighted by its staleness in rounds with the loss's schedules
(tianjax.core.staleness).

The averager holds the average theta_bar_r, the outer momentum m_r (zero at round 0) and the
round r. Group g took the average of round r_g and sends its change since its reference
point rho_g (the average it took, or its parameters when it last sent):

    delta_g = theta_g - rho_g

A round closes over the deltas that arrived since the last one. With tau_g = r - r_g (rounds
closed since the average delta_g was computed against) and w the schedule:

    w_hat_g = w(tau_g) / sum_h w(tau_h)         (a delta with w(tau_g) = 0 is dropped)
    u       = sum_g w_hat_g delta_g             (-u is DiLoCo's outer gradient)

    mean:      theta_bar_{r+1} = theta_bar_r + u
    nesterov:  m_{r+1}         = mu m_r + u
               theta_bar_{r+1} = theta_bar_r + eta (mu m_{r+1} + u)

nesterov is optax.sgd(eta, momentum=mu, nesterov=True) applied to the outer gradient -u
(eta: groups.outer_lr, mu: groups.outer_momentum). A group merges a newer average at its
next update boundary and keeps what it learned since its reference point:

    theta_g <- theta_bar_{r+1} + (theta_g - rho_g),   then rho_g <- theta_bar_{r+1}

Reductions (pinned by tests/core/test_outer_step.py):
- mean, n deltas all computed against theta_bar_r, constant schedule: theta_bar_{r+1} =
  theta_bar_r + (1/n) sum_g (theta_g - theta_bar_r) = (1/n) sum_g theta_g, the groups'
  plain mean (TianJi's average), to float rounding;
- mean, one group sending after every update and merging before the next (sync_every 1):
  theta_bar_{r+1} = theta_bar_r + (theta_g - theta_bar_r), which is theta_g exactly where the
  subtraction and the addition are exact (to one rounding of each elsewhere), and the
  merge theta_bar_{r+1} + (theta_g - theta_g) is theta_bar_{r+1} exactly: one learner;
- equal groups (the same parameters), mean: the average is their parameters.

Optimizer states stay with the groups: only parameters are averaged. Everything here is a
pure function of pytrees (numpy or JAX arrays in, JAX arrays out).
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import chex
import jax
import jax.numpy as jnp

from tianjax.core.staleness import Schedule, schedule_weights

Params = chex.ArrayTree


class OuterState(NamedTuple):
    """The averager's state: the average, the outer momentum (zeros for `mean`), the round."""

    average: Params
    momentum: Params
    round: jax.Array  # int32 scalar: rounds closed


def init(params: Params, round: int = 0) -> OuterState:
    """Round `round` with `params` as the average and no momentum."""
    average = jax.tree.map(jnp.asarray, params)
    return OuterState(
        average,
        jax.tree.map(jnp.zeros_like, average),
        jnp.asarray(round, jnp.int32),
    )


def round_weights(tau: chex.Array, schedule: Schedule) -> jax.Array:
    """w_hat of each delta of a round: [n] int staleness in rounds -> [n] float32 weights
    summing to 1 (all zero when the schedule drops every delta)."""
    tau = jnp.asarray(tau, jnp.int32)
    chex.assert_rank(tau, 1)
    w = schedule_weights(tau, schedule)
    if schedule.max_staleness is not None:
        w = jnp.where(tau <= schedule.max_staleness, w, 0.0)
    total = jnp.sum(w)
    return jnp.where(total > 0, w / jnp.maximum(total, 1e-30), 0.0)


def combine(deltas: Sequence[Params], weights: chex.Array) -> Params:
    """u = sum_g weights[g] deltas[g] (each leaf in the deltas' dtype)."""
    weights = jnp.asarray(weights, jnp.float32)
    chex.assert_rank(weights, 1)
    chex.assert_equal(len(deltas), weights.shape[0])
    if len(deltas) > 1:
        chex.assert_trees_all_equal_shapes(*deltas)

    def leaf(*xs):
        acc = weights[0].astype(xs[0].dtype) * xs[0]
        for i in range(1, len(xs)):
            acc = acc + weights[i].astype(xs[i].dtype) * xs[i]
        return acc

    return jax.tree.map(leaf, *[jax.tree.map(jnp.asarray, d) for d in deltas])


def outer_step(
    state: OuterState,
    deltas: Sequence[Params],
    tau: chex.Array,
    *,
    outer: str,
    lr: float,
    momentum: float,
    schedule: Schedule,
) -> tuple[OuterState, jax.Array]:
    """Closes round r over `deltas` ([n] pytrees shaped like the average) of staleness `tau`
    ([n] rounds); returns the state of round r + 1 and the weights used ([n]). A round
    whose deltas are all dropped leaves the state as it was (the round does not advance)."""
    chex.assert_trees_all_equal_shapes(state.average, *deltas)
    weights = round_weights(tau, schedule)
    u = combine(deltas, weights)
    if outer == "mean":
        average = jax.tree.map(lambda a, x: a + x, state.average, u)
        m = state.momentum
    elif outer == "nesterov":
        m = jax.tree.map(lambda m_r, x: momentum * m_r + x, state.momentum, u)
        average = jax.tree.map(
            lambda a, m_next, x: a + lr * (momentum * m_next + x), state.average, m, u
        )
    else:
        raise ValueError(f"outer must be 'mean' or 'nesterov', got {outer!r}")
    kept = jnp.sum(weights) > 0  # (jittable: no branch on the weights' values)
    keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(kept, n, o), new, old)
    return (
        OuterState(
            keep(average, state.average),
            keep(m, state.momentum),
            state.round + kept.astype(jnp.int32),
        ),
        weights,
    )


def delta(params: Params, reference: Params) -> Params:
    """delta_g = theta_g - rho_g."""
    chex.assert_trees_all_equal_shapes(params, reference)
    return jax.tree.map(lambda p, r: p - r, params, reference)


def merge(average: Params, params: Params, reference: Params) -> Params:
    """theta_g <- theta_bar + (theta_g - rho_g): the new average plus the progress since rho_g."""
    chex.assert_trees_all_equal_shapes(average, params, reference)
    return jax.tree.map(lambda a, p, r: a + (p - r), average, params, reference)


__all__ = ["OuterState", "combine", "delta", "init", "merge", "outer_step", "round_weights"]
