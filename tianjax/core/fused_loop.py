"""The fused trainer (Podracer "Anakin" shape): rollout and update in one jitted loop.

For JAX envs the actor and learner share a device and a program: one iteration steps
[B] envs for T steps with the current params and then updates on that batch (on-policy)
or on samples from an in-jit replay buffer (off-policy; tianjax.core.replay.setup). `run(state, n)`
scans n iterations; the runtime shell calls it in chunks to log between them, and may
vmap it over seeds. In this mode every sample is fresh (tau = 0), which is the equivalence the
staleness-corrected losses are tested against.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from tianjax.config import Config
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


def make_fused(config: Config, env: Env, algo: Algorithm):
    """Returns (init(key) -> FusedState, run(state, num_iterations, num_valid=None) ->
    (state, (metrics, episodes)))."""
    B, T = config.num_envs, config.rollout_len
    rollout_init, rollout = make_rollout(env, algo, B, T)
    replay = algo.buffer.replayed

    def init(key) -> FusedState:
        k_learn, k_act = jax.random.split(key)
        learner = algo.init(k_learn)
        actor = rollout_init(k_act)
        rb = None
        if replay:
            _, example, _ = jax.eval_shape(rollout, learner.params, learner.version, actor)
            rb = make_replay(config, algo).init(example)
        return FusedState(learner, actor, jnp.zeros((), jnp.int32), rb)

    def onpolicy_iteration(state: FusedState):
        # (the named scopes only name the ops, for profiles: experiments/benchmarks/profile_fused.py)
        with jax.named_scope("rollout"):
            actor, traj, episodes = rollout(
                state.learner.params, state.learner.version, state.actor, state.env_steps
            )
        with jax.named_scope("update"):
            learner, metrics = algo.update(state.learner, traj)
        return FusedState(learner, actor, state.env_steps + B * T, None), metrics, episodes

    replay_learn = make_replay_learn(config, algo)

    def replay_iteration(state: FusedState):
        actor, trans, episodes = rollout(
            state.learner.params, state.learner.version, state.actor, state.env_steps
        )
        env_steps = state.env_steps + B * T
        learner, rb, metrics = replay_learn(state.learner, state.replay, trans, env_steps)
        return FusedState(learner, actor, env_steps, rb), metrics, episodes

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


__all__ = ["FusedState", "make_fused"]
