"""Replay ring buffer: insertion, wrap-around, sampling only filled slots, versions kept."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tianjax.core.replay import ring as buffers
from tianjax.core.types import Transition

JIT = [False, True]


def _maybe_jit(fn, jit, **kw):
    return jax.jit(fn, **kw) if jit else fn


def _example():
    """One transition without the N axis: obs [2], int action, scalars."""
    return Transition(
        obs=jnp.zeros((2,), jnp.float32),
        action=jnp.zeros((), jnp.int32),
        reward=jnp.zeros((), jnp.float32),
        next_obs=jnp.zeros((2,), jnp.float32),
        terminated=jnp.zeros((), bool),
        version=jnp.zeros((), jnp.int32),
    )


def _batch(ids, version):
    """N transitions whose every field encodes its id (ids start at 1; 0 marks empty slots)."""
    ids = np.asarray(ids, np.float32)
    n = len(ids)
    return Transition(
        obs=jnp.stack([ids, -ids], axis=1),
        action=jnp.asarray(ids, jnp.int32),
        reward=jnp.asarray(ids),
        next_obs=jnp.stack([ids + 0.5, -ids], axis=1),
        terminated=jnp.asarray(ids % 2 == 0),
        version=jnp.full((n,), version, jnp.int32),
    )


def test_init_is_empty_and_shaped():
    rb = buffers.replay_init(5, _example())
    assert rb.data.obs.shape == (5, 2)
    assert rb.data.action.shape == (5,) and rb.data.action.dtype == jnp.int32
    assert rb.data.terminated.dtype == jnp.bool_
    assert int(rb.size) == 0 and int(rb.insert_pos) == 0


@pytest.mark.parametrize("jit", JIT)
def test_add_then_wrap_overwrites_oldest(jit):
    add = _maybe_jit(buffers.replay_add, jit)
    rb = buffers.replay_init(5, _example())
    rb = add(rb, _batch([1, 2, 3], version=7))
    assert int(rb.size) == 3 and int(rb.insert_pos) == 3
    np.testing.assert_array_equal(rb.data.reward, [1, 2, 3, 0, 0])
    np.testing.assert_array_equal(rb.data.version, [7, 7, 7, 0, 0])

    # 4 more into a capacity of 5: slots 3, 4, then wrap to 0, 1 (the two oldest).
    rb = add(rb, _batch([4, 5, 6, 7], version=9))
    assert int(rb.size) == 5  # capped at capacity
    assert int(rb.insert_pos) == 2  # (3 + 4) % 5
    np.testing.assert_array_equal(rb.data.reward, [6, 7, 3, 4, 5])
    np.testing.assert_array_equal(rb.data.action, [6, 7, 3, 4, 5])
    np.testing.assert_array_equal(rb.data.obs[:, 0], [6, 7, 3, 4, 5])
    np.testing.assert_array_equal(rb.data.next_obs[:, 0], [6.5, 7.5, 3.5, 4.5, 5.5])
    np.testing.assert_array_equal(rb.data.terminated, [True, False, False, True, False])
    # each sample keeps the version that produced it
    np.testing.assert_array_equal(rb.data.version, [9, 9, 7, 9, 9])

    rb = add(rb, _batch([8], version=10))
    assert int(rb.size) == 5 and int(rb.insert_pos) == 3
    np.testing.assert_array_equal(rb.data.reward, [6, 7, 8, 4, 5])
    np.testing.assert_array_equal(rb.data.version, [9, 9, 10, 9, 9])


@pytest.mark.parametrize("jit", JIT)
def test_add_exactly_capacity_wraps_to_zero(jit):
    add = _maybe_jit(buffers.replay_add, jit)
    rb = add(buffers.replay_init(4, _example()), _batch([1, 2, 3, 4], version=0))
    assert int(rb.size) == 4 and int(rb.insert_pos) == 0
    rb = add(rb, _batch([5], version=1))
    np.testing.assert_array_equal(rb.data.reward, [5, 2, 3, 4])
    assert int(rb.size) == 4 and int(rb.insert_pos) == 1


@pytest.mark.parametrize("jit", JIT)
def test_sample_only_from_filled_slots(jit):
    sample = _maybe_jit(buffers.replay_sample, jit, static_argnums=2)
    rb = buffers.replay_init(16, _example())
    rb = buffers.replay_add(rb, _batch([1, 2, 3], version=4))
    batch = sample(rb, jax.random.key(0), 600)
    assert batch.obs.shape == (600, 2) and batch.action.shape == (600,)
    ids = np.asarray(batch.reward)
    assert set(ids.tolist()) == {1.0, 2.0, 3.0}  # never an empty slot, every filled one
    # fields stay aligned within a sample, and versions travel with it
    np.testing.assert_array_equal(np.asarray(batch.action), ids)
    np.testing.assert_array_equal(np.asarray(batch.obs[:, 1]), -ids)
    np.testing.assert_array_equal(np.asarray(batch.next_obs[:, 0]), ids + 0.5)
    np.testing.assert_array_equal(np.asarray(batch.version), 4)
    # roughly uniform over the filled slots
    counts = np.bincount(ids.astype(int), minlength=4)[1:]
    assert counts.min() > 150


@pytest.mark.parametrize("jit", JIT)
def test_sample_after_wrap_keeps_versions(jit):
    sample = _maybe_jit(buffers.replay_sample, jit, static_argnums=2)
    rb = buffers.replay_init(4, _example())
    rb = buffers.replay_add(rb, _batch([1, 2, 3], version=1))
    rb = buffers.replay_add(rb, _batch([4, 5], version=2))  # overwrites id 1
    batch = sample(rb, jax.random.key(1), 400)
    ids = np.asarray(batch.reward).astype(int)
    assert set(ids.tolist()) == {2, 3, 4, 5}
    expected_version = np.where(ids >= 4, 2, 1)
    np.testing.assert_array_equal(np.asarray(batch.version), expected_version)


def test_flatten_time_batch():
    tree = Transition(
        *(
            jnp.arange(3 * 2 * k).reshape((3, 2) + ((k,) if k > 1 else ()))
            for k in (2, 1, 1, 2, 1, 1)
        )
    )
    flat = buffers.flatten_time_batch(tree)
    assert flat.obs.shape == (6, 2) and flat.reward.shape == (6,)
    np.testing.assert_array_equal(flat.reward, np.arange(6))


# ----------------------------------------------------------------------------- uint8 frames


def _frames(shape, seed):
    """Random uint8 frames that use the whole range (0 and 255 included)."""
    x = np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)
    x.reshape(-1)[:2] = (0, 255)
    return x


@pytest.mark.parametrize("jit", JIT)
def test_replay_keeps_uint8_frames_uint8(jit):
    """Frames enter, rest in and leave the replay buffer as uint8, one byte a pixel, values
    unchanged (no float copy of a 1M-frame buffer, no rounding)."""
    T, B, frame = 3, 2, (4, 6, 6)
    rollout = Transition(
        obs=_frames((T, B) + frame, 0),
        action=np.zeros((T, B), np.int32),
        reward=np.zeros((T, B), np.float32),
        next_obs=_frames((T, B) + frame, 1),
        terminated=np.zeros((T, B), bool),
        version=np.zeros((T, B), np.int32),
    )
    flat = buffers.flatten_time_batch(rollout)
    assert flat.obs.dtype == np.uint8 and flat.obs.shape == (T * B,) + frame
    one = jax.tree.map(lambda x: x[0], flat)
    rb = _maybe_jit(buffers.replay_init, jit, static_argnums=0)(8, one)
    assert rb.data.obs.dtype == jnp.uint8 and rb.data.next_obs.dtype == jnp.uint8
    assert rb.data.obs.nbytes == 8 * 4 * 6 * 6
    rb = _maybe_jit(buffers.replay_add, jit)(rb, flat)
    assert rb.data.obs.dtype == jnp.uint8
    np.testing.assert_array_equal(rb.data.obs[: T * B], flat.obs)
    sample = _maybe_jit(buffers.replay_sample, jit, static_argnums=2)(rb, jax.random.key(0), 16)
    assert sample.obs.dtype == jnp.uint8 and sample.next_obs.dtype == jnp.uint8
    # every sampled frame is one of those inserted, byte for byte
    inserted = {f.tobytes() for f in flat.obs}
    assert all(np.asarray(f).tobytes() in inserted for f in sample.obs)


def test_onpolicy_pool_keeps_uint8_frames_uint8():
    """Trajectories pooled by the learner (device-resident after the receiver's device_put)
    and joined into one batch along B stay uint8."""
    from tianjax.core.types import Trajectory
    from tianjax.runtime.learner.batches.axes import concat_batches

    T, B, frame = 4, 2, (4, 6, 6)

    def traj(seed):
        f32, i32 = np.zeros((T, B), np.float32), np.zeros((T, B), np.int32)
        return Trajectory(
            obs=_frames((T, B) + frame, seed),
            action=i32,
            reward=f32,
            done=np.zeros((T, B), bool),
            bootstrap_value=f32,
            behaviour_log_prob=f32,
            behaviour_value=f32,
            version=i32,
            last_obs=_frames((B,) + frame, seed + 10),
            trunc_obs=_frames((B,) + frame, seed + 20),
            trunc_t=np.full(B, -1, np.int32),
        )

    host = [traj(0), traj(1)]
    pooled = [jax.device_put(t) for t in host]
    assert all(t.obs.dtype == jnp.uint8 for t in pooled)
    batch = concat_batches(pooled)
    assert batch.obs.dtype == jnp.uint8 and batch.obs.shape == (T, 2 * B) + frame
    assert batch.last_obs.dtype == jnp.uint8 and batch.trunc_obs.dtype == jnp.uint8
    np.testing.assert_array_equal(batch.obs, np.concatenate([t.obs for t in host], axis=1))
    np.testing.assert_array_equal(
        batch.last_obs, np.concatenate([t.last_obs for t in host], axis=0)
    )
    assert concat_batches(host).obs.dtype == np.uint8  # host-side leaves too
