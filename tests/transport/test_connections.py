"""The per-host connection limit (tianjax.transport.connections) on its own: what its
thread does with a report of an accepted connection, over real loopback connections.

libzmq reports a connection by its descriptor's number, and by the time the thread reads
the report the number may name something else. These tests hand the thread's handler
descriptors as such a late report would find them; the limit against a separate attacker
process is tests/transport/test_hostile_peers.py's."""

from __future__ import annotations

import os
import socket
import time

import pytest
import zmq

from tianjax.transport.connections import PER_HOST_LIMIT, ConnectionLimit, _Watched
from tianjax.transport.retransmit import (
    GIVE_UP_MS,
    RTO_MAX_MS,
    TCP_RTO_MAX_MS,
    TCP_USER_TIMEOUT,
    cap_backoff,
)


@pytest.fixture
def limit():
    ctx = zmq.Context()
    lim = ConnectionLimit(ctx, 1)
    try:
        yield lim
    finally:
        lim.close()
        ctx.destroy(linger=0)


class _Listener:
    """A plain listening socket on loopback and what it accepted; closed by close()."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.endpoint = f"tcp://127.0.0.1:{self.port}"
        self.open: list[socket.socket] = []

    def connect(self) -> tuple[socket.socket, socket.socket]:
        """(client, server side) of a new connection."""
        client = socket.create_connection(("127.0.0.1", self.port))
        server, _ = self.sock.accept()
        self.open += [client, server]
        return client, server

    def close(self) -> None:
        for s in [*self.open, self.sock]:
            s.close()


def _ended(client: socket.socket, wait_s: float) -> bool:
    """Whether the other side ended the connection (seen within wait_s)."""
    client.settimeout(wait_s)
    try:
        return client.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_a_host_over_its_limit_has_its_new_connection_ended_and_counted(limit):
    ours = _Listener()
    try:
        w = _Watched(monitor=None)
        c1, s1 = ours.connect()
        limit._accepted(w, s1.fileno(), ours.endpoint)
        limit._accepted(w, s1.fileno(), ours.endpoint)  # the same connection, reported again
        assert dict(w.per_host) == {"127.0.0.1": 1} and not limit.refused
        c2, s2 = ours.connect()
        limit._accepted(w, s2.fileno(), ours.endpoint)
        assert limit.refused == {PER_HOST_LIMIT: 1} and dict(w.per_host) == {"127.0.0.1": 1}
        assert _ended(c2, 2.0)
        assert not _ended(c1, 0.2)  # the one within the limit is untouched
        # its disconnection frees the slot
        w.drop(s1.fileno())
        c3, s3 = ours.connect()
        limit._accepted(w, s3.fileno(), ours.endpoint)
        assert limit.refused == {PER_HOST_LIMIT: 1} and not _ended(c3, 0.2)
    finally:
        ours.close()


def test_a_descriptor_that_names_something_else_by_now_is_left_alone(limit, tmp_path):
    ours, other = _Listener(), _Listener()
    try:
        w = _Watched(monitor=None)
        c1, s1 = ours.connect()
        limit._accepted(w, s1.fileno(), ours.endpoint)
        # a file, a connection to another port (say another learner socket's, or an
        # outgoing one), and a number no longer open: neither counted nor ended
        with open(tmp_path / "f", "w") as f:
            limit._accepted(w, f.fileno(), ours.endpoint)
        c2, s2 = other.connect()
        limit._accepted(w, s2.fileno(), ours.endpoint)
        closed = os.dup(0)
        os.close(closed)
        limit._accepted(w, closed, ours.endpoint)
        assert dict(w.per_host) == {"127.0.0.1": 1} and not limit.refused
        assert not _ended(c2, 0.2)
        # a counted connection that ended without its report read yet (its number closed,
        # maybe reused) does not hold the host's slot against a new one
        s1.close()
        c3, s3 = ours.connect()
        limit._accepted(w, s3.fileno(), ours.endpoint)
        assert not limit.refused and not _ended(c3, 0.2)
        assert dict(w.per_host) == {"127.0.0.1": 1}
    finally:
        ours.close()
        other.close()


def test_a_limit_below_one_is_refused():
    ctx = zmq.Context()
    try:
        with pytest.raises(ValueError, match="max_per_host"):
            ConnectionLimit(ctx, 0)
    finally:
        ctx.destroy(linger=0)


def _backoff(sock: socket.socket) -> tuple[int, int]:
    """(TCP_RTO_MAX_MS, TCP_USER_TIMEOUT) of a connection."""
    return (
        sock.getsockopt(socket.IPPROTO_TCP, TCP_RTO_MAX_MS),
        sock.getsockopt(socket.IPPROTO_TCP, TCP_USER_TIMEOUT),
    )


def test_a_kept_connection_has_its_backoff_capped_and_a_refused_one_is_left_as_it_is(limit):
    ours = _Listener()
    try:
        _, s1 = ours.connect()
        try:
            default = _backoff(s1)
        except OSError:
            pytest.skip("the kernel has no TCP_RTO_MAX_MS (Linux < 6.15)")
        assert default == (120_000, 0)  # the kernel's own: two minutes, and tcp_retries2
        w = _Watched(monitor=None)
        limit._accepted(w, s1.fileno(), ours.endpoint)
        assert _backoff(s1) == (RTO_MAX_MS, GIVE_UP_MS) and limit.backoff == {True: 1}
        _, s2 = ours.connect()  # over the limit of 1: ended, not tuned
        limit._accepted(w, s2.fileno(), ours.endpoint)
        assert limit.refused == {PER_HOST_LIMIT: 1} and limit.backoff == {True: 1}
        assert _backoff(s2) == default
    finally:
        ours.close()


def test_cap_backoff_on_what_is_no_tcp_connection_says_so():
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        assert cap_backoff(s) is False


def _until(predicate, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.01)


def _connection_to(port: int) -> socket.socket:
    """This process's own tcp connection to 127.0.0.1:`port` (libzmq's), on a duplicate of
    its descriptor, found by looking at every open descriptor."""
    for name in os.listdir("/proc/self/fd"):
        try:
            sock = socket.socket(fileno=os.dup(int(name)))
        except OSError:
            continue
        try:
            if sock.type == socket.SOCK_STREAM and sock.getpeername() == ("127.0.0.1", port):
                return sock
        except OSError:
            pass
        sock.close()
    raise AssertionError(f"no connection to port {port}")


def test_a_connection_a_watched_socket_makes_is_capped_and_its_link_says_when_it_is_up():
    ctx = zmq.Context()
    lim = ConnectionLimit(ctx, None)
    ours = _Listener()
    dealer = ctx.socket(zmq.DEALER)
    dealer.linger = 0
    try:
        before = time.monotonic()
        link = lim.watch(dealer)
        assert not link.connected and link.since >= before
        dealer.connect(ours.endpoint)
        server, _ = ours.sock.accept()
        ours.open.append(server)
        _until(lambda: link.connected)
        up_at = link.since
        assert up_at >= before and not lim.refused
        with _connection_to(ours.port) as made:
            try:
                assert _backoff(made) == (RTO_MAX_MS, GIVE_UP_MS)
                assert lim.backoff == {True: 1}
            except OSError:
                assert lim.backoff == {False: 1}  # a kernel without TCP_RTO_MAX_MS
        # the far side ends it and listens no more: the link is down, from then on
        ours.close()
        _until(lambda: not link.connected)
        assert link.since > up_at
    finally:
        dealer.close()
        lim.close()
        ctx.destroy(linger=0)
