"""The learner groups' channels (tianjax/transport/deltas.py) over real sockets: a delta and
an average arrive with their bodies; a message of another kind, another recipient or
another structure is refused and counted, never raised. None of these can hang: random
loopback ports, linger 0, a timeout on every receive."""

from __future__ import annotations

import time

import numpy as np
import pytest
import zmq

from tianjax.transport.auth import RunKey
from tianjax.transport.channels import ParamPublisher, TrajectorySender
from tianjax.transport.deltas import (
    AveragePublisher,
    AverageSubscriber,
    DeltaReceiver,
    DeltaSender,
    group_topic,
)
from tianjax.transport.sockets import address, process_incarnation

KEY = RunKey(bytes(range(32)))
PARAMS = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.zeros(3, np.float32)}
AVERAGER = address("averager", process_incarnation())
WAIT_MS = 3000


@pytest.fixture
def ctx():
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def _until(fn, timeout_s: float = 5.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = fn()
        if got is not None:
            return got
    return None


def test_a_delta_arrives_with_its_round_and_body(ctx):
    with (
        DeltaReceiver(KEY, PARAMS, ctx=ctx, name="averager") as rx,
        DeltaSender(KEY, rx.endpoint, sender="group-1", to=AVERAGER, ctx=ctx) as tx,
    ):
        body = {"group": 1, "updates": 40, "final": False}
        assert tx.send({"w": PARAMS["w"] + 1, "b": PARAMS["b"]}, 7, body=body)
        msg = rx.recv(WAIT_MS)
        assert msg is not None and msg.kind == "delta" and msg.version == 7
        assert msg.sender == "group-1" and msg.body == body
        np.testing.assert_array_equal(msg.tree["w"], PARAMS["w"] + 1)


def test_deltas_of_another_kind_recipient_or_shape_are_refused_and_counted(ctx):
    with (
        DeltaReceiver(KEY, PARAMS, ctx=ctx, name="averager") as rx,
        TrajectorySender(KEY, rx.endpoint, sender="group-0", to=AVERAGER, ctx=ctx) as traj,
        DeltaSender(KEY, rx.endpoint, sender="group-0", to="averager@0000", ctx=ctx) as old,
        DeltaSender(KEY, rx.endpoint, sender="group-1", to=AVERAGER, ctx=ctx) as tx,
    ):
        assert traj.send(PARAMS, 0)  # a trajectory, not a delta
        assert old.send(PARAMS, 0)  # for another averager incarnation
        assert tx.send({"w": np.zeros((3, 3), np.float32), "b": PARAMS["b"]}, 0)  # another size
        assert tx.send(PARAMS, 2, body={"group": 1})
        msg = rx.recv(WAIT_MS)  # the good one arrives; the three before it are counted
        assert msg is not None and msg.version == 2
        assert rx.rejected["kind"] == 1 and rx.rejected["old_incarnation"] == 1
        assert sum(rx.rejected.values()) == 3, rx.rejected


def test_the_newest_average_wins_with_its_body(ctx):
    with (
        AveragePublisher(KEY, ctx=ctx, sender="averager") as pub,
        AverageSubscriber(KEY, pub.endpoint, PARAMS, ctx=ctx) as sub,
    ):
        assert _until(lambda: (pub.publish(0, PARAMS, body={"round": 0}), sub.latest(20))[1])
        for r in (1, 2):
            pub.publish(r, {"w": PARAMS["w"] + r, "b": PARAMS["b"]}, body={"round": r})

        def newest():  # (a PUB at its high-water mark drops what it is given: send it again)
            pub.publish(3, {"w": PARAMS["w"] + 3, "b": PARAMS["b"]}, body={"round": 3})
            sub.latest(50)  # rounds 1 and 2 may come first, when nothing was dropped
            return True if sub.version == 3 else None

        assert _until(newest) is not None
        assert sub.version == 3 and sub.body == {"round": 3}
        assert sub.source.startswith("averager@")


def test_parameters_are_not_averages(ctx):
    with (
        ParamPublisher(KEY, ctx=ctx) as pub,
        AverageSubscriber(KEY, pub.endpoint, PARAMS, ctx=ctx) as sub,
    ):
        for _ in range(50):
            pub.publish(1, PARAMS)
            if sub.latest(20) is not None or sub.rejected:
                break
        assert sub.version == -1 and sub.rejected["kind"] >= 1


def test_an_average_goes_only_to_the_group_of_its_topic(ctx):
    topics = (group_topic(0), group_topic(1))
    with (
        AveragePublisher(KEY, ctx=ctx, sender="averager", topics=topics) as pub,
        AverageSubscriber(KEY, pub.endpoint, PARAMS, ctx=ctx, topic=group_topic(0)) as g0,
        AverageSubscriber(KEY, pub.endpoint, PARAMS, ctx=ctx, topic=group_topic(1)) as g1,
        AverageSubscriber(KEY, pub.endpoint, PARAMS, ctx=ctx, topic=b"group-7\0") as other,
        AverageSubscriber(KEY, pub.endpoint, PARAMS, ctx=ctx) as everything,
    ):
        deadline = time.monotonic() + 5
        while pub.subscriptions < 2 and time.monotonic() < deadline:
            pub.serve_subscriptions()
            time.sleep(0.01)
        time.sleep(0.2)
        pub.serve_subscriptions()
        assert sorted(pub.subscribed) == sorted(topics)  # the two groups', the others refused
        assert pub.subscriptions == 2 and pub.subscriptions_refused == 2
        pub.publish(3, PARAMS, body={"round": 3}, topic=group_topic(1))
        assert _until(lambda: g1.latest(50), 3.0) is not None and g1.version == 3
        assert g0.latest(200) is None and other.latest(0) is None and everything.latest(0) is None
