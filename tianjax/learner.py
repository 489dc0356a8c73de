"""Learner state and the pure pieces every jitted update shares.

`update(state, batch) -> (state, metrics)` is built per algorithm (tianjax.algos); this
module holds what they share: the named LearnerState, the optimizer, and one gradient step
that refuses non-finite gradients (the step is skipped and counted, so NaNs never reach the
parameters). `version` counts update() calls, i.e. batches consumed: it is the version that
parameters travel with and that samples are stamped with.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from tianjax.types import Params


class LearnerState(NamedTuple):
    params: Params
    opt_state: optax.OptState
    version: jax.Array  # int32 scalar: updates applied so far
    key: jax.Array  # typed PRNG key for minibatch shuffles etc.
    target_params: Params = None  # DQN target network (None elsewhere)
    skipped_updates: jax.Array = jnp.zeros((), jnp.int32)  # gradient steps refused (non-finite)


def make_optimizer(lr: float, max_grad_norm: float, total_grad_steps: int | None,
                   anneal: bool) -> optax.GradientTransformation:
    """Adam (eps 1e-5) after global-norm clipping; lr decays linearly to 0 if `anneal`."""
    if anneal and total_grad_steps:
        schedule = optax.linear_schedule(lr, 0.0, max(int(total_grad_steps), 1))
    else:
        schedule = lr
    return optax.chain(optax.clip_by_global_norm(max_grad_norm),
                       optax.adam(schedule, eps=1e-5))


def init_state(params: Params, optimizer: optax.GradientTransformation, key: jax.Array,
               with_target: bool = False, version: int = 0) -> LearnerState:
    return LearnerState(
        params=params,
        opt_state=optimizer.init(params),
        version=jnp.asarray(version, jnp.int32),
        key=key,
        target_params=jax.tree.map(jnp.copy, params) if with_target else None,
        skipped_updates=jnp.zeros((), jnp.int32),
    )


def all_finite(tree) -> jax.Array:
    """True iff every leaf of `tree` is finite (a bool scalar)."""
    leaves = [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))


def gradient_step(loss_fn: Callable[..., tuple[jax.Array, dict]], optimizer: optax.GradientTransformation,
                  params: Params, opt_state: Any, *batch) -> tuple[Params, Any, dict]:
    """One plain gradient step: (params, opt_state, metrics)."""
    (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, *batch)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, dict(metrics, loss=loss)


def guarded(update: Callable[[LearnerState, Any], tuple[LearnerState, dict]]):
    """Wraps update(state, batch) so that an update producing non-finite parameters or
    optimizer state is skipped: the old state is kept (version included) and
    `skipped_updates` counts it. Non-finite gradients always surface there (Adam turns a
    NaN or inf gradient into NaN parameters), so one check per update suffices.
    """

    def wrapped(state: LearnerState, batch):
        new, metrics = update(state, batch)
        ok = all_finite((new.params, new.opt_state))
        # NOTE: a select keeps this branch-free (it runs inside scans and under vmap).
        kept = jax.tree.map(lambda n, o: jnp.where(ok, n, o), new, state)
        kept = kept._replace(skipped_updates=state.skipped_updates + (~ok).astype(jnp.int32))
        return kept, dict(metrics, update_skipped=(~ok).astype(jnp.float32))

    return wrapped
