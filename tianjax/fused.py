"""The fused trainer (Podracer "Anakin" shape): rollout and update in one jitted loop.

For JAX envs the actor and learner share a device and a program: one iteration steps
[B] envs for T steps with the current params and then updates on that batch (on-policy)
or on samples from an in-jit replay buffer (off-policy). `run(state, n)` scans n
iterations; the runtime shell calls it in chunks to log between them, and may vmap it
over seeds. In this mode every sample is fresh (tau = 0), which is the equivalence the
staleness-corrected losses are tested against.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from tianjax import buffers, frame_replay
from tianjax.algos.base import Algorithm
from tianjax.config import Config
from tianjax.envs.jax_env import JaxEnv
from tianjax.learner import LearnerState
from tianjax.rollout import Episodes, RolloutState, make_rollout


class FusedState(NamedTuple):
    learner: LearnerState
    actor: RolloutState
    env_steps: jax.Array  # int32 scalar
    replay: buffers.ReplayState | frame_replay.FrameReplayState | None = None


def uses_frame_replay(config: Config, algo: Algorithm) -> bool:
    """Whether replay keeps each frame once (dqn.frame_once; transitions, not sequences)."""
    return bool(config.dqn.frame_once) and algo.buffer == "replay"


def make_replay_learn(config: Config, algo: Algorithm):
    """learn(learner, replay, transitions [N], env_steps) -> (learner, replay, metrics).

    Adds the transitions to the replay buffer, then, once `dqn.learning_starts` env steps
    have been collected, takes `dqn.updates_per_rollout` gradient steps on uniform samples
    (metrics are their means; zeros before learning starts). Shared by every loop that
    learns off-policy: fused, in-process host, and the distributed learner.

    With `dqn.frame_once` (fused DQN) the buffer is a tianjax.frame_replay ring, the
    transitions come as the rollout's [T, B] chunk, and each update also takes the
    buffer's per-sample mask.
    """

    rc = config.replay_config  # dqn, or qmix (whose items are sequences)
    frames = uses_frame_replay(config, algo)

    def learn(learner: LearnerState, rb, trans, env_steps):
        rb = frame_replay.add(rb, trans) if frames else buffers.replay_add(rb, trans)

        def run(l0):
            def one(l, _):
                key, sub = jax.random.split(l.key)
                if frames:
                    batch, mask = frame_replay.sample(rb, sub, rc.batch_size)
                    return algo.update(l._replace(key=key), batch, True, mask)
                batch = buffers.replay_sample(rb, sub, rc.batch_size)
                return algo.update(l._replace(key=key), batch)

            return jax.lax.scan(one, l0, None, length=rc.updates_per_rollout)

        def skip(l0):
            _, m = jax.eval_shape(run, l0)
            return l0, jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), m)

        learner, metrics = jax.lax.cond(env_steps >= rc.learning_starts, run, skip, learner)
        return learner, rb, jax.tree.map(lambda x: jnp.mean(x, axis=0), metrics)

    return learn


def make_fused(config: Config, env: JaxEnv, algo: Algorithm):
    """Returns (init(key) -> FusedState, run(state, num_iterations) -> (state, (metrics, episodes)))."""
    B, T = config.num_envs, config.rollout_len
    rollout_init, rollout = make_rollout(env, algo, B, T)
    replay = algo.buffer in ("replay", "sequences")
    # replay items: transitions ([T, B] flattened) or sequences (one [T] item per env)
    # frame-once replay: the [T, B] chunk itself
    frames = uses_frame_replay(config, algo)
    to_items = (lambda x: x) if algo.buffer == "sequences" or frames else buffers.flatten_time_batch

    def init(key) -> FusedState:
        k_learn, k_act = jax.random.split(key)
        learner = algo.init(k_learn)
        actor = rollout_init(k_act)
        rb = None
        if replay:
            _, example, _ = jax.eval_shape(rollout, learner.params, learner.version, actor)
            if frames:
                rb = frame_replay.init(config.replay_config.buffer_size, example)
            else:
                one = jax.tree.map(lambda x: jnp.zeros(x.shape[1:], x.dtype),
                                   jax.eval_shape(to_items, example))
                rb = buffers.replay_init(config.replay_config.buffer_size, one)
        return FusedState(learner, actor, jnp.zeros((), jnp.int32), rb)

    def onpolicy_iteration(state: FusedState):
        actor, traj, episodes = rollout(state.learner.params, state.learner.version, state.actor,
                                        state.env_steps)
        learner, metrics = algo.update(state.learner, traj)
        return FusedState(learner, actor, state.env_steps + B * T, None), metrics, episodes

    replay_learn = make_replay_learn(config, algo)

    def replay_iteration(state: FusedState):
        actor, trans, episodes = rollout(state.learner.params, state.learner.version, state.actor,
                                         state.env_steps)
        env_steps = state.env_steps + B * T
        learner, rb, metrics = replay_learn(state.learner, state.replay, to_items(trans), env_steps)
        return FusedState(learner, actor, env_steps, rb), metrics, episodes

    iteration = replay_iteration if replay else onpolicy_iteration

    def run(state: FusedState, num_iterations: int):
        def body(s, _):
            s, metrics, episodes = iteration(s)
            return s, (dict(metrics, version=s.learner.version), episodes)

        return jax.lax.scan(body, state, None, length=num_iterations)

    return init, run


__all__ = ["FusedState", "make_fused", "make_replay_learn", "uses_frame_replay", "Episodes"]
