"""Channels over real sockets. None of these can hang: random loopback ports, linger 0, a
timeout on every receive, and every socket closed in teardown (the context is destroyed)."""

from __future__ import annotations

import os
import pickle
import tempfile
import time

import numpy as np
import pytest
import zmq

from tianjax.transport.auth import MessageAuth, RunKey, new_run_key
from tianjax.transport.channels import (
    ControlClient,
    ControlServer,
    ParamPublisher,
    ParamSubscriber,
    TrajectoryReceiver,
    TrajectorySender,
)
from tianjax.transport.codec import encode
from tianjax.transport.sockets import address, process_incarnation

KEY = RunKey(bytes(range(32)))
AUTH = MessageAuth(KEY)
TREE = {"obs": np.arange(12, dtype=np.float32).reshape(3, 4), "act": np.arange(3, dtype=np.int32)}
WAIT_MS = 3000  # generous for a loaded machine; a passing test never waits this long
# a receiver's (and control server's) default address in this process: what senders here name
LEARNER = address("learner", process_incarnation())


@pytest.fixture
def ctx():
    context = zmq.Context()
    yield context
    context.destroy(linger=0)  # closes any socket a failing test left open


@pytest.fixture(params=["tcp", "ipc"])
def transport(request):
    return request.param


@pytest.fixture
def private():
    """A private directory (mode 0700) for ipc sockets, as the launcher makes."""
    from tianjax.launch.ports import PrivateDir

    with PrivateDir() as d:
        yield d.path


def test_ipc_needs_a_private_directory(ctx):
    with pytest.raises(ValueError, match="private directory"):
        TrajectoryReceiver(KEY, TREE, transport="ipc", ctx=ctx)


def _until(fn, timeout_s=WAIT_MS / 1000):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (out := fn()) is not None:
            return out
    return None


# ------------------------------------------------------------------------------ trajectories
def test_trajectory_roundtrip(ctx, transport, private):
    with (
        TrajectoryReceiver(KEY, TREE, transport=transport, ipc_dir=private, ctx=ctx) as rx,
        TrajectorySender(KEY, rx.endpoint, sender="actor-0", to=LEARNER, ctx=ctx) as a0,
        TrajectorySender(KEY, rx.endpoint, sender="actor-1", to=LEARNER, ctx=ctx) as a1,
    ):
        assert rx.endpoint.startswith(f"{transport}://")
        if transport == "tcp":
            assert rx.endpoint.startswith("tcp://127.0.0.1:")
        for v in range(3):
            assert a0.send(TREE, v, timeout_ms=WAIT_MS) and a1.send(
                TREE, 10 + v, timeout_ms=WAIT_MS
            )
        got = [rx.recv(WAIT_MS) for _ in range(6)]
        assert all(m is not None for m in got)
        by_sender = {s: [m.version for m in got if m.sender == s] for s in ("actor-0", "actor-1")}
        assert by_sender == {"actor-0": [0, 1, 2], "actor-1": [10, 11, 12]}
        np.testing.assert_array_equal(got[0].tree["obs"], TREE["obs"])
        assert rx.accepted == 6 and not rx.rejected
        assert rx.recv(50) is None


def test_given_endpoint_is_resolved(ctx):
    with TrajectoryReceiver(KEY, TREE, endpoint="tcp://127.0.0.1:*", ctx=ctx) as rx:
        assert rx.endpoint.startswith("tcp://127.0.0.1:") and not rx.endpoint.endswith("*")
    path = os.path.join(tempfile.gettempdir(), f"tianjax-test-{os.getpid()}.ipc")
    with TrajectoryReceiver(KEY, TREE, endpoint=f"ipc://{path}", ctx=ctx) as rx:
        assert rx.endpoint == f"ipc://{path}" and os.path.exists(path)
    assert not os.path.exists(path)  # closing removes the socket file


class Boom:
    unpickled = []

    def __reduce__(self):
        return (Boom.unpickled.append, (1,))


