"""What the built-in algorithms share: a batch's staleness weights, the replay update's
gradient step and target networks, and the check of a replay section against the run."""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from tianjax.config import Config, StalenessConfig, check_key
from tianjax.core import staleness as S
from tianjax.core.update import LearnerState, gradient_step

# update_target(params, target_params, version) -> (target_params, metrics)
TargetUpdate = Callable[[Any, Any, jax.Array], tuple[Any, dict]]


def sample_weights(
    correct_staleness: bool, learner_version, behaviour_version: jax.Array, cfg: StalenessConfig
) -> tuple[jax.Array, jax.Array]:
    """(weights, keep-mask) of a batch, shaped as `behaviour_version` ([T, B] or [N]):
    `tianjax.core.staleness.staleness_weights` where staleness is corrected, else ones
    (fused mode, where tau is always 0)."""
    if correct_staleness:
        return S.staleness_weights(learner_version, behaviour_version, cfg)
    ones = jnp.ones(jnp.shape(behaviour_version), jnp.float32)
    return ones, ones


def target_sync(params, target_params, do_sync: jax.Array, target_tau: float):
    """target <- target_tau * params + (1 - target_tau) * target where do_sync (a hard copy
    at target_tau 1)."""
    if target_tau >= 1.0:
        new = params
    else:
        new = optax.incremental_update(params, target_params, target_tau)
    return jax.tree.map(lambda n, o: jnp.where(do_sync, n, o), new, target_params)


def periodic_target(every: int, target_tau: float) -> TargetUpdate:
    """Target networks synced (target_sync) after every `every`-th update; reports
    `target_synced`."""

    def update_target(params, target_params, version):
        do_sync = (version % every) == 0
        synced = {"target_synced": do_sync.astype(jnp.float32)}
        return target_sync(params, target_params, do_sync, target_tau), synced

    return update_target


def polyak_target(target_tau: float) -> TargetUpdate:
    """Target networks moved by a Polyak step of `target_tau` after every update."""

    def update_target(params, target_params, version):
        return optax.incremental_update(params, target_params, target_tau), {}

    return update_target


def replay_step(
    loss_fn, optimizer, state: LearnerState, batch, w: jax.Array, update_target: TargetUpdate
) -> tuple[LearnerState, dict]:
    """One gradient step on replayed items with per-item weights `w`, then the target
    networks; the learner's version goes up by one. Metrics: the loss's, the weights'
    range and the target update's."""
    params, opt_state, metrics = gradient_step(
        loss_fn, optimizer, state.params, state.opt_state, state.target_params, batch, w
    )
    version = state.version + 1
    target_params, target_metrics = update_target(params, state.target_params, version)
    metrics["weight_min"] = jnp.min(w)
    metrics["weight_max"] = jnp.max(w)
    metrics.update(target_metrics)
    return state._replace(
        params=params, opt_state=opt_state, target_params=target_params, version=version
    ), metrics


def check_schedule_by_age(config: Config) -> None:
    """An algorithm that weighs samples by their age only (no pi_0 / mu of its own to measure
    a divergence with) refuses PPO's staleness options: staleness.schedule divergence and
    staleness.scale_lr."""
    check_key(
        config.staleness.schedule != "divergence",
        "staleness.schedule",
        f"'divergence' weighs by log pi_0 / mu, which PPO's update has; {config.algo} "
        "weighs by tau only (constant, polynomial, exponential, hinge, cutoff)",
    )
    check_key(
        not config.staleness.scale_lr,
        "staleness.scale_lr",
        f"puts a batch's mean w(tau) on PPO's learning rate; {config.algo}'s update has no "
        "such step (set it false)",
    )


def check_replay(config: Config) -> None:
    """The replay section (`config.replay_config`, the algorithm's own) against the run: the
    buffer holds one rollout, and in mode sync with actors every round of
    trajectories owes the learner a gradient step that starts in the first round."""
    check_schedule_by_age(config)
    rc, key = config.replay_config, config.spec.section
    sequences = config.spec.buffer.items == "sequences"
    items = config.num_envs * (1 if sequences else config.rollout_len)
    check_key(
        rc.buffer_size >= items,
        f"{key}.buffer_size",
        f"must hold at least one rollout ({items} {config.spec.buffer.items}), got {rc.buffer_size}",
    )
    if config.mode == "sync" and config.num_actors >= 1:
        # a sync actor waits for the version after the one it acted with: every round of
        # trajectories (one per actor) must owe the learner a gradient step
        per_round = config.num_actors * config.num_envs * config.rollout_len
        batch = rc.batch_size * (config.rollout_len if sequences else 1)
        check_key(
            config.replay_ratio * per_round >= batch,
            "runtime.replay_ratio",
            f"mode sync: a round of trajectories ({per_round} env steps) must owe a gradient "
            f"step of {batch} samples, got a replay ratio of {config.replay_ratio:g}",
        )
        latest = int(per_round - batch / config.replay_ratio)
        check_key(
            rc.learning_starts <= latest,
            f"{key}.learning_starts",
            f"mode sync with actors: learning must start in the first round of trajectories "
            f"(sync actors wait for the next version), so at most {latest}, got {rc.learning_starts}",
        )


__all__ = [
    "TargetUpdate",
    "check_replay",
    "check_schedule_by_age",
    "periodic_target",
    "polyak_target",
    "replay_step",
    "sample_weights",
    "target_sync",
]
