"""The socket under every channel (tianjax.transport.channels): one ZeroMQ socket with
linger 0, a frame-size cap, the run's handshake, and binding to loopback unless asked
otherwise; plus the deadline helpers the channels' receives share.

Heartbeats (`keep_alive`, on the parameter channel: tianjax.transport.params). Each
connection pings its peer every HEARTBEAT_IVL_MS and is closed when nothing came back
within HEARTBEAT_TIMEOUT_MS; the connecting side then tries again every RECONNECT_IVL_MS,
each try cut after CONNECT_TIMEOUT_MS. Without them, parameters queued for an actor whose
link was cut for a while sit in TCP's retransmission back-off (which doubles: over 10 s
after a 20 s cut) and reach it long after the link is back, while it acts on parameters
too stale to be admitted. With them the dead connection is closed during the cut and a
new one made within about a second of the link's return; the next version goes out on
it (the versions queued on the old one were superseded anyway). ZeroMQ answers pings
from its own I/O thread, so a role busy compiling or updating is not cut off.

Trajectories and the control channel keep their connections through a cut: what is queued
on them is delivered once TCP retransmits, and closing them would lose it, leaving the
actor's credit slots to the learner's write-off grace (tianjax.runtime.learner.lost)."""

from __future__ import annotations

import errno
import os
import secrets
import time
from typing import Literal

import zmq

from tianjax.transport.auth import Authenticator, RunKey
from tianjax.transport.codec import MAX_HEADER_BYTES, CodecError, TreeSpec
from tianjax.transport.connections import ConnectionLimit
from tianjax.transport.security import Handshake, limit_frames

DEFAULT_HOST = "127.0.0.1"
CONTROL_MAX_BYTES = 1 << 16
# NOTE: a receive handles at most this many rejections before it returns (None), and checks
# its deadline after each one: a steady stream of bad messages must not keep a role inside
# one call, where it cannot see its stop flag or serve anything else.
MAX_REJECTED_PER_CALL = 64
HEARTBEAT_IVL_MS = 1000
HEARTBEAT_TIMEOUT_MS = 4000
CONNECT_TIMEOUT_MS = 1000
RECONNECT_IVL_MS = 100
Key = RunKey | bytes | Authenticator


def _deadline(timeout_ms: int | None) -> float | None:
    return None if timeout_ms is None else time.monotonic() + timeout_ms / 1000


def _remaining_ms(deadline: float | None) -> int | None:
    return None if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))


def _bind_or_oserror(socket: zmq.Socket, endpoint: str) -> None:
    """bind, with a port in use or descriptors exhausted raised as an OSError naming it."""
    try:
        socket.bind(endpoint)
    except zmq.ZMQError as e:
        if e.errno in (errno.EADDRINUSE, errno.EMFILE, errno.ENFILE, errno.EACCES):
            raise OSError(e.errno, os.strerror(e.errno), endpoint) from None
        raise


_incarnation: str | None = None


def keep_alive(socket: zmq.Socket) -> None:
    """Heartbeats and prompt reconnection on `socket` (see the module doc); set before it
    binds or connects."""
    socket.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_IVL_MS)
    socket.setsockopt(zmq.HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT_MS)
    socket.setsockopt(zmq.HEARTBEAT_TTL, HEARTBEAT_TIMEOUT_MS)
    socket.setsockopt(zmq.CONNECT_TIMEOUT, CONNECT_TIMEOUT_MS)
    socket.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)


def process_incarnation() -> str:
    """This process's incarnation: 16 random hex digits drawn once per process (and again
    in a forked child). Every message a channel sends carries it; sequence numbers count
    from 0 within it, so a restarted process (a new incarnation) needs no clock to be
    told apart from a replay of its predecessor."""
    global _incarnation
    if _incarnation is None:
        _incarnation = secrets.token_hex(8)
    return _incarnation


def _forget_incarnation() -> None:
    global _incarnation
    _incarnation = None


os.register_at_fork(after_in_child=_forget_incarnation)


def address(name: str, incarnation: str) -> str:
    """A recipient as messages name it: "name@incarnation"."""
    return f"{name}@{incarnation}"


