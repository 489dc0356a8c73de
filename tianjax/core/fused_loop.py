"""The fused trainer (Podracer "Anakin" shape): rollout and update in one jitted loop.

For JAX envs the actor and learner share a device and a program: one iteration steps
[B] envs for T steps with the current params and then updates on that batch (on-policy)
or on samples from an in-jit replay buffer (off-policy; tianjax.core.replay.setup). `run(state, n)`
scans n iterations; the runtime shell calls it in chunks to log between them, and may
vmap it over seeds. In this mode every sample is fresh (tau = 0), which is the equivalence the
staleness-corrected losses are tested against, unless `staleness.forced_lag` is K > 0:
then the rollout acts with the parameters of version max(V - K, 0) from a ring of past
versions in the state (tianjax.core.lag), so every sample is exactly min(V, K) updates old
when learned from at version V, deterministically, and the lag is an array of the state
(vmap it as seeds are vmapped; the ring holds forced_lag + 1 versions).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from tianjax.config import Config
from tianjax.core import lag as lag_ring
from tianjax.core.algorithm import Algorithm
from tianjax.core.replay import frames as frame_replay
from tianjax.core.replay import ring as buffers
from tianjax.core.replay.setup import make_replay, make_replay_learn
from tianjax.core.rollout import RolloutState, make_rollout
from tianjax.core.types import Env
from tianjax.core.update import LearnerState


class FusedState(NamedTuple):
    learner: LearnerState
    actor: RolloutState
    env_steps: jax.Array  # int32 scalar
    replay: buffers.ReplayState | frame_replay.FrameReplayState | None = None
    lag: lag_ring.LagState | None = None  # staleness.forced_lag > 0: the past versions


def lag_capacity(config: Config) -> int:
    """Slots of the forced lag's ring: staleness.forced_lag + 1 (0: no ring, no lag)."""
    k = config.staleness.forced_lag
    return k + 1 if k > 0 else 0


def corrects_staleness(config: Config) -> bool:
    """Whether a fused run's algorithm corrects for staleness: only under a forced lag
    (elsewhere tau is always 0 and the weights would all be 1), as staleness.correct says."""
    return lag_capacity(config) > 0 and config.staleness.correct


def make_fused(config: Config, env: Env, algo: Algorithm):
    """Returns (init(key) -> FusedState, run(state, num_iterations, num_valid=None) ->
    (state, (metrics, episodes)))."""
    B, T = config.num_envs, config.rollout_len
    rollout_init, rollout = make_rollout(env, algo, B, T)
    replay = algo.buffer.replayed
    ring_slots = lag_capacity(config)

    def init(key) -> FusedState:
        k_learn, k_act = jax.random.split(key)
        learner = algo.init(k_learn)
        actor = rollout_init(k_act)
        rb = None
        if replay:
            _, example, _ = jax.eval_shape(rollout, learner.params, learner.version, actor)
            rb = make_replay(config, algo).init(example)
        lag = None
        if ring_slots:
            lag = lag_ring.init(learner.params, ring_slots, config.staleness.forced_lag)
        return FusedState(learner, actor, jnp.zeros((), jnp.int32), rb, lag)

    def acting(state: FusedState):
        """(params, version) the rollout acts with: the learner's, or K versions older."""
        if state.lag is None:
            return state.learner.params, state.learner.version
        return lag_ring.behaviour(state.lag, state.learner.version)

    def remember(lag, learner):
        """The ring after an update: the new version stored (no ring: nothing)."""
        return None if lag is None else lag_ring.push(lag, learner.params, learner.version)

    def onpolicy_iteration(state: FusedState):
        # (the named scopes only name the ops, for profiles: experiments/benchmarks/profile_fused.py)
        with jax.named_scope("rollout"):
            params, version = acting(state)
            actor, traj, episodes = rollout(params, version, state.actor, state.env_steps)
        with jax.named_scope("update"):
            learner, metrics = algo.update(state.learner, traj)
        lag = remember(state.lag, learner)
        return FusedState(learner, actor, state.env_steps + B * T, None, lag), metrics, episodes

    replay_learn = make_replay_learn(config, algo)

    def replay_iteration(state: FusedState):
        params, version = acting(state)
        actor, trans, episodes = rollout(params, version, state.actor, state.env_steps)
        env_steps = state.env_steps + B * T
        learner, rb, metrics = replay_learn(state.learner, state.replay, trans, env_steps)
        lag = remember(state.lag, learner)
        return FusedState(learner, actor, env_steps, rb, lag), metrics, episodes

    iteration = replay_iteration if replay else onpolicy_iteration

    def run(state: FusedState, num_iterations: int, num_valid: jax.Array | None = None):
        """Scans `num_iterations` iterations. With `num_valid` (an int32 scalar, traced),
        only the first num_valid of them run: the rest leave the state as it is and give
        zero outputs, so one compiled program serves chunks of any length up to
        num_iterations (a skipped iteration costs one conditional)."""

        def body(s, i):
            s, metrics, episodes = iteration(s)
            return s, (dict(metrics, version=s.learner.version), episodes)

        if num_valid is None:
            return jax.lax.scan(body, state, None, length=num_iterations)
        out_shape = jax.eval_shape(body, state, 0)[1]

        def skip(s, i):
            return s, jax.tree.map(lambda a: jnp.zeros(a.shape, a.dtype), out_shape)

        def maybe(s, i):
            return jax.lax.cond(i < num_valid, body, skip, s, i)

        return jax.lax.scan(maybe, state, jnp.arange(num_iterations))

    return init, run


__all__ = ["FusedState", "corrects_staleness", "lag_capacity", "make_fused"]
