"""The learner's receiver and publisher threads, over real sockets: what they read, when
they stop reading (back-pressure), what they send, and that a version never goes back."""

from __future__ import annotations

import time

import numpy as np
import pytest
import zmq

from tianjax.runtime.publisher import Publisher
from tianjax.runtime.receiver import Receiver
from tianjax.transport.auth import RunKey
from tianjax.transport.channels import ParamPublisher, ParamSubscriber, TrajectoryReceiver, TrajectorySender

KEY = RunKey(bytes(range(32)))
TREE = {"obs": np.arange(12, dtype=np.float32).reshape(3, 4), "act": np.arange(3, dtype=np.int32)}
WAIT_S = 5.0


@pytest.fixture
def ctx():
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def _wait(cond, what):
    deadline = time.monotonic() + WAIT_S
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def _take_all(rx, n):
    got = []
    deadline = time.monotonic() + WAIT_S
    while len(got) < n:
        assert time.monotonic() < deadline, f"took {len(got)} of {n}"
        if rx.wake.poll(50):
            rx.drain_wake()
        while (item := rx.take()) is not None:
            got.append(item)
    return got


def test_the_receiver_reads_checks_and_hands_over_in_order(ctx):
    with TrajectoryReceiver(KEY, TREE, ctx=ctx) as channel, \
            TrajectorySender(KEY, channel.endpoint, sender="actor-0", ctx=ctx) as tx:
        rx = Receiver(channel, ctx, max_ready=8)
        rx.start()
        try:
            bad = {"obs": TREE["obs"].copy(), "act": TREE["act"]}
            bad["obs"][1, 2] = np.nan
            for v in range(3):
                assert tx.send({"obs": TREE["obs"] + v, "act": TREE["act"]}, version=v)
            assert tx.send(bad, version=3)
            got = _take_all(rx, 4)
        finally:
            rx.close()
    assert [m.version for m, _ in got] == [0, 1, 2, 3]
    assert [finite for _, finite in got] == [True, True, True, False]
    np.testing.assert_array_equal(got[2][0].tree["obs"], TREE["obs"] + 2)
    assert rx.taken == 4 and rx.in_hand == 0 and not rx.running


def test_the_receiver_reads_no_further_than_the_learner_has_room(ctx):
    with TrajectoryReceiver(KEY, TREE, ctx=ctx, hwm=100) as channel, \
            TrajectorySender(KEY, channel.endpoint, sender="actor-0", hwm=100, ctx=ctx) as tx:
        rx = Receiver(channel, ctx, max_ready=2)
        try:
            rx.set_room(False)
            rx.start()
            for v in range(6):
                assert tx.send(TREE, version=v)
            time.sleep(0.3)
            assert channel.accepted == 0 and not rx.ready  # no room: nothing read
            assert not rx.backlog_empty  # what waits unread is late, not lost
            rx.set_room(True)
            _wait(lambda: channel.accepted == 2, "two read")
            time.sleep(0.2)
            assert channel.accepted == 2  # the ready queue is full: no more is read
            got = _take_all(rx, 6)  # taking makes space, and the rest is read
            assert [m.version for m, _ in got] == list(range(6))
            _wait(lambda: rx.backlog_empty, "the thread sees an empty socket")
        finally:
            rx.close()


def test_the_receiver_counts_what_it_rejects(ctx):
    with TrajectoryReceiver(KEY, TREE, ctx=ctx) as channel, \
            TrajectorySender(RunKey(bytes(32)), channel.endpoint, sender="intruder", ctx=ctx) as bad, \
            TrajectorySender(KEY, channel.endpoint, sender="actor-0", ctx=ctx) as good:
        rx = Receiver(channel, ctx)
        rx.start()
        try:
            assert bad.send(TREE, version=0) and bad.send(TREE, version=1)
            assert good.send(TREE, version=7)
            got = _take_all(rx, 1)
            _wait(lambda: channel.rejected["auth"] == 2, "two rejected")
        finally:
            rx.close()
    assert got[0][0].version == 7 and channel.accepted == 1


def test_the_publisher_sends_the_newest_and_never_goes_back(ctx):
    with ParamPublisher(KEY, ctx=ctx) as channel, ParamSubscriber(KEY, channel.endpoint, TREE, ctx=ctx) as sub:
        pub = Publisher(channel)
        try:
            deadline = time.monotonic() + WAIT_S
            while sub.latest(20) is None:  # until the subscription has reached the publisher
                assert time.monotonic() < deadline
                pub.offer(0, TREE)
            for v in range(1, 30):
                pub.offer(v, {"obs": TREE["obs"] + v, "act": TREE["act"]})
            pub.offer(3, TREE)  # older than what was offered: ignored
            seen = []
            while (got := sub.latest(500)) is not None:
                seen.append(got[0])
                if got[0] == 29:
                    break
            assert seen and seen[-1] == 29 and seen == sorted(seen)
            np.testing.assert_array_equal(got[1]["obs"], TREE["obs"] + 29)
            assert sub.latest(200) is None  # version 3 never went out
        finally:
            pub.stop()


def test_the_publisher_sends_what_it_holds_before_it_stops(ctx):
    with ParamPublisher(KEY, ctx=ctx) as channel, ParamSubscriber(KEY, channel.endpoint, TREE, ctx=ctx) as sub:
        pub = Publisher(channel)
        deadline = time.monotonic() + WAIT_S
        while sub.latest(20) is None:
            assert time.monotonic() < deadline
            pub.offer(0, TREE)
        pub.offer(1, {"obs": TREE["obs"] * 2, "act": TREE["act"]})
        pub.stop()
        sent = pub.sent
        got = sub.latest(1000)
        assert got is not None and got[0] == 1
        np.testing.assert_array_equal(got[1]["obs"], TREE["obs"] * 2)
        pub.offer(2, TREE)  # a later offer starts it again
        pub.stop()
        assert pub.sent == sent + 1 and sub.latest(1000)[0] == 2
