"""Replay ring buffer: insertion, wrap-around, sampling only filled slots, versions kept."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tianjax import buffers
from tianjax.types import Transition

JIT = [False, True]


def _maybe_jit(fn, jit, **kw):
    return jax.jit(fn, **kw) if jit else fn


def _example():
    """One transition without the N axis: obs [2], int action, scalars."""
    return Transition(obs=jnp.zeros((2,), jnp.float32), action=jnp.zeros((), jnp.int32),
                      reward=jnp.zeros((), jnp.float32), next_obs=jnp.zeros((2,), jnp.float32),
                      terminated=jnp.zeros((), bool), version=jnp.zeros((), jnp.int32))


def _batch(ids, version):
    """N transitions whose every field encodes its id (ids start at 1; 0 marks empty slots)."""
    ids = np.asarray(ids, np.float32)
    n = len(ids)
    return Transition(obs=jnp.stack([ids, -ids], axis=1), action=jnp.asarray(ids, jnp.int32),
                      reward=jnp.asarray(ids), next_obs=jnp.stack([ids + 0.5, -ids], axis=1),
                      terminated=jnp.asarray(ids % 2 == 0), version=jnp.full((n,), version, jnp.int32))


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
    tree = Transition(*(jnp.arange(3 * 2 * k).reshape((3, 2) + ((k,) if k > 1 else ()))
                        for k in (2, 1, 1, 2, 1, 1)))
    flat = buffers.flatten_time_batch(tree)
    assert flat.obs.shape == (6, 2) and flat.reward.shape == (6,)
    np.testing.assert_array_equal(flat.reward, np.arange(6))
