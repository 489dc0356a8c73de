"""The algorithm bundle: how to act, how to learn, what buffer it needs.

An algorithm is a NamedTuple of pure functions built from a Config and the env's spaces.
Nothing here knows whether it runs fused, sync or async, and nothing here names an
algorithm: the built-in ones are packages under tianjax.algos, each registered with an
AlgorithmSpec that says how to build it.

The protocol (built-in algorithms and yours, `tianjax.algos.register(spec)`):

    make(config, obs_shape, action_spec, *, correct_staleness=True) -> Algorithm

What an algorithm gives:
- `init(key) -> LearnerState` (tianjax.core.update): params, optimizer state, version 0, key.
- `act(params, obs [B, ...], key, env_steps) -> ActOutput(action, log_prob, value)`:
  sampled (exploring) actions, log mu(a|s) of the behaviour policy, and V(s) (zeros if the
  algorithm has no critic). Pure and jittable: the runtime jits it in actors and scans it
  in fused mode.
- `value(params, obs) -> [B]` (truncation bootstrap) and `greedy(params, obs) -> action`.
- `update(state, batch, fresh=True) -> (state, metrics)`: jittable; it must add 1 to
  `state.version` per call, and should be wrapped in `tianjax.core.update.guarded` so that a
  non-finite step is skipped and counted. Metrics are a flat dict of scalars. `fresh` is
  False for a reuse pass over a batch already learned from: schedules follow progress
  (fresh env steps learned, `state.fresh_steps`; see tianjax.core.update), which such a pass
  must not advance.
- `loss_fn(params, batch, ...) -> (loss, metrics)` with per-sample weights as an explicit
  input (exposed for tests and notebooks; the runtime calls only `update`).
- `buffer`: its kind (tianjax.core.buffer_kind): ON_POLICY (batches are Trajectory
  [T, B]), TRANSITIONS (batches are Transition [N], sampled by the runtime) or SEQUENCES
  ([N, T] sequences of a recurrent policy); a kind's name ("onpolicy", "replay",
  "sequences") is accepted too. It must be the kind its spec declares. The replay settings
  are the algorithm's own section's (`Config.replay_config`).
- `network`: the flax module (`tianjax.networks.custom_network` gives the user's one).

What the runtime guarantees it:
- every sample carries its behaviour version: `batch.version` [T, B] (or [N]); the
  learner's version is `state.version`, so tau = state.version - batch.version >= 0, and
  `tianjax.core.staleness.staleness_weights` turns them into the per-sample weights;
- `correct_staleness=False` only where tau is always 0 (fused mode): weights may be
  skipped there;
- Trajectory fields follow tianjax.core.types: `done` ends an episode, `bootstrap_value` is
  V(final obs) where the episode was truncated (0 elsewhere), `last_obs` is the
  observation after the last step, and `trunc_obs` / `trunc_t` the final observation of
  each env's last truncation, for bootstrapping with the learner's own critic;
- every parameter message carries the learner's count of env steps admitted, which the
  actors pass to `act` as `env_steps`: actor-side schedules are global;
- observations keep the env's dtype (uint8 frames stay uint8 up to the network);
- `update` runs in one process (the learner), `act` in any number of actor processes,
  each with the newest parameters it holds; nothing else is shared.
"""

from __future__ import annotations

from typing import Any, Callable, Literal, NamedTuple

import jax

from tianjax.core.buffer_kind import BufferKind
from tianjax.core.update import LearnerState


class ActOutput(NamedTuple):
    action: jax.Array  # [B, ...]
    log_prob: jax.Array  # [B] log mu(a | s)
    value: jax.Array  # [B] V_mu(s) (zeros for value-free algorithms)
    carry: Any = None  # recurrent policies: the state after this step [B, ...] (None otherwise)


class Algorithm(NamedTuple):
    name: str
    buffer: BufferKind | Literal["onpolicy", "replay", "sequences"]  # what it learns from
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
    # recurrent policies: init_carry(batch) -> the state before the first step [batch, ...];
    # act then takes it as a fifth argument and returns the next one in ActOutput.carry
    init_carry: Callable[[int], Any] | None = None


__all__ = ["ActOutput", "Algorithm"]
