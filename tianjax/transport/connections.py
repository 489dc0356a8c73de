"""How many connections one host may hold on each of a run's server sockets.

The handshake (`security`) keeps a peer without the run's credentials from ever getting
a frame in, but not from holding connections: each costs the learner a descriptor and
libzmq's buffers until it is refused or its handshake runs out (HANDSHAKE_MS), and a
holder of the PLAIN token (an observer of a network under `security: plain`) passes the
handshake and may hold connections for as long as it likes. ZeroMQ has no per-address
limit, so `ConnectionLimit` adds one from outside: a socket monitor reports each
accepted tcp connection with its descriptor, a thread of its own reads the peer's host
off it and counts the host's live connections on that socket, and one over
`max_per_host` is ended at once (shutdown of the connection; libzmq then closes it) and
counted in `refused["per_host_limit"]`. Connections within the limit are never touched,
so an actor that holds its connection keeps it, whatever a peer on its host does. Each
connection kept has its TCP retransmission back-off capped (tianjax.transport.retransmit):
the same thread, from the same report, since a socket has one monitor only.

A client socket (one that connects: an actor's, a group learner's link to the averager)
is watched the same way, for its outgoing connections: each has its back-off capped as
it comes up (a link cut at the far side's host is then moving again within a second of
the heal, on this side too), and the socket's record says whether one is up and since
when (`_Watched.connected`, `.since`: the actor's check that its learner's process is
there, tianjax.runtime.actor.actor.LearnerPresence). The limit is not applied to them.

What it bounds: the connections one address holds on one socket, apart from the moment
between the kernel's accept and the thread's shutdown (a new connection over the limit
lives for that moment only). What it does not: a peer with many addresses; and a peer on
an actor's host (on loopback: any local user) that fills the host's slots first, which
makes a *new* connection from that host (a restarted actor) wait until a slot frees (a
peer without credentials frees each within HANDSHAKE_MS; libzmq retries a refused
connect every 100 ms). ipc connections have no host and are not counted (their
socket's private directory guards them).
"""

from __future__ import annotations

import collections
import functools
import ipaddress
import itertools
import os
import socket as _socket
import sys
import threading
import time
from contextlib import contextmanager
from typing import NamedTuple

import zmq
from zmq.utils.monitor import recv_monitor_message

from tianjax.transport.retransmit import cap_backoff

PER_HOST_LIMIT = "per_host_limit"  # the reason a refusal is counted under
_EVENTS = (
    zmq.EVENT_ACCEPTED | zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_MONITOR_STOPPED
)
_POLL_MS = 100  # how often the thread looks at its stop flag and for new sockets
_EVENTS_PER_PASS = 256  # events read from one socket's monitor before the next's
_JOIN_S = 5.0
# NOTE: a look at a host's counted connections costs a system call each; under a flood that
# keeps the host over the limit it would run for every new connection, so it runs at most
# this often per socket (in between, a connection whose end is still unreported holds its
# slot until the report is read: the safe side)
_SWEEP_S = 1.0
_ids = itertools.count()


class _Conn(NamedTuple):
    host: str
    inode: tuple  # (device, inode) of the connection's socket: what the descriptor named then
    refused: bool


class _Watched:
    """One socket's monitor and its live connections, by descriptor: those it accepted
    (the thread's own) and those it made. `connected` (whether one it made is up) and
    `since` (monotonic: when `connected` last changed) are for any thread to read."""

    def __init__(self, monitor: zmq.Socket):
        self.monitor = monitor
        self.conns: dict[int, _Conn] = {}
        self.per_host: collections.Counter = collections.Counter()
        self.next_sweep = 0.0  # (monotonic) when a host over the limit is looked at again
        self.outbound: set[int] = set()  # descriptors of the connections it made, up now
        self.connected = False
        self.since = time.monotonic()

    def made(self, fd: int) -> None:
        self.outbound.add(fd)
        self._moved()

    def lost(self, fd: int) -> None:
        self.drop(fd)
        self.outbound.discard(fd)
        self._moved()

    def _moved(self) -> None:
        if bool(self.outbound) != self.connected:
            # `since` first: a reader between the two sees the new time with the old state,
            # which reads as "just changed", never as a long absence that was not
            self.since = time.monotonic()
            self.connected = bool(self.outbound)

    def add(self, fd: int, conn: _Conn) -> None:
        self.drop(fd)
        self.conns[fd] = conn
        if not conn.refused:
            self.per_host[conn.host] += 1

    def drop(self, fd: int) -> None:
        conn = self.conns.pop(fd, None)
        if conn is not None and not conn.refused:
            self.per_host[conn.host] -= 1
            if self.per_host[conn.host] <= 0:
                del self.per_host[conn.host]


