"""Learner state and the pure pieces every jitted update shares.

`update(state, batch, fresh=True) -> (state, metrics)` is built per algorithm
(tianjax.algos); this module holds what they share: the named LearnerState, the optimizer,
the progress-driven learning-rate schedule, and one gradient step that refuses non-finite
gradients (the step is skipped and counted, so NaNs never reach the parameters). `version`
counts update() calls, i.e. batches consumed: it is the version that parameters travel
with and that samples are stamped with.

Schedules follow progress, never an update count. `fresh_steps` counts the env steps of
the batches learned from for the first time (an update on a reused batch adds nothing), and

    progress = fresh_steps / budget,      lr(progress) = lr_0 * (1 - progress)   (anneal)

where `budget` is the fresh env steps the run will learn from. Within one update of K
gradient steps on a fresh batch of n env steps, gradient step j (0-based) uses
progress (fresh_steps + n * j / K) / budget, so a run without reuse follows exactly a
linear schedule over its gradient steps (optax.linear_schedule), and a run with reuse
follows the same curve against fresh data: its extra passes take gradient steps at the
current learning rate without using it up.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from tianjax.core.types import Params


class LearnerState(NamedTuple):
    # NOTE: no array defaults: a jnp default would start a JAX backend at import time,
    # before a multi-host script can call jax.distributed.initialize(). Build with init_state.
    params: Params
    opt_state: optax.OptState
    version: jax.Array  # int32 scalar: updates applied so far
    key: jax.Array  # typed PRNG key for minibatch shuffles etc.
    target_params: Params = None  # DQN target network (None elsewhere)
    skipped_updates: jax.Array | None = None  # int32 scalar: updates refused (non-finite)
    fresh_steps: jax.Array | None = None  # int32 scalar: env steps of fresh batches learned from


def fan_in_scale(shape: tuple[int, ...], base_width: int | None) -> float:
    """The factor on a parameter's Adam step: base_width / fan_in for a dense kernel (2-D,
    [fan_in, fan_out]) whose fan-in exceeds base_width, 1 for anything else (biases, the
    input layer of a narrow observation, convolution kernels, or base_width None)."""
    if base_width is None or len(shape) != 2 or shape[0] <= base_width:
        return 1.0
    return base_width / shape[0]


def scale_by_fan_in(base_width: int | None) -> optax.GradientTransformation:
    """Multiplies each update by `fan_in_scale` of its shape (a per-layer learning rate).

    Adam moves every weight by about the learning rate whatever its gradient's scale, so a
    layer's output moves with the number of weights feeding each unit: a 256-wide layer's
    first step changes its pre-activations about 4x as much as a 64-wide one's at the same
    learning rate. Scaled by base_width / fan_in, a learning rate tuned at base_width moves
    a wider network's function as far per step (the hidden- and output-layer rule of
    "maximal update" parametrisations for Adam, Yang et al. 2022)."""

    def init(params):
        return optax.EmptyState()

    def update(updates, state, params=None):
        def scale(u):
            f = fan_in_scale(u.shape, base_width)
            return u if f == 1.0 else u * jnp.asarray(f, u.dtype)

        return jax.tree.map(scale, updates), state

    return optax.GradientTransformation(init, update)


def _adam(learning_rate, max_grad_norm, base_width=None):
    parts = [optax.clip_by_global_norm(max_grad_norm), optax.adam(learning_rate, eps=1e-5)]
    if base_width is not None:
        parts.append(scale_by_fan_in(base_width))
    return optax.chain(*parts)


def make_optimizer(
    lr: float, max_grad_norm: float, base_width: int | None = None
) -> optax.GradientTransformation:
    """Adam (eps 1e-5) after global-norm clipping, its learning rate a hyperparameter in the
    optimizer state (optax.inject_hyperparams) that the update sets from progress. With
    `base_width`, `lr` is the rate of a layer base_width wide and wider dense layers take a
    smaller step (scale_by_fan_in)."""
    return optax.inject_hyperparams(_adam, static_args=("base_width",))(
        learning_rate=lr, max_grad_norm=max_grad_norm, base_width=base_width
    )


def learning_rate(opt_state) -> jax.Array:
    """The learning rate the last gradient step used (read back from the optimizer state)."""
    return opt_state.hyperparams["learning_rate"]


def with_learning_rate(opt_state, lr) -> Any:
    hp = dict(opt_state.hyperparams, learning_rate=jnp.asarray(lr, jnp.float32))
    return opt_state._replace(hyperparams=hp)


def lr_schedule(lr: float, anneal: bool, budget: int) -> Callable[[jax.Array], jax.Array]:
    """lr(fresh env steps learned): linear from lr to 0 at `budget` if `anneal`, else flat."""
    budget = float(max(int(budget), 1))

    def schedule(fresh_steps):
        progress = jnp.clip(jnp.asarray(fresh_steps, jnp.float32) / budget, 0.0, 1.0)
        if not anneal:
            return jnp.full(progress.shape, lr, jnp.float32)
        return jnp.asarray(lr, jnp.float32) * (1.0 - progress)

    return schedule


def step_progress(
    fresh_steps: jax.Array, fresh: jax.Array, batch_steps: int, num_grad_steps: int
) -> jax.Array:
    """[num_grad_steps] fresh-step counts at which each gradient step of an update is taken:
    fresh_steps + batch_steps * j / num_grad_steps for a fresh batch, fresh_steps for reuse."""
    j = jnp.arange(num_grad_steps, dtype=jnp.float32)
    inc = jnp.asarray(fresh, jnp.float32) * batch_steps * j / num_grad_steps
    return jnp.asarray(fresh_steps, jnp.float32) + inc


def init_state(
    params: Params,
    optimizer: optax.GradientTransformation,
    key: jax.Array,
    with_target: bool = False,
    version: int = 0,
) -> LearnerState:
    return LearnerState(
        params=params,
        opt_state=optimizer.init(params),
        version=jnp.asarray(version, jnp.int32),
        key=key,
        target_params=jax.tree.map(jnp.copy, params) if with_target else None,
        skipped_updates=jnp.zeros((), jnp.int32),
        fresh_steps=jnp.zeros((), jnp.int32),
    )


def all_finite(tree) -> jax.Array:
    """True iff every leaf of `tree` is finite (a bool scalar)."""
    leaves = [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))


def gradient_step(
    loss_fn: Callable[..., tuple[jax.Array, dict]],
    optimizer: optax.GradientTransformation,
    params: Params,
    opt_state: Any,
    *batch,
    lr=None,
) -> tuple[Params, Any, dict]:
    """One plain gradient step: (params, opt_state, metrics); `lr` sets the learning rate
    of an optimizer made by make_optimizer for this step (None: keep it)."""
    if lr is not None:
        opt_state = with_learning_rate(opt_state, lr)
    with jax.named_scope("loss"):
        (loss, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, *batch)
    with jax.named_scope("optimizer"):
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
    return params, opt_state, dict(metrics, loss=loss)


def guarded(update: Callable[..., tuple[LearnerState, dict]]):
    """Wraps update(state, batch, *args) so that an update producing non-finite parameters or
    optimizer state is skipped: the old state is kept (version included) and
    `skipped_updates` counts it. Non-finite gradients always surface there (Adam turns a
    NaN or inf gradient into NaN parameters), so one check per update suffices.
    """

    def wrapped(state: LearnerState, batch, *args):
        new, metrics = update(state, batch, *args)
        ok = all_finite((new.params, new.opt_state))
        # NOTE: a select keeps this branch-free (it runs inside scans and under vmap).
        kept = jax.tree.map(lambda n, o: jnp.where(ok, n, o), new, state)
        kept = kept._replace(skipped_updates=state.skipped_updates + (~ok).astype(jnp.int32))
        return kept, dict(metrics, update_skipped=(~ok).astype(jnp.float32))

    return wrapped


__all__ = [
    "LearnerState",
    "all_finite",
    "fan_in_scale",
    "gradient_step",
    "guarded",
    "init_state",
    "learning_rate",
    "lr_schedule",
    "make_optimizer",
    "scale_by_fan_in",
    "step_progress",
    "with_learning_rate",
]
