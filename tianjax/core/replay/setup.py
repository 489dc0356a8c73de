"""The replay set-up every off-policy loop shares: the fused trainer (inside its jitted
loop), the in-process host trainer and the distributed learner build their buffer, add
rollouts and sample from it through `make_replay`, and the two in-process loops learn with
`make_replay_learn`.

The buffer's items follow the algorithm's buffer kind (`algo.buffer`,
tianjax.core.buffer_kind) and its own replay section (`config.replay_config`):

    transitions  a [T, B] rollout flattened to T x B transitions;
    sequences    one [T] item per env, stored with the recurrent state it started from
                 (the rollout's Sequences are already [B, T]);
    frame-once   transitions, where the section sets frame_once: the [T, B] chunk itself
                 in a ring that keeps each observation once (tianjax.core.replay.frames);
                 a sample is (transitions, mask), and the update takes the mask as its
                 weights' factor.

Every item keeps its behaviour version. Pure functions of arrays: the caller jits them.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from tianjax.config import Config
from tianjax.core.algorithm import Algorithm
from tianjax.core.replay import frames as frame_replay
from tianjax.core.replay import ring as buffers
from tianjax.core.update import LearnerState


def uses_frame_replay(config: Config, algo: Algorithm) -> bool:
    """Whether replay keeps each frame once (a replay section's frame_once, where it has
    one; transitions only, not sequences)."""
    return (
        bool(getattr(config.replay_config, "frame_once", False))
        and algo.buffer.items == "transitions"
    )


class Replay(NamedTuple):
    """The buffer's pure functions, bound to the config's capacity and batch size."""

    init: Callable  # init(example) -> an empty buffer for rollout batches shaped like `example`
    add: Callable  # add(buffer, batch) -> buffer with one rollout's batch added
    sample: Callable  # sample(buffer, key) -> batch_size items (frame-once: (transitions, mask))
    frame_once: bool

    def apply(self, update: Callable, state, sample, *fresh):
        """`update(state, batch, *fresh)` on a sample; frame-once, with its mask."""
        if self.frame_once:
            batch, mask = sample
            return update(state, batch, *(fresh or (True,)), mask)
        return update(state, sample, *fresh)

    def behaviour(self, sample):
        """The behaviour versions of a sample's items."""
        return (sample[0] if self.frame_once else sample).version


def make_replay(config: Config, algo: Algorithm) -> Replay:
    """The configured algorithm's replay buffer (see the module doc)."""
    rc = config.replay_config
    frames = uses_frame_replay(config, algo)
    to_items = algo.buffer.to_items(buffers.flatten_time_batch, frames)

    def init(example):
        """`example`: one rollout's batch, as arrays or ShapeDtypeStructs."""
        if frames:
            return frame_replay.init(rc.buffer_size, example)
        one = jax.tree.map(
            lambda x: jnp.zeros(x.shape[1:], x.dtype), jax.eval_shape(to_items, example)
        )
        return buffers.replay_init(rc.buffer_size, one)

    def add(rb, batch):
        return frame_replay.add(rb, batch) if frames else buffers.replay_add(rb, to_items(batch))

    def sample(rb, key):
        if frames:
            return frame_replay.sample(rb, key, rc.batch_size)
        return buffers.replay_sample(rb, key, rc.batch_size)

    return Replay(init, add, sample, frames)


def make_replay_learn(config: Config, algo: Algorithm):
    """learn(learner, replay, batch, env_steps) -> (learner, replay, metrics).

    Adds one rollout's batch to the replay buffer, then, once `learning_starts` env steps
    have been collected (`env_steps`), takes `updates_per_rollout` gradient steps on uniform
    samples (metrics are their means; zeros before learning starts). The loop of the two
    in-process trainers (fused, host); the distributed learner paces its steps itself.
    """
    rc = config.replay_config  # the algorithm's own (its items: transitions or sequences)
    replay = make_replay(config, algo)

    def learn(learner: LearnerState, rb, batch, env_steps):
        rb = replay.add(rb, batch)

        def run(l0):
            def one(state, _):
                key, sub = jax.random.split(state.key)
                return replay.apply(algo.update, state._replace(key=key), replay.sample(rb, sub))

            return jax.lax.scan(one, l0, None, length=rc.updates_per_rollout)

        def skip(l0):
            _, m = jax.eval_shape(run, l0)
            return l0, jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), m)

        learner, metrics = jax.lax.cond(env_steps >= rc.learning_starts, run, skip, learner)
        return learner, rb, jax.tree.map(lambda x: jnp.mean(x, axis=0), metrics)

    return learn


__all__ = ["Replay", "make_replay", "make_replay_learn", "uses_frame_replay"]
