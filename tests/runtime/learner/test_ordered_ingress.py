"""The deterministic-lag mode's ingress over real sockets: a real `Learner` and one actor's
real channels. A trajectory's (round, shard) decides where it goes: the pool, or dropped by
a named reason (malformed, a round already learned, a copy); one that would leave its
round without a batch (non-finite) stops the run with OrderBroken instead of a stall."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import zmq

from tianjax.config import load_config
from tianjax.core.rollout import Episodes
from tianjax.errors import OrderBroken
from tianjax.runtime.actor.shards import tag
from tianjax.runtime.learner.learner import Learner
from tianjax.transport.auth import new_run_key
from tianjax.transport.channels import ControlClient, TrajectorySender

CONFIG = str(Path(__file__).resolve().parents[3] / "configs" / "ppo_cartpole_async.yaml")
TINY = [
    "env_backend=gymnax",
    "runtime.deterministic=true",
    "runtime.batch_trajectories=2",
    "num_actors=1",
    "num_envs=4",
    "rollout_len=8",
    "ppo.num_minibatches=1",
]
WAIT_S = 20.0


def _tree(template, reward: float = 0.0):
    batch_t = template[0]
    leaves = {name: np.zeros(s.shape, s.dtype) for name, s in zip(batch_t._fields, batch_t)}
    leaves["reward"] = np.full(batch_t.reward.shape, reward, batch_t.reward.dtype)
    T, B = batch_t.reward.shape
    episodes = Episodes(
        np.zeros((T, B), bool), np.zeros((T, B), np.float32), np.zeros((T, B), np.int32)
    )
    return type(batch_t)(**leaves), episodes, np.asarray(0, np.int64)


@pytest.fixture
def rig():
    key = new_run_key()
    learner = Learner(load_config(CONFIG, TINY), key)
    ctx = zmq.Context()
    try:
        net = dict(ctx=ctx, handshake=learner.net.handshake)
        ctl = ControlClient(
            key, learner.endpoints["control"], identity="actor-0", to=learner.address, **net
        )
        traj = TrajectorySender(
            key, learner.endpoints["traj"], sender="actor-0", to=learner.address, hwm=100, **net
        )
        assert ctl.send({"type": "register", "actor": 0})
        yield learner, traj
    finally:
        ctx.destroy(linger=0)
        learner.close()


def _arrive(learner, n: int) -> None:
    """Pumps until `n` more trajectories were taken in."""
    start, deadline = learner.rx.taken, time.monotonic() + WAIT_S
    while learner.rx.taken < start + n:
        assert time.monotonic() < deadline, "trajectories did not arrive"
        learner.pump(10)


def test_order_decides_pool_or_a_named_drop_and_a_lost_round_stops_the_run(rig):
    learner, traj = rig
    sends = [
        (1.0, tag(0, 1)),
        (2.0, tag(0, 1)),  # a copy of (0, 1)
        (3.0, {"round": 0, "shard": 2}),  # no such shard
        (4.0, None),  # no body
        (5.0, tag(0, 0)),
        (6.0, tag(1, 0)),
    ]
    for reward, body in sends:
        assert traj.send(_tree(learner.template, reward), version=0, timeout_ms=5000, body=body)
    _arrive(learner, len(sends))
    assert dict(learner.ingress.dropped_order) == {"duplicate": 1, "malformed": 2}
    assert sorted(item.order for item in learner.pool) == [(0, 0), (0, 1), (1, 0)]
    # round 0's batch: shard 0, then shard 1, whatever the order they came in
    choice = learner.batches.next(0)
    np.testing.assert_array_equal(choice.batch.reward[0], [5.0] * 4 + [1.0] * 4)
    learner._version_cache = 1  # (as after the update on it)
    assert traj.send(_tree(learner.template), version=0, timeout_ms=5000, body=tag(0, 0))
    _arrive(learner, 1)
    assert learner.ingress.dropped_order["past_round"] == 1
    assert traj.send(_tree(learner.template, np.nan), version=0, timeout_ms=5000, body=tag(1, 1))
    with pytest.raises(OrderBroken, match="non-finite"):
        _arrive(learner, 1)
