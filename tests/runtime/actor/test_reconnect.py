"""An actor's side of a broken connection (tianjax.runtime.actor): its link monitor counts
a connection that broke after it was up, not one it closed itself; a trajectory sender
connected afresh drops what it still queued and keeps counting its sequence numbers; and
credits granted before the learner heard of the newest reconnection are ignored.

Real ZeroMQ sockets on loopback: the learner's end is closed to break the connection (a cut
link does the same through the channel's heartbeats: tests/cluster/test_chaos.py)."""

from __future__ import annotations

import time

import numpy as np
import pytest
import zmq

from tianjax.runtime.actor.actor import Actor, LearnerPresence
from tianjax.transport.auth import new_run_key
from tianjax.transport.channels import TrajectoryReceiver, TrajectorySender

TREE = {"x": np.zeros(4, np.float32)}


def _until(cond, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.fixture
def ctx():
    c = zmq.Context()
    yield c
    c.destroy(linger=0)


def test_a_broken_connection_is_a_drop_and_one_closed_here_is_not(ctx):
    key = new_run_key()
    rx = TrajectoryReceiver(key, TREE, ctx=ctx, name="learner", incarnation="a")
    endpoint = rx.endpoint
    tx = TrajectorySender(key, endpoint, sender="actor-0", to=rx.address, ctx=ctx, heartbeats=True)
    link = LearnerPresence(tx)
    try:
        _until(lambda: (link.poll(time.monotonic()), link.connected)[1])
        assert link.drops == 0
        # connected afresh by the actor itself: no drop (a send lets the socket finish
        # closing the old connections)
        link.closing()
        tx.reconnect()
        assert tx.send(TREE, version=0, timeout_ms=2000) and rx.recv(5000) is not None
        time.sleep(0.3)
        link.poll(time.monotonic())
        assert link.drops == 0 and link.connected
        # the learner's end goes away (as a cut link's heartbeats close it): a drop
        rx.close()
        _until(lambda: (link.poll(time.monotonic()), link.drops)[1] >= 1)
        assert not link.connected
        drops = link.drops
        # ... and a learner at the same address again: up, no more drops
        rx = TrajectoryReceiver(key, TREE, endpoint=endpoint, ctx=ctx, incarnation="a")
        _until(lambda: (link.poll(time.monotonic()), link.connected)[1])
        time.sleep(0.3)
        link.poll(time.monotonic())
        assert link.drops == drops
    finally:
        link.close()
        tx.close()
        rx.close()


def test_a_sender_connected_afresh_drops_its_queue_and_counts_on(ctx):
    key = new_run_key()
    # nobody listens yet: what is sent stays queued in the sender
    with zmq.Context() as probe_ctx, probe_ctx.socket(zmq.PULL) as probe:
        port = probe.bind_to_random_port("tcp://127.0.0.1")
        probe.unbind(probe.getsockopt_string(zmq.LAST_ENDPOINT))
    endpoint = f"tcp://127.0.0.1:{port}"
    tx = TrajectorySender(
        key, endpoint, sender="actor-0", to="learner@a", hwm=10, ctx=ctx, heartbeats=True
    )
    try:
        for _ in range(3):
            assert tx.send(TREE, version=0, timeout_ms=100)
        tx.reconnect()  # the three queued ones are dropped
        assert tx.seq == 2
        rx = TrajectoryReceiver(key, TREE, endpoint=endpoint, ctx=ctx, incarnation="a")
        try:
            assert tx.send(TREE, version=1, timeout_ms=1000)
            got = rx.recv(5000)
            assert got is not None and got.seq == 3 and int(got.version) == 1
            assert rx.recv(300) is None  # nothing of what was queued before came
        finally:
            rx.close()
    finally:
        tx.close()


class _Control:
    def __init__(self, msgs):
        self.msgs = list(msgs)

    def recv(self, timeout_ms=0):
        return self.msgs.pop(0) if self.msgs else None


def test_credits_from_before_the_newest_reconnection_are_ignored():
    actor = Actor.__new__(Actor)  # no sockets: one function's test
    actor.credits, actor.reconnections, actor._last_heard = 0, 2, 0.0
    actor.control = _Control(
        [
            {"type": "credit", "n": 3},  # (no count: the first connections')
            {"type": "credit", "n": 2, "epoch": 1},
            {"type": "credit", "n": 4, "epoch": 2},
            {"type": "credit", "n": 5, "epoch": 3},
        ]
    )
    actor._check_control()
    assert actor.credits == 4
