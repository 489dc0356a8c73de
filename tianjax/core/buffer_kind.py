"""What an algorithm learns from: the buffer kind, one small strategy object per kind.

    ON_POLICY    batches are whole trajectories [T, B] (tianjax.core.types.Trajectory),
                 learned from once (plus the runtime's bounded reuse) and dropped;
    TRANSITIONS  a [T, B] rollout is flattened into T x B transitions (Transition) kept in a
                 replay buffer and sampled uniformly;
    SEQUENCES    one [T] sequence per env (Sequences, batch-major [B, T]) with the recurrent
                 state it started from, kept in a replay buffer (recurrent policies: QMIX).

A kind owns what differs between them: the layout of one item (`items`, `item_steps`), the
template of an actor's rollout message (`batch_template`) and how a rollout becomes replay
items (`to_items`). Every other part asks the kind, never the algorithm's name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import jax
import numpy as np

from tianjax.core.types import Trajectory, Transition


@dataclass(frozen=True, eq=False)
class BufferKind:
    name: Literal["onpolicy", "replay", "sequences"]  # as an Algorithm and the docs spell it
    items: Literal["trajectories", "transitions", "sequences"]  # what one batch item is
    replayed: bool  # kept in a replay buffer and sampled (off-policy)
    host_envs: bool  # actors on host envs (envpool, gymnasium) can produce it

    def __eq__(self, other) -> bool:
        # a kind equals its name too, so code written against the names keeps working
        if isinstance(other, str):
            return other == self.name
        return isinstance(other, BufferKind) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)

    def item_steps(self, rollout_len: int) -> int:
        """Env steps (samples) in one replay item: 1 for a transition, T for a sequence."""
        return rollout_len if self.items == "sequences" else 1

    def to_items(self, flatten_time_batch, frame_once: bool = False):
        """rollout batch -> replay items: transitions flatten [T, B] to T x B (unless each
        frame is kept once, which stores the [T, B] chunk itself); sequences are items
        already."""
        if self.items == "sequences" or frame_once:
            return lambda x: x
        return flatten_time_batch

    def batch_template(
        self,
        T: int,
        B: int,
        obs: jax.ShapeDtypeStruct,
        act: jax.ShapeDtypeStruct,
        last: jax.ShapeDtypeStruct,
    ):
        """ShapeDtypeStructs of the batch a host-env actor sends for one rollout ([T, B]
        observations `obs`, actions `act`, one observation per env `last`)."""
        sds = jax.ShapeDtypeStruct
        f32, i32, b = (sds((T, B), d) for d in (np.float32, np.int32, np.bool_))
        if self.items == "transitions":
            return Transition(
                obs=obs, action=act, reward=f32, next_obs=obs, terminated=b, version=i32
            )
        if self.items == "trajectories":
            return Trajectory(
                obs=obs,
                action=act,
                reward=f32,
                done=b,
                bootstrap_value=f32,
                behaviour_log_prob=f32,
                behaviour_value=f32,
                version=i32,
                last_obs=last,
                trunc_obs=last,
                trunc_t=sds((B,), np.int32),
            )
        raise ValueError(f"host-env actors do not produce {self.items}")


ON_POLICY = BufferKind("onpolicy", "trajectories", replayed=False, host_envs=True)
TRANSITIONS = BufferKind("replay", "transitions", replayed=True, host_envs=True)
SEQUENCES = BufferKind("sequences", "sequences", replayed=True, host_envs=False)
KINDS = {k.name: k for k in (ON_POLICY, TRANSITIONS, SEQUENCES)}


def buffer_kind(kind: BufferKind | str) -> BufferKind:
    """The kind itself, or the kind named "onpolicy", "replay" or "sequences"."""
    if isinstance(kind, BufferKind):
        return kind
    if kind not in KINDS:
        raise ValueError(f"unknown buffer kind {kind!r} (known: {', '.join(KINDS)})")
    return KINDS[kind]


__all__ = ["BufferKind", "KINDS", "ON_POLICY", "SEQUENCES", "TRANSITIONS", "buffer_kind"]
