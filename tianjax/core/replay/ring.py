"""Sample buffers that keep each sample's behaviour version.

- Replay: a fixed-capacity ring of Transitions as pure (init, add, sample) functions, so it
  lives inside jitted loops (fused DQN) as well as in a learner process.
- On-policy pool: a bounded FIFO of [T, B] trajectories for the runtime learner; it is
  host-side bookkeeping over already-built batches and lives with the runtime.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from tianjax.core.types import Transition


class ReplayState(NamedTuple):
    data: Transition  # each leaf [capacity, ...]
    insert_pos: jax.Array  # int32 scalar, next slot to write
    size: jax.Array  # int32 scalar, filled slots


def replay_init(capacity: int, example: Transition) -> ReplayState:
    """An empty buffer shaped like one transition `example` (leaves without the N axis)."""
    data = jax.tree.map(
        lambda x: jnp.zeros((capacity,) + jnp.shape(x), jnp.asarray(x).dtype), example
    )
    return ReplayState(data, jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))


def replay_add(state: ReplayState, batch: Transition) -> ReplayState:
    """Appends N transitions (leaves [N, ...]), overwriting the oldest when full."""
    capacity = jax.tree.leaves(state.data)[0].shape[0]
    n = jax.tree.leaves(batch)[0].shape[0]
    chex.assert_tree_shape_prefix(batch, (n,))
    idx = (state.insert_pos + jnp.arange(n)) % capacity
    data = jax.tree.map(lambda buf, x: buf.at[idx].set(x.astype(buf.dtype)), state.data, batch)
    return ReplayState(
        data, (state.insert_pos + n) % capacity, jnp.minimum(state.size + n, capacity)
    )


def replay_sample(state: ReplayState, key: jax.Array, batch_size: int) -> Transition:
    """Uniform sample (with replacement) of `batch_size` transitions from the filled part."""
    idx = jax.random.randint(key, (batch_size,), 0, jnp.maximum(state.size, 1))
    return jax.tree.map(lambda buf: buf[idx], state.data)


def flatten_time_batch(tree):
    """[T, B, ...] -> [T * B, ...] for every leaf."""
    return jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), tree)


__all__ = ["ReplayState", "flatten_time_batch", "replay_add", "replay_init", "replay_sample"]