def _bad_messages():
    good = encode(TREE, auth=AUTH, kind="traj", version=1, sender="evil", seq=1, to=LEARNER)
    other = encode(
        TREE, auth=MessageAuth(new_run_key()), kind="traj", version=1, sender="x", seq=1, to=LEARNER
    )
    resign = lambda f: [AUTH.tag(f[1], f[2:]), *f[1:]]  # noqa: E731  a buggy sender with the key
    enc = lambda tree, **kw: encode(
        tree,
        auth=AUTH,
        kind="traj",
        sender="x",  # noqa: E731
        **({"version": 1, "seq": 1, "to": LEARNER} | kw),
    )
    payload = pickle.dumps(Boom())
    rng = np.random.default_rng(0)
    return {
        "wrong key": (other, "auth"),
        "no signature": (good[1:], "auth"),
        "missing leaf frame": (resign(good[:-1]), "truncated"),
        "short leaf": (resign([*good[:3], bytes(good[3])[:-4]]), "truncated"),
        "wrong schema": (enc({"o": TREE["obs"], "act": TREE["act"]}), "schema"),
        "wrong dtype": (enc({"obs": TREE["obs"].astype(np.float16), "act": TREE["act"]}), "dtype"),
        "wrong shape": (enc({"obs": TREE["obs"].reshape(2, 6), "act": TREE["act"]}), "shape"),
        # frames each under the socket's frame limit (below), together over the message limit
        "oversized": (
            enc({"obs": np.zeros((3, 4), np.float32), "act": np.zeros(3, np.int32)})
            + [bytes(40 << 10), bytes(40 << 10)],
            "size",
        ),
        "wrong kind": (
            encode(TREE, auth=AUTH, kind="params", version=1, sender="x", seq=1, to=LEARNER),
            "kind",
        ),
        # signed with the run key, for another learner or another incarnation of this one
        "another learner": (enc(TREE, to=address("learner-1", process_incarnation())), "recipient"),
        "a learner before its restart": (
            enc(TREE, to=address("learner", "0" * 16)),
            "old_incarnation",
        ),
        "the parameter broadcast's recipient": (enc(TREE, to="*"), "recipient"),
        "pickle header": ([good[0], payload, *good[2:]], "auth"),
        "signed pickle header": ([AUTH.tag(payload, good[2:]), payload, *good[2:]], "header"),
        "random bytes": ([rng.bytes(16), rng.bytes(100), rng.bytes(48)], "auth"),
        "one random frame": ([rng.bytes(64)], "truncated"),
    }


BAD = _bad_messages()


@pytest.mark.parametrize("case", sorted(BAD))
def test_receiver_counts_bad_message(ctx, case):
    frames, reason = BAD[case]
    with (
        TrajectoryReceiver(KEY, TREE, ctx=ctx, max_bytes=1 << 16) as rx,
        TrajectorySender(KEY, rx.endpoint, sender="actor-0", to=LEARNER, ctx=ctx) as good,
    ):
        raw = ctx.socket(zmq.PUSH)
        raw.linger = 0
        raw.connect(rx.endpoint)
        raw.send_multipart(frames, copy=False)
        assert good.send(TREE, 7, timeout_ms=WAIT_MS)
        # a bad message never raises and never stops a good one
        msg = rx.recv(WAIT_MS)
        assert msg is not None and msg.version == 7 and msg.sender == "actor-0"
        # two peers are fair-queued: the good message may have overtaken the bad one
        assert _until(lambda: rx.recv(50) or (True if rx.rejected else None)) is True
        assert dict(rx.rejected) == {reason: 1} and rx.accepted == 1
        assert not Boom.unpickled
        raw.close()


def test_oversized_frame_disconnects_its_sender_unread(ctx):
    """A frame over the receiver's limit never reaches it (ZeroMQ's maxmsgsize drops the
    connection before buffering it), so it costs no memory and is not even counted."""
    with (
        TrajectoryReceiver(KEY, TREE, ctx=ctx, max_bytes=1 << 16) as rx,
        TrajectorySender(KEY, rx.endpoint, sender="actor-0", to=LEARNER, ctx=ctx) as good,
    ):
        raw = ctx.socket(zmq.PUSH)
        raw.linger = 0
        raw.connect(rx.endpoint)
        raw.send_multipart(
            encode(TREE, auth=AUTH, kind="traj", version=1, sender="x", seq=1, to=LEARNER)
            + [bytes(1 << 20)],
            copy=False,
        )
        assert good.send(TREE, 7, timeout_ms=WAIT_MS)
        msg = rx.recv(WAIT_MS)
        assert msg is not None and msg.version == 7
        assert rx.recv(300) is None
        assert rx.accepted == 1 and not rx.rejected
        raw.close()


