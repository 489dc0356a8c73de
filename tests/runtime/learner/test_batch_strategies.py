"""The learner's on-policy batch strategies (runtime/onpolicy_batches.py) on hand-made
pools: which trajectories each takes, what it drops, and whose credits it hands back."""

import numpy as np

from tianjax.core.types import Trajectory
from tianjax.runtime.balance.limits import Limits
from tianjax.runtime.learner.batches.onpolicy import AsyncBatches, ReuseBatches, SyncBatches
from tianjax.runtime.learner.batches.ordered import OrderedBatches
from tianjax.runtime.learner.pool import Pool

T, B = 2, 1


def _traj(version: int, tag: float) -> Trajectory:
    f32 = np.full((T, B), tag, np.float32)
    per_env = np.full((B, 1), tag, np.float32)
    return Trajectory(
        obs=f32[..., None],
        action=np.zeros((T, B), np.int32),
        reward=f32,
        done=np.zeros((T, B), bool),
        bootstrap_value=f32,
        behaviour_log_prob=f32,
        behaviour_value=f32,
        version=np.full((T, B), version, np.int32),
        last_obs=per_env,
        trunc_obs=per_env,
        trunc_t=np.full(B, -1, np.int32),
    )


def _rig(kind, items, k=2, max_staleness=None, max_reuse=0):
    balance = Limits(max_staleness, max_pool=10, max_reuse=max_reuse)
    released = []
    pool = Pool(balance, T * B, released.append)
    for v, sender, tag in items:
        pool.admit(v, sender, _traj(v, tag))
    return kind(pool, k), pool, balance, released


def test_sync_takes_one_current_trajectory_per_actor_and_drops_older_ones():
    batches, pool, balance, released = _rig(
        SyncBatches, [(3, b"a", 1), (2, b"c", 2), (3, b"a", 3), (3, b"b", 4)]
    )
    choice = batches.next(3)
    assert choice is not None and not choice.reuse
    np.testing.assert_array_equal(
        choice.batch.reward[0], [1, 4]
    )  # a's first, then b's, joined along B
    np.testing.assert_array_equal(choice.behaviour, 3)
    assert released == [b"c", b"a", b"b"]  # the dropped one's credit first, then the taken ones'
    assert balance.measures.expired == T * B
    assert [(item.version, item.sender) for item in pool] == [
        (3, b"a")
    ]  # a's second waits for another round
    assert batches.next(3) is None and batches.drained()  # one actor short


def test_async_takes_the_oldest_within_max_staleness():
    batches, pool, balance, released = _rig(
        AsyncBatches, [(1, b"a", 1), (4, b"b", 2), (5, b"a", 3), (5, b"c", 4)], max_staleness=3
    )
    choice = batches.next(5)
    np.testing.assert_array_equal(choice.batch.reward[0], [2, 3])
    assert (
        released == [b"a", b"b", b"a"] and balance.measures.expired == T * B
    )  # version 1 aged past 3
    assert len(pool) == 1 and batches.drained() and batches.next(5) is None


def test_reuse_passes_over_the_last_batch_only_while_idle_and_within_budget():
    fresh, pool, balance, _ = _rig(AsyncBatches, [(0, b"a", 1), (0, b"b", 2)], max_reuse=2)
    batches = ReuseBatches(fresh, balance, split=False)
    first = batches.next(0, busy=True).batch  # fresh data is taken whether or not an update runs
    assert batches.next(1, busy=True) is None  # an update runs: fresh data may come first
    again = batches.next(1)
    assert again.reuse and again.batch is first
    assert batches.next(1).reuse and batches.next(1) is None  # max_reuse passes, then no more
    balance.max_reuse = 5
    split = ReuseBatches(fresh, balance, split=True)
    split.last, split.passes = batches.last, 0
    assert split.next(1).batch is None  # a split update learns on the batch as prepared


def test_reuse_stops_when_the_batch_ages_past_max_staleness():
    fresh, _, balance, _ = _rig(
        AsyncBatches, [(0, b"a", 1), (0, b"b", 2)], max_staleness=1, max_reuse=5
    )
    batches = ReuseBatches(fresh, balance, split=False)
    assert not batches.next(0).reuse
    assert batches.next(1).reuse and batches.next(2) is None


def test_ordered_takes_the_round_of_its_version_from_every_shard_in_shard_order():
    balance = Limits(None, max_pool=10, max_reuse=0)
    released = []
    pool = Pool(balance, T * B, released.append)
    # (version, sender, tag, (round, shard)): shard 1 of round 3 arrives first, a resent
    # round 2 is left over, and round 4 waits
    for v, sender, tag, order in [
        (2, b"a", 1, (3, 1)),
        (1, b"b", 2, (2, 0)),
        (3, b"b", 3, (4, 0)),
        (2, b"b", 4, (3, 0)),
    ]:
        pool.admit(v, sender, _traj(v, tag), order=order)
    batches = OrderedBatches(pool, 2)
    assert batches.next(2) is None  # round 2 lacks shard 1
    choice = batches.next(3)
    np.testing.assert_array_equal(choice.batch.reward[0], [4, 1])  # shard 0, then shard 1
    np.testing.assert_array_equal(choice.behaviour[0], [2, 2])
    assert balance.measures.expired == T * B  # the left-over round 2
    assert [i.order for i in pool] == [(4, 0)]
    assert batches.next(4) is None  # shard 1 of round 4 has not come
