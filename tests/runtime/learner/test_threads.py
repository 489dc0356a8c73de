"""The learner's receiver and publisher threads, over real sockets: what they read, when
they stop reading (back-pressure), what they send, and that a version never goes back."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import zmq

from tianjax.runtime.learner.publisher import Publisher
from tianjax.runtime.learner.receiver import Receiver
from tianjax.transport.auth import RunKey
from tianjax.transport.channels import (
    ParamPublisher,
    ParamSubscriber,
    TrajectoryReceiver,
    TrajectorySender,
)

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


def _subscribed(pub, sub, version=0):
    """Offers `version` until the subscription has reached the publisher (a SUB socket
    misses what was sent before it joined)."""
    deadline = time.monotonic() + WAIT_S
    while sub.latest(20) is None:
        assert time.monotonic() < deadline, "the subscriber never joined"
        pub.offer(version, TREE)


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
    with (
        TrajectoryReceiver(KEY, TREE, ctx=ctx) as channel,
        TrajectorySender(
            KEY, channel.endpoint, sender="actor-0", to=channel.address, ctx=ctx
        ) as tx,
    ):
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


def test_what_arrived_and_was_never_taken_is_named_by_sender_at_the_stop(ctx):
    with (
        TrajectoryReceiver(KEY, TREE, ctx=ctx, hwm=100) as channel,
        TrajectorySender(KEY, channel.endpoint, sender="actor-0", to=channel.address, ctx=ctx) as a,
        TrajectorySender(KEY, channel.endpoint, sender="actor-1", to=channel.address, ctx=ctx) as b,
    ):
        rx = Receiver(channel, ctx, max_ready=1)
        rx.start()
        try:
            assert a.send(TREE, version=0)
            _wait(lambda: rx.ready, "the first message made ready")  # (the queue holds 1)
            assert a.send(TREE, version=1) and b.send(TREE, version=1) and b.send(TREE, version=2)
            # one ready, three still on the socket (or on their way): all four are unread
            senders = rx.unread_at_stop()
        finally:
            rx.close()
    assert sorted(senders) == ["actor-0", "actor-0", "actor-1", "actor-1"], senders
    assert rx.drained == 3 and channel.accepted == 4 and rx.in_hand == 4 and not rx.running


def test_the_receiver_reads_no_further_than_the_learner_has_room(ctx):
    with (
        TrajectoryReceiver(KEY, TREE, ctx=ctx, hwm=100) as channel,
        TrajectorySender(
            KEY, channel.endpoint, sender="actor-0", to=channel.address, hwm=100, ctx=ctx
        ) as tx,
    ):
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
    with (
        TrajectoryReceiver(KEY, TREE, ctx=ctx) as channel,
        TrajectorySender(
            RunKey(bytes(32)), channel.endpoint, sender="intruder", to=channel.address, ctx=ctx
        ) as bad,
        TrajectorySender(
            KEY, channel.endpoint, sender="actor-0", to=channel.address, ctx=ctx
        ) as good,
    ):
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
    with (
        ParamPublisher(KEY, ctx=ctx) as channel,
        ParamSubscriber(KEY, channel.endpoint, TREE, ctx=ctx) as sub,
    ):
        pub = Publisher(channel)
        try:
            _subscribed(pub, sub)
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
    with (
        ParamPublisher(KEY, ctx=ctx) as channel,
        ParamSubscriber(KEY, channel.endpoint, TREE, ctx=ctx) as sub,
    ):
        pub = Publisher(channel)
        _subscribed(pub, sub)
        pub.offer(1, {"obs": TREE["obs"] * 2, "act": TREE["act"]})
        pub.stop()
        sent = pub.sent
        got = sub.latest(1000)
        assert got is not None and got[0] == 1
        np.testing.assert_array_equal(got[1]["obs"], TREE["obs"] * 2)
        pub.offer(2, TREE)  # a later offer starts it again
        pub.stop()
        assert pub.sent == sent + 1 and sub.latest(1000)[0] == 2


def test_the_publisher_sends_a_device_snapshot_under_its_device_version(ctx):
    """The learner offers a device copy of (version, params) without waiting for it: the
    thread waits for the host copy and sends the device's version; an older device version
    offered after a newer one never goes out."""
    import jax
    import jax.numpy as jnp

    from tianjax.runtime.learner.inflight import snapshot

    with (
        ParamPublisher(KEY, ctx=ctx) as channel,
        ParamSubscriber(KEY, channel.endpoint, TREE, ctx=ctx) as sub,
    ):
        pub = Publisher(channel)
        try:
            _subscribed(pub, sub)
            state = {"obs": jnp.asarray(TREE["obs"]) + 7, "act": jnp.asarray(TREE["act"])}
            version, params = snapshot((jnp.asarray(7, jnp.int32), state))
            assert params["obs"].unsafe_buffer_pointer() != state["obs"].unsafe_buffer_pointer()
            pub.offer(version, params)
            got = sub.latest(1000)
            assert got is not None and got[0] == 7
            np.testing.assert_array_equal(got[1]["obs"], TREE["obs"] + 7)
            pub.offer(jax.device_put(np.int32(5)), TREE)  # older than what was sent: dropped
            assert sub.latest(300) is None
        finally:
            pub.stop()


def test_inflight_hands_back_finished_updates_in_order_and_counts_busy_time_once():
    """Updates run one after another: two dispatched 2 s and 1.5 s ago that are both done
    now were busy from the first dispatch to the last end (the overlap counted once)."""
    from tianjax.runtime.learner.inflight import InFlight

    inflight = InFlight(limit=2)
    try:
        t0 = time.perf_counter()
        inflight.add({"update_skipped": np.float32(0), "loss": np.float32(1)}, t0 - 2.0)
        inflight.add({"update_skipped": np.float32(1), "loss": np.float32(2)}, t0 - 1.5)
        done = inflight.settle()
        t1 = time.perf_counter()
        assert [float(m["loss"]) for m in done] == [1.0, 2.0]
        assert [float(m["update_skipped"]) for m in done] == [0.0, 1.0]
        assert 2.0 <= inflight.busy_s <= 2.0 + (t1 - t0)
        assert inflight.take() == [] and inflight.pending == 0 and inflight.finished == 2
    finally:
        inflight.close()


def test_inflight_keeps_at_most_its_limit_unread(monkeypatch):
    """add() waits while `limit` updates are unread: the loop never runs further ahead of
    the device than that (each in-flight update holds a batch). The read-back stands in
    for a running update by waiting on a gate."""
    import threading

    from tianjax.runtime.learner import inflight as inflight_mod

    gate = threading.Event()
    real = inflight_mod.to_host
    monkeypatch.setattr(inflight_mod, "to_host", lambda tree: (gate.wait(WAIT_S), real(tree))[1])
    inflight = inflight_mod.InFlight(limit=1)
    try:
        inflight.add({"update_skipped": np.float32(0)}, time.perf_counter())
        added = threading.Event()
        t = threading.Thread(
            target=lambda: (
                inflight.add({"update_skipped": np.float32(0)}, time.perf_counter()),
                added.set(),
            )
        )
        t.start()
        assert not added.wait(0.3)  # the first is still "running": the second waits
        assert inflight.take() == []  # and take() does not wait for it
        gate.set()
        assert added.wait(WAIT_S)
        t.join(WAIT_S)
        assert len(inflight.settle()) == 2
    finally:
        gate.set()
        inflight.close()


def test_check_finite_covers_every_inexact_dtype():
    """bfloat16 and float8 are not numpy floating types: a NaN in one must still count."""
    import ml_dtypes

    from tianjax.runtime.learner.receiver import check_finite

    for dtype in (
        np.float16,
        np.float32,
        np.float64,
        ml_dtypes.bfloat16,
        ml_dtypes.float8_e5m2,
        np.complex64,
    ):
        for bad in (np.nan, np.inf, -np.inf):
            tree = {"ok": np.zeros(3, np.int32), "x": np.array([0.0, bad, 1.0]).astype(dtype)}
            assert not check_finite(tree), (dtype, bad)
        assert check_finite({"x": np.array([0.0, 1.5, -2.0]).astype(dtype)}), dtype
    assert check_finite({"i": np.array([2**31 - 1], np.int32), "b": np.array([True])})


class _Pending:
    """A version whose value is being computed until `done` is set (as a device snapshot's
    is while its update runs): is_ready() says so, and reading it waits for it."""

    def __init__(self, value: int):
        self.value, self.done = value, threading.Event()

    def is_ready(self) -> bool:
        return self.done.is_set()

    def __array__(self, dtype=None, copy=None):
        self.done.wait()
        return np.asarray(self.value, dtype)


def test_a_version_still_computed_never_displaces_an_earlier_one(ctx):
    """With an update queued behind the running one the learner offers the parameters of
    both: the running one's (1) go out when it ends, not one update later with the queued
    one's (2). Version 0 stands for the publication the thread is waiting on meanwhile."""
    with (
        ParamPublisher(KEY, ctx=ctx) as channel,
        ParamSubscriber(KEY, channel.endpoint, TREE, ctx=ctx) as sub,
    ):
        pub = Publisher(channel)
        try:
            _subscribed(pub, sub, -1)
            v0, v1, v2 = _Pending(0), _Pending(1), _Pending(2)
            pub.offer(v0, TREE)
            _wait(lambda: not pub._held, "the thread takes version 0")
            pub.offer(v1, {"obs": TREE["obs"] + 1, "act": TREE["act"]})
            pub.offer(v2, {"obs": TREE["obs"] + 2, "act": TREE["act"]})
            v1.done.set()  # the running update ends (its successor still runs)
            assert not pub.wait_sent(1, 0.0)  # the thread still waits on version 0
            v0.done.set()
            assert pub.wait_sent(1, WAIT_S)
            got = sub.latest(1000)
            while got is not None and got[0] < 1:
                got = sub.latest(1000)
            assert got is not None and got[0] == 1
            np.testing.assert_array_equal(got[1]["obs"], TREE["obs"] + 1)
            v2.done.set()
            assert pub.wait_sent(2, WAIT_S) and sub.latest(1000)[0] == 2
        finally:
            for v in (v0, v1, v2):
                v.done.set()
            pub.stop()


