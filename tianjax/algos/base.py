"""The algorithm bundle: how to act, how to learn, what buffer it needs.

An algorithm is a NamedTuple of pure functions built from a Config and the env's spaces.
Nothing here knows whether it runs fused, sync or async.
"""

from __future__ import annotations

from typing import Any, Callable, Literal, NamedTuple

import jax

from tianjax.learner import LearnerState


class ActOutput(NamedTuple):
    action: jax.Array  # [B, ...]
    log_prob: jax.Array  # [B] log mu(a | s)
    value: jax.Array  # [B] V_mu(s) (zeros for value-free algorithms)


class Algorithm(NamedTuple):
    name: str
    buffer: Literal["onpolicy", "replay"]
    # init(key) -> LearnerState
    init: Callable[[jax.Array], LearnerState]
    # act(params, obs [B, ...], key, env_steps) -> ActOutput   (sampled / exploring)
    act: Callable[..., ActOutput]
    # value(params, obs [B, ...]) -> [B]   (truncation bootstrap; zeros for DQN)
    value: Callable[..., jax.Array]
    # greedy(params, obs [B, ...]) -> action [B, ...]
    greedy: Callable[..., jax.Array]
    # update(state, batch, fresh=True) -> (state, metrics); batch is a Trajectory or a
    # Transition; fresh=False marks a reuse pass (no progress on the schedules)
    update: Callable[[LearnerState, Any], tuple[LearnerState, dict]]
    # loss_fn(params, batch, ...) -> (loss, metrics); exposed for tests and notebooks
    loss_fn: Callable[..., tuple[jax.Array, dict]]
    network: Any  # the flax module
    # schedules(global env steps) -> {name: value} of the actor-side schedules the acting
    # uses (DQN: epsilon), for logging; None when the policy has none
    schedules: Callable[[Any], dict] | None = None
    # update = learn(state, prepare(state, batch), fresh), split for reuse: a reuse pass runs
    # learn again on what prepare made when the batch was first taken (PPO: the same
    # proximal policy, advantages and weights, as further epochs are). None: not split.
    prepare: Callable[[LearnerState, Any], Any] | None = None
    learn: Callable[..., tuple[LearnerState, dict]] | None = None
