"""A replay ring that stores each observation frame once (DQN with `dqn.frame_once`).

The plain replay (tianjax.core.replay.ring) keeps every transition's `obs` and `next_obs`, so every
frame is stored twice: 2 x 28,224 bytes per transition for Atari's [4, 84, 84] uint8
stacks. This buffer stores the [T, B] chunks of transitions a rollout produces as they
come, and keeps per env column the T + 1 frames obs_0 .. obs_{T-1} plus the chunk's last
next_obs:

    frames  [n_blocks, T + 1, B, ...]        obs dtype kept (uint8 frames stay uint8)
    action, reward, terminated, cut, version  [n_blocks, T, B]

with n_blocks = capacity // (T * B) (a capacity that is not a multiple of T * B keeps
n_blocks * T * B transitions; one that holds no block is an error). The blocks form a ring:
when it is full the next chunk overwrites the oldest block. Frame bytes are
(T + 1) / (2 T) of the two-copy buffer's (0.516 at T = 32).

The next observation of transition (k, t, b) is frame (k, t + 1, b). That is the true
successor except where the episode ended at step t < T - 1, where frame t + 1 is the
first observation of the next episode:
- terminated at t: the target does not bootstrap, so next_obs does not matter;
- truncated at t (a time limit, not terminated): the target should bootstrap from the
  episode's final observation, which this buffer does not keep. Such a transition is
  marked `cut` and sampled with mask 0 (no weight in the loss) rather than bootstrapped
  from the wrong frame. That costs one sample per truncated episode (e.g. 1 in 500 on
  CartPole-v1, which is truncated at 500 steps), and only where the truncation falls
  inside a chunk: at t = T - 1 the stored last frame is the chunk's last next_obs, the
  final observation itself, so that transition is exact and kept.
The cut is read off the chunk itself: transition t < T - 1 is cut where it is not
terminated and its next_obs differs from obs[t + 1] in any element (bit equality: where
they are equal, frame t + 1 is the true successor anyway). So the Transition fields are
enough, whichever env or source produced them.

Same calling pattern as buffers.replay_* (pure functions, usable inside jit):
    init(capacity, example [T, B]) -> FrameReplayState
    add(state, chunk [T, B]) -> FrameReplayState
    sample(state, key, batch_size) -> (Transition [batch_size], mask [batch_size])
The sampled Transition has the plain buffer's fields (obs and next_obs gathered from the
frames), so a loss written for it is unchanged; the mask (float32, 0 at cut transitions)
multiplies its per-sample weights.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from tianjax.core.types import Transition


class FrameReplayState(NamedTuple):
    frames: jax.Array  # [n_blocks, T + 1, B, ...] obs_0 .. obs_{T-1}, then the last next_obs
    action: jax.Array  # [n_blocks, T, B, ...]
    reward: jax.Array  # [n_blocks, T, B]
    terminated: jax.Array  # [n_blocks, T, B] bool
    cut: jax.Array  # [n_blocks, T, B] bool, frame t + 1 is not the true next obs (truncated)
    version: jax.Array  # [n_blocks, T, B] int32 behaviour version
    insert_pos: jax.Array  # int32 scalar, next block to write
    size: jax.Array  # int32 scalar, filled blocks


def _chunk_shape(example) -> tuple[int, int]:
    shape = tuple(example.reward.shape)
    if len(shape) != 2:
        raise ValueError(
            f"frame replay: items are [T, B] chunks of transitions; got a reward of shape {shape}"
        )
    return shape


def init(capacity: int, example: Transition) -> FrameReplayState:
    """An empty buffer for [T, B] chunks shaped like `example` (arrays or ShapeDtypeStructs
    with leaves [T, B, ...]), holding capacity // (T * B) chunks."""
    T, B = _chunk_shape(example)
    n_blocks = capacity // (T * B)
    if n_blocks < 1:
        raise ValueError(
            f"frame replay: a capacity of {capacity} transitions holds no [T, B] = "
            f"[{T}, {B}] chunk ({T * B} transitions); raise the capacity to at least {T * B}"
        )

    def zeros(x, lead):
        return jnp.zeros((n_blocks,) + lead + tuple(x.shape[2:]), x.dtype)

    obs = example.obs
    return FrameReplayState(
        frames=jnp.zeros((n_blocks, T + 1, B) + tuple(obs.shape[2:]), obs.dtype),
        action=zeros(example.action, (T, B)),
        reward=zeros(example.reward, (T, B)),
        terminated=jnp.zeros((n_blocks, T, B), bool),
        cut=jnp.zeros((n_blocks, T, B), bool),
        version=jnp.zeros((n_blocks, T, B), jnp.int32),
        insert_pos=jnp.zeros((), jnp.int32),
        size=jnp.zeros((), jnp.int32),
    )


