"""Shared array containers. Every field documents its shape; T is time, B is batch."""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import jax
import numpy as np

Array = jax.Array
Params = Any  # a pytree of arrays
PRNGKey = jax.Array


class Trajectory(NamedTuple):
    """A [T, B] on-policy rollout, stamped with the policy version that produced it.

    Truncation bootstraps, termination does not: where an episode is cut by a time limit
    at step t, `bootstrap_value[t]` holds the behaviour critic's value of the final
    observation (0 elsewhere), and `done[t]` is set either way so nothing leaks across
    episodes. The losses add gamma * bootstrap_value[t] to reward[t]. So that a learner
    can bootstrap with its own critic instead, the final observation of each env's last
    truncation in the rollout is kept too (`trunc_obs`, at step `trunc_t`); an earlier
    truncation of the same env in one rollout (only when T exceeds the time limit) keeps
    the behaviour critic's value.
    """

    obs: Array  # [T, B, ...] observation the action was chosen from
    action: Array  # [T, B, ...]
    reward: Array  # [T, B]
    done: Array  # [T, B] episode ended after this step (terminated or truncated)
    bootstrap_value: Array  # [T, B] V(final obs) where truncated, else 0
    behaviour_log_prob: Array  # [T, B] log mu(a_t | s_t)
    behaviour_value: Array  # [T, B] V_mu(s_t) from the behaviour critic
    version: Array  # [T, B] int32 behaviour version
    last_obs: Array  # [B, ...] observation after the last step (tail bootstrap)
    trunc_obs: Array  # [B, ...] final observation of the env's last truncation (zeros if none)
    trunc_t: Array  # [B] int32 step of that truncation, -1 if none


class ParamsMessage(NamedTuple):
    """What the learner publishes with each version: the parameters, and the env steps it
    has admitted so far (the global count that actor-side schedules such as epsilon follow)."""

    params: Params
    env_steps: Array  # int64 scalar


class Transition(NamedTuple):
    """Off-policy transitions [N, ...] for replay (DQN)."""

    obs: Array  # [N, ...]
    action: Array  # [N]
    reward: Array  # [N]
    next_obs: Array  # [N, ...] the true next observation (final observation at an episode end)
    terminated: Array  # [N] no bootstrap; truncation still bootstraps from next_obs
    version: Array  # [N] int32 behaviour version


class EpisodeStats(NamedTuple):
    """Per-env running episode statistics carried through a rollout."""

    episode_return: Array  # [B] return so far of the running episode
    episode_length: Array  # [B]


class Sequences(NamedTuple):
    """Replayable sequences of a recurrent policy, batch-major [B, T, ...] (one item per env).

    Multi-agent leaves carry the agent axis after T. `carry` is the policy's recurrent state
    before the first step of each sequence, so that a replayed sequence is unrolled from
    where the actor was.
    """

    obs: Any  # [B, T, ...] observation at step t
    action: Array  # [B, T, ...]
    reward: Array  # [B, T, ...] (per agent: [B, T, N])
    next_obs: Any  # [B, T, ...] the true next observation (the final one at an episode end)
    terminated: Array  # [B, T] no bootstrap
    done: Array  # [B, T] an episode ended (terminated or truncated): the carry resets after it
    carry: Any  # [B, ...] recurrent state before step 0
    version: Array  # [B, T] int32 behaviour version


class ActionSpec(NamedTuple):
    """What a policy outputs: `num_actions` logits, or a `shape` of continuous values."""

    discrete: bool
    num_actions: int = 0  # discrete
    shape: tuple[int, ...] = ()  # continuous
    low: float | np.ndarray = -1.0
    high: float | np.ndarray = 1.0


class JaxStep(NamedTuple):
    obs: jax.Array
    state: Any
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    final_obs: jax.Array
    won: jax.Array | None = None  # [] the episode ended in a win (envs that report wins)


class MAObs(NamedTuple):
    """What every agent of one env sees, stacked on the agent axis N."""

    obs: jax.Array  # [N, D] float32
    state: jax.Array  # [S] float32 global state
    avail: jax.Array  # [N, A] bool available actions


class Env(Protocol):
    """A JAX env with its params bound (the envs package's adapters follow it): stateless,
    jittable, written for one env and vmapped by the caller, auto-resetting."""

    obs_shape: tuple[int, ...]
    action_spec: ActionSpec

    def reset(self, key) -> tuple[Any, Any]: ...  # (obs, state)

    def step(self, key, state, action) -> JaxStep: ...


__all__ = [
    "ActionSpec",
    "Array",
    "Env",
    "EpisodeStats",
    "JaxStep",
    "MAObs",
    "PRNGKey",
    "Params",
    "ParamsMessage",
    "Sequences",
    "Trajectory",
    "Transition",
]