def test_a_computed_offer_supersedes_those_before_it(ctx):
    """Offers already computed while the thread was busy: only the newest goes out."""
    with (
        ParamPublisher(KEY, ctx=ctx) as channel,
        ParamSubscriber(KEY, channel.endpoint, TREE, ctx=ctx) as sub,
    ):
        pub = Publisher(channel)
        try:
            _subscribed(pub, sub, -1)
            gate = _Pending(0)
            pub.offer(gate, TREE)
            _wait(lambda: not pub._held, "the thread takes version 0")
            sent = pub.sent
            for v in (1, 2, 3):
                pub.offer(v, {"obs": TREE["obs"] + v, "act": TREE["act"]})
            gate.done.set()
            assert pub.wait_sent(3, WAIT_S)
            assert pub.sent == sent + 2  # version 0, then 3 (1 and 2 superseded)
        finally:
            gate.done.set()
            pub.stop()


def test_wait_sent_gives_up_at_its_timeout_and_at_once_without_a_thread(ctx):
    with ParamPublisher(KEY, ctx=ctx) as channel:
        pub = Publisher(channel)
        assert not pub.wait_sent(0, 10.0)  # nothing offered: no thread to send it
        try:
            pub.offer(4, TREE)
            assert pub.wait_sent(4, WAIT_S) and pub.wait_sent(3, 0.0)
            assert not pub.wait_sent(5, 0.05)  # never offered
        finally:
            pub.stop()