def num_blocks(state: FrameReplayState) -> int:
    return state.frames.shape[0]


def capacity(state: FrameReplayState) -> int:
    """Transitions the buffer holds when full (n_blocks * T * B)."""
    return state.reward.shape[0] * state.reward.shape[1] * state.reward.shape[2]


def cut_mask(chunk: Transition) -> jax.Array:
    """[T, B] bool: where frame t + 1 of the chunk is not transition t's next observation and
    the target would bootstrap from it (not terminated, t < T - 1, next_obs[t] != obs[t + 1])."""
    T, B = _chunk_shape(chunk)
    obs_axes = tuple(range(2, chunk.obs.ndim))
    differs = jnp.any(chunk.next_obs[:-1] != chunk.obs[1:], axis=obs_axes)  # [T - 1, B]
    cut = differs & ~chunk.terminated[:-1].astype(bool)
    return jnp.concatenate([cut, jnp.zeros((1, B), bool)], axis=0)


def add(state: FrameReplayState, chunk: Transition) -> FrameReplayState:
    """Writes one [T, B] chunk of transitions over the oldest block (when full)."""
    T, B = _chunk_shape(chunk)
    if (T, B) != tuple(state.reward.shape[1:3]) or chunk.obs.shape[2:] != state.frames.shape[3:]:
        raise ValueError(
            f"frame replay: a chunk of [T, B] = [{T}, {B}] and obs {chunk.obs.shape[2:]} "
            f"into a buffer of [{state.reward.shape[1]}, {state.reward.shape[2]}] chunks "
            f"and obs {state.frames.shape[3:]}"
        )
    k = state.insert_pos
    frames = jnp.concatenate([chunk.obs, chunk.next_obs[-1:]], axis=0).astype(state.frames.dtype)

    def put(buf, x):
        return buf.at[k].set(jnp.asarray(x).astype(buf.dtype))

    n = num_blocks(state)
    return FrameReplayState(
        frames=state.frames.at[k].set(frames),
        action=put(state.action, chunk.action),
        reward=put(state.reward, chunk.reward),
        terminated=put(state.terminated, chunk.terminated),
        cut=put(state.cut, cut_mask(chunk)),
        version=put(state.version, chunk.version),
        insert_pos=(k + 1) % n,
        size=jnp.minimum(state.size + 1, n),
    )


def gather(state: FrameReplayState, idx: jax.Array) -> tuple[Transition, jax.Array]:
    """The transitions at flat indices idx [N] (index = (block * T + t) * B + b) and their
    mask [N] (float32, 0 where cut)."""
    _, T, B = state.reward.shape
    k, t, b = idx // (T * B), (idx // B) % T, idx % B
    trans = Transition(
        obs=state.frames[k, t, b],
        action=state.action[k, t, b],
        reward=state.reward[k, t, b],
        next_obs=state.frames[k, t + 1, b],
        terminated=state.terminated[k, t, b],
        version=state.version[k, t, b],
    )
    return trans, (~state.cut[k, t, b]).astype(jnp.float32)


def sample(
    state: FrameReplayState, key: jax.Array, batch_size: int
) -> tuple[Transition, jax.Array]:
    """Uniform sample (with replacement) of `batch_size` transitions from the filled blocks:
    (Transition [batch_size], mask [batch_size])."""
    _, T, B = state.reward.shape
    filled = jnp.maximum(state.size, 1) * (T * B)
    idx = jax.random.randint(key, (batch_size,), 0, filled)
    return gather(state, idx)


def nbytes(state) -> int:
    """Bytes of a buffer state (this one's or buffers.ReplayState's; works on eval_shape output)."""
    return int(
        sum(
            np.prod(x.shape, dtype=np.int64) * np.dtype(x.dtype).itemsize
            for x in jax.tree.leaves(state)
        )
    )


__all__ = ["FrameReplayState", "init", "add", "sample", "gather", "cut_mask", "capacity", "nbytes"]