def _host(address: str) -> str:
    """The peer's host as the allow-list writes it (an IPv4-mapped IPv6 address as IPv4)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip)


@functools.lru_cache(maxsize=64)
def _port(endpoint: str) -> int | None:
    try:
        return int(endpoint.rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return None


@contextmanager
def _captured(fd: int):
    """The tcp connection descriptor `fd` names now, as a socket on a duplicate of it (or
    None: closed, or not a tcp socket). The duplicate holds that connection, whatever
    happens to `fd` meanwhile, until the block ends.

    NOTE: never change the duplicate's blocking mode: it shares its file status flags
    with libzmq's descriptor."""
    try:
        dup = os.dup(fd)
    except OSError:  # closed meanwhile (or no descriptor left to duplicate it into)
        yield None
        return
    try:
        sock = _socket.socket(fileno=dup)
    except OSError:  # reused meanwhile by something that is not a socket
        os.close(dup)
        yield None
        return
    try:
        ok = sock.family in (_socket.AF_INET, _socket.AF_INET6) and sock.type == _socket.SOCK_STREAM
        yield sock if ok else None
    finally:
        sock.close()


def _inode(fd: int) -> tuple | None:
    """(device, inode) of what `fd` names now (a socket's are its own while it is open), or None."""
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class ConnectionLimit:
    """At most `max_per_host` (>= 1; None: no limit) live tcp connections from one host on
    each socket `watch()`ed, every socket of one ZeroMQ context; a thread of its own ends
    the others as they are accepted, and caps the back-off of those it keeps and of the
    connections a watched socket makes (no limit on those). Counts:
    `refused[PER_HOST_LIMIT]`, `backoff[capped]`. `alive` is False once its
    thread has stopped (closed, or failed: `error`).

    NOTE on descriptor reuse: libzmq reports a connection by its descriptor's number, and
    by the time the thread reads the report the number may name something else (libzmq
    closes a descriptor right after reporting the connection's end, and the kernel gives
    the number to the next accept or file). So the thread duplicates the descriptor
    first (the duplicate holds whatever connection it names now, so a shutdown can only
    reach that one), and counts or ends it only if it is a tcp connection to this
    socket's port. Counts are kept by (descriptor, socket inode): a second report of the
    same connection is not counted again. Before it ends a connection of a host over the
    limit, it looks again at that host's counted connections (at most every _SWEEP_S)
    and forgets those whose descriptor no longer names their socket (a report of their
    end not read yet; or, should libzmq ever end one without a report, never to come).
    What remains: until a connection's end is read, a new one of its host may be ended
    although a slot is free (the safe side); and when a number is reused before its
    first connection's acceptance is read, the second connection is counted from that
    report, forgotten at the first one's end report, and counted again at its own
    acceptance report: between those two reports its host may hold one more than the
    limit.
    """

    def __init__(self, ctx: zmq.Context, max_per_host: int | None):
        if max_per_host is not None and int(max_per_host) < 1:
            raise ValueError(f"max_per_host must be >= 1 (or None: no limit), got {max_per_host}")
        self.max_per_host = None if max_per_host is None else int(max_per_host)
        self.refused: collections.Counter = collections.Counter()
        # connections kept, by whether their retransmission back-off is capped (False: the
        # kernel has no TCP_RTO_MAX_MS; tianjax.transport.retransmit)
        self.backoff: collections.Counter = collections.Counter()
        self._ctx = ctx
        self._lock = threading.Lock()
        self._new: list[_Watched] = []  # watched sockets the thread has not taken yet
        self._stop = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name="tianjax-connections", daemon=True)
        self._thread.start()

    def watch(self, socket: zmq.Socket) -> _Watched:
        """Counts `socket`'s tcp connections from now on, and caps their back-off. Call it
        before the socket binds or connects (so that no connection goes unseen), from the
        thread that owns the socket. Returns the socket's record (`connected`, `since`)."""
        endpoint = f"inproc://tianjax-connections-{os.getpid()}-{next(_ids)}"
        socket.monitor(endpoint, _EVENTS)
        monitor = self._ctx.socket(zmq.PAIR)
        monitor.linger = 0
        # NOTE: libzmq sends monitor events from its I/O thread with a blocking send: with a
        # bounded queue, a thread slow to read them would stall every socket of the
        # context (and the context's end). 0 here makes the queue from that socket to
        # this one unbounded (an inproc pipe's bound is the sum of both ends', or none if
        # either end has none); the thread reads it as it comes.
        monitor.rcvhwm = 0
        monitor.connect(endpoint)
        watched = _Watched(monitor)
        with self._lock:  # (the hand-over to the thread is the memory barrier ZeroMQ asks for)
            self._new.append(watched)
        return watched

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # ------------------------------------------------------------------ the thread
    def _serve(self) -> None:
        poller = zmq.Poller()
        watched: dict[zmq.Socket, _Watched] = {}
        try:
            while not self._stop.is_set():
                with self._lock:
                    new, self._new = self._new, []
                for w in new:
                    watched[w.monitor] = w
                    poller.register(w.monitor, zmq.POLLIN)
                for monitor, _ in poller.poll(_POLL_MS):
                    if not self._read(watched[monitor]):  # the socket was closed
                        poller.unregister(monitor)
                        del watched[monitor]
                        monitor.close(linger=0)
        except BaseException as e:  # noqa: BLE001 - the learner sees it through `alive`
            self.error = e
        finally:
            with self._lock:
                new, self._new = self._new, []
            for w in [*watched.values(), *new]:
                w.monitor.close(linger=0)

    def _read(self, w: _Watched) -> bool:
        """Handles the events queued on `w`'s monitor (at most a pass's worth); False once
        its socket is gone."""
        for _ in range(_EVENTS_PER_PASS):
            try:
                event = recv_monitor_message(w.monitor, zmq.NOBLOCK)
            except zmq.Again:
                return True
            kind = event["event"]
            if kind == zmq.EVENT_ACCEPTED:
                endpoint = event["endpoint"]
                self._accepted(
                    w,
                    event["value"],
                    endpoint.decode() if isinstance(endpoint, bytes) else endpoint,
                )
            elif kind == zmq.EVENT_CONNECTED:
                self._connected(w, event["value"])
            elif kind == zmq.EVENT_DISCONNECTED:
                w.lost(event["value"])
            elif kind == zmq.EVENT_MONITOR_STOPPED:
                return False
        return True

    def _accepted(self, w: _Watched, fd: int, endpoint: str) -> None:
        with _captured(fd) as sock:
            if sock is None:
                return  # gone already, or the descriptor names something else now
            inode = _inode(sock.fileno())
            old = w.conns.get(fd)
            if old is not None and old.inode == inode:
                return  # counted (or refused) already, from an earlier report
            try:
                peer, local = sock.getpeername(), sock.getsockname()
            except OSError:
                return  # no longer connected
            if local[1] != _port(endpoint):
                return  # a connection to another port: not (any more) the one reported
            host = _host(peer[0])
            w.add(fd, _Conn(host, inode, refused=False))
            limit = self.max_per_host
            if limit is not None and w.per_host[host] > limit and time.monotonic() >= w.next_sweep:
                w.next_sweep = time.monotonic() + _SWEEP_S
                self._forget_gone(w, host, fd)
            if limit is None or w.per_host[host] <= limit:
                # kept: TCP's back-off capped, so that it moves within a second of a heal
                self.backoff[cap_backoff(sock)] += 1
                return
            try:
                sock.shutdown(
                    _socket.SHUT_RDWR
                )  # ends the connection; libzmq sees it and closes it
            except OSError:
                pass  # it ended on its own meanwhile
            w.add(fd, _Conn(host, inode, refused=True))
            self.refused[PER_HOST_LIMIT] += 1

    def _connected(self, w: _Watched, fd: int) -> None:
        """A connection the socket made: its back-off capped (a tcp one), and counted up.
        (Should the number name another connection of this process by now, that one is
        capped: harmless, its give-up time is kept.)"""
        w.made(fd)
        with _captured(fd) as sock:
            if sock is not None:
                self.backoff[cap_backoff(sock)] += 1

    @staticmethod
    def _forget_gone(w: _Watched, host: str, keep: int) -> None:
        """Forgets `host`'s counted connections whose descriptor no longer names them (a
        look at the descriptor's inode: the report of their end is still unread)."""
        for fd, conn in list(w.conns.items()):
            if fd != keep and conn.host == host and not conn.refused and _inode(fd) != conn.inode:
                w.drop(fd)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(_JOIN_S)
        if self._thread.is_alive():
            print(
                f"tianjax: warning: the connection-limit thread did not stop within {_JOIN_S:g} s",
                file=sys.stderr,
                flush=True,
            )


__all__ = ["PER_HOST_LIMIT", "ConnectionLimit"]
