"""A forced lag: actors act with parameters exactly K updates old, from a ring of versions.

In async mode staleness is whatever the machine makes it (actors' speed, the pool, the
controller); a study of how a loss holds up at staleness K needs it exact instead. The
fused loop keeps the last C parameter versions in a ring, and the rollout of the
iteration at learner version V acts with the parameters of version

    v_b = max(V - K, 0),        so tau = V - v_b = min(V, K)

(the first K updates learn from version 0's samples, at tau = V < K; from update K on every
sample is exactly K updates old). The ring holds version v at slot v mod C, with C = the
capacity (the largest lag the program serves, plus 1): a version is overwritten C updates
after it was written, so any K <= C - 1 reads a version still there. K is an array in the
state, not a Python constant, so one program (one ring capacity) serves several lags side
by side under vmap, as it serves several seeds.

Pure: (init, push, behaviour) over pytrees, jittable and vmappable.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp


class LagState(NamedTuple):
    ring: Any  # the params pytree, every leaf with a leading axis [C]: version v at slot v % C
    lag: jax.Array  # int32 scalar K: the actors' parameters are K versions behind (K <= C - 1)


def init(params, capacity: int, lag) -> LagState:
    """A ring of `capacity` slots, every one holding `params` (version 0), and lag K."""
    if capacity < 1:
        raise ValueError(f"a lag ring needs at least 1 slot, got {capacity}")
    ring = jax.tree.map(lambda x: jnp.broadcast_to(x[None], (capacity,) + x.shape), params)
    return LagState(ring, jnp.asarray(lag, jnp.int32))


def capacity(state: LagState) -> int:
    """The ring's slots C (a static size)."""
    return jax.tree.leaves(state.ring)[0].shape[0]


def push(state: LagState, params, version) -> LagState:
    """Stores `params` as version `version` (at slot version % C)."""
    slot = jnp.asarray(version, jnp.int32) % capacity(state)
    ring = jax.tree.map(
        lambda r, p: jax.lax.dynamic_update_index_in_dim(r, p.astype(r.dtype), slot, 0),
        state.ring,
        params,
    )
    return state._replace(ring=ring)


def behaviour_version(state: LagState, version) -> jax.Array:
    """v_b = max(V - K, 0) for learner version V, with K clipped to the ring (C - 1)."""
    k = jnp.minimum(state.lag, capacity(state) - 1)
    return jnp.maximum(jnp.asarray(version, jnp.int32) - k, 0)


def behaviour(state: LagState, version) -> tuple[Any, jax.Array]:
    """(params of version v_b, v_b): what an actor acts with at learner version `version`."""
    v_b = behaviour_version(state, version)
    slot = v_b % capacity(state)
    params = jax.tree.map(lambda r: jax.lax.dynamic_index_in_dim(r, slot, 0, False), state.ring)
    return params, v_b


__all__ = ["LagState", "behaviour", "behaviour_version", "capacity", "init", "push"]