def test_replay_rejected_and_counted(ctx):
    with TrajectoryReceiver(KEY, TREE, ctx=ctx) as rx:
        raw = ctx.socket(zmq.PUSH)
        raw.linger = 0
        raw.connect(rx.endpoint)
        frames = encode(
            TREE, auth=AUTH, kind="traj", version=1, sender="actor-0", seq=100, to=LEARNER
        )
        older = encode(
            TREE, auth=AUTH, kind="traj", version=2, sender="actor-0", seq=99, to=LEARNER
        )
        newer = encode(
            TREE, auth=AUTH, kind="traj", version=3, sender="actor-0", seq=101, to=LEARNER
        )
        for f in (frames, frames, older, newer):
            raw.send_multipart(f, copy=False)
        assert rx.recv(WAIT_MS).version == 1
        assert rx.recv(WAIT_MS).version == 3
        assert rx.rejected == {"replay": 2} and rx.accepted == 2
        raw.close()


def test_backpressure_returns_false_within_timeout(ctx):
    # a PUSH towards a peer that is not there queues up to its HWM, then refuses
    nobody = "ipc://" + os.path.join(tempfile.gettempdir(), f"tianjax-nobody-{os.getpid()}.ipc")
    with TrajectorySender(KEY, nobody, sender="actor-0", to=LEARNER, hwm=2, ctx=ctx) as tx:
        sent = 0
        while sent < 50 and tx.send(TREE, 0, timeout_ms=10):
            sent += 1
        assert 1 <= sent <= 4  # the HWM, give or take zmq's own slack
        t = time.monotonic()
        assert not tx.send(TREE, 0, timeout_ms=200)
        assert 0.15 < time.monotonic() - t < 1.5


def test_backpressure_from_a_learner_that_is_not_reading(ctx):
    big = {"x": np.zeros(1 << 20, np.float32)}  # 4 MiB: more than the socket buffers hold
    with (
        TrajectoryReceiver(KEY, big, hwm=1, ctx=ctx) as rx,
        TrajectorySender(KEY, rx.endpoint, sender="actor-0", to=LEARNER, hwm=1, ctx=ctx) as tx,
    ):
        results = [tx.send(big, 0, timeout_ms=50) for _ in range(12)]
        assert results[0] and not all(results)
        n_sent = sum(results)
        got = 0
        while (
            rx.recv(2000) is not None
        ):  # what was accepted for sending does arrive (a loaded machine: 2 s)
            got += 1
        assert got == n_sent


# ------------------------------------------------------------------------------ parameters
def test_latest_version_wins(ctx, transport, private):
    with (
        ParamPublisher(KEY, transport=transport, ipc_dir=private, ctx=ctx) as pub,
        ParamSubscriber(KEY, pub.endpoint, TREE, ctx=ctx) as sub,
    ):
        # subscriptions take a moment to reach the publisher: publish 0 until it is heard
        assert _until(lambda: (pub.publish(0, TREE), sub.latest(20))[1]) is not None
        assert sub.version == 0
        for v in range(1, 6):
            pub.publish(v, {"obs": TREE["obs"] + v, "act": TREE["act"]})
        seen = []
        # (the wait ends at version 5; it is long for a loaded machine, where the publisher's
        # thread once took more than 300 ms to send it)
        while (got := sub.latest(5000)) is not None:
            seen.append(got[0])
            if got[0] == 5:
                break
        assert seen[-1] == 5 and seen == sorted(set(seen))
        np.testing.assert_array_equal(got[1]["obs"], TREE["obs"] + 5)
        pub.publish(3, TREE)  # an older version than held: ignored
        stale_before = sub.stale
        assert (
            _until(lambda: sub.latest(50) or (True if sub.stale > stale_before else None)) is True
        )
        assert sub.version == 5 and not sub.rejected