class _Channel:
    """One socket, linger 0, closed by close() or a with block. `max_in` caps each inbound
    frame (ZeroMQ's maxmsgsize: a larger one disconnects its sender unread); `handshake`,
    if given, is the run's connection credentials (see `security`), set before the socket
    binds (as a server) or connects (as a client). `limit`, where a subclass takes it: its
    context's connection watcher (`SecureContext.limit`, tianjax.transport.connections),
    which caps each of the socket's tcp connections' retransmission back-off and, on a
    server socket, holds each host to the per-host limit."""

    def __init__(
        self, socket_type: int, ctx: zmq.Context | None, max_in: int, handshake: Handshake | None
    ):
        self._ctx = ctx or zmq.Context.instance()
        self.socket: zmq.Socket = self._ctx.socket(socket_type)
        self.socket.linger = 0
        limit_frames(self.socket, max_in)
        self.handshake = handshake
        self.endpoint = ""
        self._ipc_path: str | None = None
        # a client's record of its connection (`connected`, `since`), if it is watched
        self.link = None

    def _connect(self, endpoint: str, limit: ConnectionLimit | None = None) -> None:
        """`limit`: the context's connection watcher, which caps the TCP back-off of the
        connection as it comes up and keeps `link` (set up before the connect, so that it
        sees the first one)."""
        if self.handshake is not None:
            self.handshake.client(self.socket)
        if limit is not None:
            self.link = limit.watch(self.socket)
        self.socket.connect(endpoint)
        self.endpoint = endpoint

    def _bind(
        self,
        endpoint: str | None,
        host: str,
        transport: Literal["tcp", "ipc"],
        ipc_dir: str | None = None,
        use_fd: int | None = None,
        limit: ConnectionLimit | None = None,
    ) -> None:
        """`limit`: the per-host connection limit to hold the socket to (tcp only: ipc
        peers have no host), set up before the bind so that it sees every connection."""
        ipc = endpoint.startswith("ipc://") if endpoint is not None else transport == "ipc"
        if self.handshake is not None:
            self.handshake.server(self.socket, ipc=ipc)
        if limit is not None and not ipc:
            limit.watch(self.socket)
        if use_fd is not None:
            # a listening socket bound and held by the launcher (see tianjax.launch.ports):
            # it owns the port or ipc path, so nothing here unlinks it
            if endpoint is None:
                raise ValueError("a listening descriptor needs its endpoint")
            self.socket.setsockopt(zmq.USE_FD, use_fd)
            _bind_or_oserror(self.socket, endpoint)
            self.endpoint = endpoint
            return
        if endpoint is None and transport == "ipc":
            # NOTE: never the shared temporary directory: any local user could connect to
            # (or replace) a socket there. The launcher makes a private one (mode 0700)
            if ipc_dir is None:
                raise ValueError(
                    "ipc sockets need a private directory (ipc_dir, mode 0700): none was given"
                )
            name = f"tianjax-{os.getpid()}-{secrets.token_hex(6)}.ipc"
            endpoint = "ipc://" + os.path.join(ipc_dir, name)
        if endpoint is None:
            if ":" in host:  # an IPv6 address
                self.socket.ipv6 = True
                host = f"[{host}]"
            port = self.socket.bind_to_random_port(f"tcp://{host}")
            self.endpoint = f"tcp://{host}:{port}"
            return
        _bind_or_oserror(self.socket, endpoint)
        # resolves "tcp://host:0" and "tcp://host:*" to the port the OS gave
        self.endpoint = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        if endpoint.startswith("ipc://"):
            self._ipc_path = endpoint[len("ipc://") :]

    def _recv_valid(self, timeout_ms: int | None, valid):
        """The first message `valid(frames)` accepts within timeout_ms, or None. Messages it
        refuses (CodecError) are dropped and counted in `rejected` by reason, never raised;
        after MAX_REJECTED_PER_CALL of them, or once the deadline has passed, it returns
        None (even with timeout_ms None), and the caller looks again when it likes."""
        deadline = _deadline(timeout_ms)
        refused = 0
        while True:
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                remaining = _remaining_ms(deadline)
                if remaining == 0 or not self.socket.poll(remaining):
                    return None
                continue
            try:
                result = valid(frames)
            except CodecError as e:
                self.rejected[e.reason] += 1
                refused += 1
                if refused >= MAX_REJECTED_PER_CALL or (
                    deadline is not None and time.monotonic() >= deadline
                ):
                    return None
                continue
            self.accepted += 1
            return result

    def close(self) -> None:
        if not self.socket.closed:
            self.socket.close(linger=0)
        if self._ipc_path:
            try:
                os.unlink(self._ipc_path)
            except OSError:
                pass
            self._ipc_path = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.endpoint or 'unbound'})"


def _default_max_bytes(spec: TreeSpec) -> int:
    # exact shapes give the exact size; with free batch dims, 1 GiB unless the caller says
    return spec.nbytes + MAX_HEADER_BYTES + 64 if spec.batch_dims == 0 else 1 << 30


__all__ = [
    "CONTROL_MAX_BYTES",
    "DEFAULT_HOST",
    "MAX_REJECTED_PER_CALL",
    "Key",
    "address",
    "process_incarnation",
]