def test_a_subscriber_that_reads_rarely_gets_the_newest_not_a_backlog(ctx, transport, private):
    # an actor reads once per rollout while the learner publishes several versions: what it
    # reads must be the newest published, whatever piled up since. (With a small RCVHWM, old
    # versions waited in the kernel's socket buffers and came out one read at a time: an
    # actor fell ever further behind, about 0.2 x the run's env steps in async DQN.)
    big = {"obs": np.zeros((64, 256), np.float32), "act": TREE["act"]}  # 64 KiB a version
    with (
        ParamPublisher(KEY, transport=transport, ipc_dir=private, ctx=ctx) as pub,
        ParamSubscriber(KEY, pub.endpoint, big, ctx=ctx) as sub,
    ):
        assert _until(lambda: (pub.publish(0, big), sub.latest(20))[1]) is not None
        last = 0
        for burst in range(5):
            for _ in range(100):  # 6.4 MiB between two reads: far above the socket buffers
                last += 1
                pub.publish(last, {"obs": big["obs"] + last, "act": big["act"]})
            time.sleep(0.2)  # the actor's rollout
            # (a burst can outrun the PUB's I/O thread, which then drops the newest: the
            # learner's next publication, or its re-send while idle, carries it)
            last += 1
            pub.publish(last, {"obs": big["obs"] + last, "act": big["act"]})
            reads, deadline = 0, time.monotonic() + WAIT_MS / 1000
            while sub.version < last and time.monotonic() < deadline:
                reads += sub.latest(20) is not None
            # one read once the burst has arrived (a few while it still arrives): a backlog
            # handed out a few versions a read would take dozens
            assert sub.version == last and reads <= 5, (burst, sub.version, last, reads)
        assert not sub.rejected
        # and the version read is that version's parameters
        pub.publish(last + 1, {"obs": big["obs"] - 1.0, "act": big["act"]})
        version, tree = _until(lambda: sub.latest(20))
        assert version == last + 1 and float(tree["obs"][0, 0]) == -1.0


def test_subscriber_rejects_and_keeps_newest_valid(ctx):
    with (
        ParamPublisher(KEY, ctx=ctx) as pub,
        ParamSubscriber(KEY, pub.endpoint, TREE, ctx=ctx) as sub,
    ):
        assert _until(lambda: (pub.publish(0, TREE), sub.latest(20))[1]) is not None
        forged = ParamPublisher(new_run_key(), endpoint=None, ctx=ctx)  # another run's learner
        sub.socket.connect(forged.endpoint)
        deadline = time.monotonic() + WAIT_MS / 1000
        while not sub.rejected and time.monotonic() < deadline:
            forged.publish(99, TREE)
            assert sub.latest(20) is None
        assert sub.rejected["auth"] >= 1 and sub.version == 0
        pub.publish(1, TREE)
        assert sub.latest(WAIT_MS)[0] == 1
        forged.close()


def test_only_the_empty_topic_is_subscribed(ctx):
    """The publisher approves subscriptions itself: the empty topic (ours) is taken; any
    other, even one that matches every message's first bytes, is refused, counted, and
    not stored, so the subscriber gets nothing."""
    with (
        ParamPublisher(KEY, ctx=ctx) as pub,
        ParamSubscriber(KEY, pub.endpoint, TREE, ctx=ctx) as sub,
    ):
        topical = ctx.socket(zmq.SUB)
        topical.linger = 0
        prefix = (len(TREE) + 2).to_bytes(4, "little")  # an envelope's first bytes: its frame count
        for topic in (prefix, b"x" * 100):
            topical.setsockopt(zmq.SUBSCRIBE, topic)
        topical.connect(pub.endpoint)
        assert _until(lambda: (pub.publish(0, TREE), sub.latest(20))[1]) is not None
        deadline = time.monotonic() + WAIT_MS / 1000
        while pub.subscriptions_refused < 2 and time.monotonic() < deadline:
            pub.publish(1, TREE)
            time.sleep(0.01)
        assert pub.subscriptions_refused == 2 and pub.subscriptions >= 1
        for v in range(2, 6):
            pub.publish(v, TREE)
        assert sub.latest(WAIT_MS) is not None
        assert not topical.poll(300)  # nothing reached it
        topical.close()


# ------------------------------------------------------------------------------ control
def test_control_register_heartbeat_stop(ctx, transport, private):
    with (
        ControlServer(KEY, transport=transport, ipc_dir=private, ctx=ctx) as server,
        ControlClient(KEY, server.endpoint, identity="actor-0", to=LEARNER, ctx=ctx) as a0,
        ControlClient(KEY, server.endpoint, identity="actor-1", to=LEARNER, ctx=ctx) as a1,
    ):
        assert a0.send({"type": "register", "actor": 0}) and a1.send(
            {"type": "register", "actor": 1}
        )
        seen = {}
        while len(seen) < 2 and (item := server.poll(WAIT_MS)) is not None:
            seen[item[0]] = item[1]
        assert seen == {
            b"actor-0": {"type": "register", "actor": 0},
            b"actor-1": {"type": "register", "actor": 1},
        }
        assert server.send(b"actor-0", {"type": "ack", "version": 4})
        assert a0.recv(WAIT_MS) == {"type": "ack", "version": 4}
        a0.send({"type": "heartbeat", "version": 4})
        assert server.poll(WAIT_MS) == (b"actor-0", {"type": "heartbeat", "version": 4})
        assert server.broadcast({"type": "stop"}) == 2
        assert a0.recv(WAIT_MS) == {"type": "stop"} and a1.recv(WAIT_MS) == {"type": "stop"}
        assert not server.send(b"actor-9", {"type": "stop"})  # unknown identity
        assert server.poll(20) is None and a0.recv(20) is None


def test_control_rejects_outsiders_and_spoofed_senders(ctx):
    with (
        ControlServer(KEY, ctx=ctx) as server,
        ControlClient(
            new_run_key(), server.endpoint, identity="intruder", to=LEARNER, ctx=ctx
        ) as intruder,
        ControlClient(KEY, server.endpoint, identity="actor-0", to=LEARNER, ctx=ctx) as a0,
    ):
        intruder.send({"type": "stop"})
        spoof = ctx.socket(zmq.DEALER)
        spoof.linger = 0
        spoof.connect(server.endpoint)
        # a raw connection with an unsigned claim to be actor-1
        spoof.send_multipart([b'{"sender": "actor-1"}', b"{}"])
        a0.send({"type": "register"})
        assert server.poll(WAIT_MS) == (b"actor-0", {"type": "register"})
        assert server.poll(100) is None
        assert sum(server.rejected.values()) == 2 and set(server.peers) == {b"actor-0"}
        # replies to a name go to the connection its signed messages come from
        assert server.send(b"actor-0", {"type": "credit", "n": 1})
        assert a0.recv(WAIT_MS) == {"type": "credit", "n": 1}
        assert not server.send(b"actor-1", {"type": "stop"})
        spoof.close()


def test_a_receive_handles_a_bounded_number_of_rejections(ctx):
    """However many bad messages wait, one receive rejects at most MAX_REJECTED_PER_CALL
    of them and returns: a flood cannot hold its caller (the learner's loop, the receiver
    thread) where it sees no stop. A good message behind them is reached by later calls."""
    from tianjax.transport.codec import encode_json
    from tianjax.transport.sockets import MAX_REJECTED_PER_CALL

    n_bad = 3 * MAX_REJECTED_PER_CALL + 5
    with ControlServer(KEY, ctx=ctx) as server:
        raw = ctx.socket(zmq.DEALER)  # one connection: its messages arrive in order
        raw.linger = 0
        raw.connect(server.endpoint)
        other = MessageAuth(new_run_key())
        for i in range(n_bad):
            raw.send_multipart(
                encode_json(
                    {"type": "heartbeat"},
                    auth=other,
                    kind="ctrl.up",
                    sender="actor-0",
                    seq=i,
                    to=LEARNER,
                )
            )
        raw.send_multipart(
            encode_json(
                {"type": "heartbeat"},
                auth=AUTH,
                kind="ctrl.up",
                sender="actor-0",
                seq=0,
                to=LEARNER,
            )
        )
        per_call, got = [], None
        deadline = time.monotonic() + WAIT_MS / 1000
        while got is None and time.monotonic() < deadline:
            before = sum(server.rejected.values())
            got = server.poll(None)  # even "wait forever" returns after the bound
            per_call.append(sum(server.rejected.values()) - before)
        assert got == (b"actor-0", {"type": "heartbeat"})
        assert server.rejected == {"auth": n_bad}
        assert max(per_call) == MAX_REJECTED_PER_CALL and len(per_call) >= 4, per_call
        raw.close()


def test_one_poller_over_several_channels(ctx):
    with (
        TrajectoryReceiver(KEY, TREE, ctx=ctx) as rx,
        ControlServer(KEY, ctx=ctx) as server,
        TrajectorySender(KEY, rx.endpoint, sender="actor-0", to=LEARNER, ctx=ctx) as tx,
        ControlClient(KEY, server.endpoint, identity="actor-0", to=LEARNER, ctx=ctx) as cc,
    ):
        poller = zmq.Poller()
        poller.register(rx.socket, zmq.POLLIN)
        poller.register(server.socket, zmq.POLLIN)
        tx.send(TREE, 1, timeout_ms=WAIT_MS)
        cc.send({"type": "heartbeat"})
        got = set()
        deadline = time.monotonic() + WAIT_MS / 1000
        while len(got) < 2 and time.monotonic() < deadline:
            events = dict(poller.poll(timeout=200))
            if rx.socket in events and rx.recv(0) is not None:
                got.add("traj")
            if server.socket in events and server.poll(0) is not None:
                got.add("ctrl")
        assert got == {"traj", "ctrl"}
