"""The three channels of a TianJi run (arXiv 2502.20190, section 3) over ZeroMQ sockets.

- parameters: learner `ParamPublisher` (PUB, binds) to actors' `ParamSubscriber` (SUB,
  connects); an actor drains its socket and keeps only the newest version.
- trajectories: actors' `TrajectorySender` (PUSH, connects) to the learner's
  `TrajectoryReceiver` (PULL, binds); high-water marks are the backpressure.
- control: learner `ControlServer` (ROUTER, binds) and actors' `ControlClient` (DEALER,
  connects) exchange small JSON messages: register, heartbeat, ack, stop.

Every message is encoded by `codec` and authenticated with the run key (`auth`). A message
that fails a check is counted in the receiving channel's `rejected` Counter (by reason)
and dropped; receiving never raises for bad input. Before that, a channel given the run's
`security.Handshake` only connects to, or admits, peers holding the run's credentials,
and every socket caps the frames it takes (ZeroMQ's maxmsgsize: a larger frame drops its
sender's connection before it is buffered), so a peer without the key costs a bounded
amount. Sockets have linger 0, bind to
127.0.0.1 unless given another host, and expose `.socket` so a role can wait on several
channels with one `zmq.Poller`; `recv(0)`/`poll(0)`/`latest(0)` then take what is there.
Timeouts are in milliseconds; None waits forever.

NOTE: a channel belongs to one thread (ZeroMQ sockets are not thread-safe); a role that
needs channels in several threads makes one per thread. Arrays received share memory
with the received message, which stays alive as long as they do.
"""

from __future__ import annotations

import collections
import errno
import os
import secrets
import tempfile
import time
from typing import Any, Literal

import zmq

from tianjax.transport import envelope
from tianjax.transport.auth import Authenticator, RunKey, as_authenticator
from tianjax.transport.security import SENDER_MAX_BYTES, SUBSCRIPTION_MAX_BYTES, Handshake, limit_frames
from tianjax.transport.codec import (
    MAX_HEADER_BYTES,
    CodecError,
    Message,
    ReplayGuard,
    TreeSpec,
    decode,
    decode_json,
    encode,
    encode_json,
)

DEFAULT_HOST = "127.0.0.1"
CONTROL_MAX_BYTES = 1 << 16
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


def _first_seq() -> int:
    # NOTE: receivers demand strictly increasing seqs per sender; starting at the clock
    # lets a restarted sender (same id) continue upward instead of being taken for a replay.
    return time.time_ns()


class _Channel:
    """One socket, linger 0, closed by close() or a with block. `max_in` caps each inbound
    frame (ZeroMQ's maxmsgsize: a larger one disconnects its sender unread); `handshake`,
    if given, is the run's connection credentials (see `security`), set before the socket
    binds (as a server) or connects (as a client)."""

    def __init__(self, socket_type: int, ctx: zmq.Context | None, max_in: int,
                 handshake: Handshake | None):
        self._ctx = ctx or zmq.Context.instance()
        self.socket: zmq.Socket = self._ctx.socket(socket_type)
        self.socket.linger = 0
        limit_frames(self.socket, max_in)
        self.handshake = handshake
        self.endpoint = ""
        self._ipc_path: str | None = None

    def _connect(self, endpoint: str) -> None:
        if self.handshake is not None:
            self.handshake.client(self.socket)
        self.socket.connect(endpoint)
        self.endpoint = endpoint

    def _bind(self, endpoint: str | None, host: str, transport: Literal["tcp", "ipc"],
              ipc_dir: str | None = None, use_fd: int | None = None) -> None:
        if self.handshake is not None:
            self.handshake.server(self.socket)
        if use_fd is not None:
            # a listening socket bound and held by the launcher (see launch/ports.py):
            # it owns the port or ipc path, so nothing here unlinks it
            if endpoint is None:
                raise ValueError("a listening descriptor needs its endpoint")
            self.socket.setsockopt(zmq.USE_FD, use_fd)
            _bind_or_oserror(self.socket, endpoint)
            self.endpoint = endpoint
            return
        if endpoint is None and transport == "ipc":
            name = f"tianjax-{os.getpid()}-{secrets.token_hex(6)}.ipc"
            endpoint = "ipc://" + os.path.join(ipc_dir or tempfile.gettempdir(), name)
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
            self._ipc_path = endpoint[len("ipc://"):]

    def _recv_valid(self, timeout_ms: int | None, valid):
        """The first message `valid(frames)` accepts within timeout_ms, or None. Messages it
        refuses (CodecError) are dropped and counted in `rejected` by reason, never raised."""
        deadline = _deadline(timeout_ms)
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


# ------------------------------------------------------------------------------ parameters
class ParamPublisher(_Channel):
    """Learner side: publishes (version, params) to every subscribed actor.

    A message goes out as one frame (transport/envelope.py: the subscriber conflates, and
    ZeroMQ conflates single frames only), packed by one copy, so the caller may reuse the
    tree's arrays once publish() returns. At its HWM a PUB drops the message being
    published, i.e. the newest. The HWM is therefore not tiny: a burst of publishes can
    outrun the I/O thread, and the newest version must not be the one lost. The
    subscriber's I/O thread reads everything that arrives and keeps the newest, so what
    the PUB queues for it drains at the speed of the connection, not of the actor.
    """

    def __init__(self, key: Key, *, endpoint: str | None = None, host: str = DEFAULT_HOST,
                 transport: Literal["tcp", "ipc"] = "tcp", sender: str = "learner",
                 hwm: int = 8, batch_dims: int = 0, ctx: zmq.Context | None = None,
                 handshake: Handshake | None = None, ipc_dir: str | None = None,
                 use_fd: int | None = None):
        # what a PUB receives are subscriptions: tiny, so an oversized one is refused unread
        super().__init__(zmq.PUB, ctx, SUBSCRIPTION_MAX_BYTES, handshake)
        self._auth = as_authenticator(key)
        self.sender = sender
        self.batch_dims = batch_dims
        self._seq = _first_seq()
        self.socket.sndhwm = hwm
        self._bind(endpoint, host, transport, ipc_dir, use_fd)

    def publish(self, version: int, params: Any) -> None:
        self._seq += 1
        frames = encode(params, auth=self._auth, kind="params", version=version,
                        sender=self.sender, seq=self._seq, batch_dims=self.batch_dims)
        self.socket.send(envelope.pack(frames), copy=False)  # PUB never blocks


class ParamSubscriber(_Channel):
    """Actor side: `latest()` hands out the newest valid version, once.

    `template` is an example params tree (arrays or ShapeDtypeStructs) or a TreeSpec.
    Counters: `accepted`, `rejected` (by reason), `stale` (valid but not newer than the
    version held), `skipped` (older messages behind a newer valid one, never verified).
    A restarted learner publishes under a new sender name (its incarnation); its first
    valid message is taken whatever its version (a resumed learner goes on from its last
    checkpoint, which may be behind what the subscriber held), and `source_changes`
    counts such restarts. With `same_version`, a newer message of the version held is
    handed out too (the learner republishes a version when what rides with it, such as its
    env-step count, has moved on).
    """

    # NOTE: the socket conflates (ZMQ_CONFLATE): its I/O thread reads every message as it
    # arrives and keeps the newest, so nothing waits in the kernel's socket buffers to be
    # handed out later. (With a small RCVHWM instead, a backlog of old versions stayed
    # there and an actor reading once per rollout fell ever further behind.) The drain
    # keeps the newest few in case several frames are read at once (a test's raw socket).
    _KEEP = 8
    _MAX_DRAIN = 100_000

    def __init__(self, key: Key, endpoint: str, template: Any, *,
                 max_bytes: int | None = None, batch_dims: int = 0, same_version: bool = False,
                 ctx: zmq.Context | None = None, handshake: Handshake | None = None):
        spec = template if isinstance(template, TreeSpec) else TreeSpec(template, batch_dims=batch_dims)
        # never above the exact size a template without batch dims fixes
        max_bytes = min(max_bytes or (1 << 62), _default_max_bytes(spec))
        # the envelope is one frame: the payload's bound plus its table and padding
        super().__init__(zmq.SUB, ctx, max_bytes + envelope.overhead(len(spec.leaves) + 2), handshake)
        self.same_version = same_version
        self._auth = as_authenticator(key)
        self.spec = spec
        self.max_bytes = max_bytes
        # one message held, the newest (set before connecting; RCVHWM is then ignored)
        self.socket.setsockopt(zmq.CONFLATE, 1)
        self.socket.setsockopt(zmq.SUBSCRIBE, b"")
        self._connect(endpoint)
        self.version = -1
        self.source: str | None = None  # the sender (learner incarnation) of `version`
        self.source_changes = 0
        self.accepted = 0
        self.stale = 0
        self.skipped = 0
        self.rejected: collections.Counter = collections.Counter()
        self._guard = ReplayGuard()

    def _drain(self) -> list:
        raws: collections.deque = collections.deque(maxlen=self._KEEP)
        n = 0
        while n < self._MAX_DRAIN:
            try:
                raws.append(self.socket.recv(zmq.NOBLOCK, copy=False))
            except zmq.Again:
                break
            n += 1
        self.skipped += n - len(raws)
        return list(raws)

    def _newest(self, raws: list) -> tuple[int, Any] | None:
        # Newest first: a PUB delivers in order, so the last message is the newest version
        # and the ones before it need no verification (verifying is the costly part).
        for i in range(len(raws) - 1, -1, -1):
            try:
                msg = decode(envelope.unpack(raws[i].buffer), auth=self._auth, spec=self.spec,
                             kind="params", max_bytes=self.max_bytes)
                self._guard.check(msg)
            except CodecError as e:
                self.rejected[e.reason] += 1
                continue
            older = msg.version < self.version or (msg.version == self.version and not self.same_version)
            if older and msg.sender == self.source:
                self.stale += 1
                continue
            if self.source is not None and msg.sender != self.source:
                self.source_changes += 1  # a restarted learner: its count is the one to follow
            self.source = msg.sender
            self.accepted += 1
            self.skipped += i
            self.version = msg.version
            return msg.version, msg.tree
        return None

    def latest(self, timeout_ms: int | None = 0) -> tuple[int, Any] | None:
        """(version, params) newer than any handed out before, or None if none arrives
        within timeout_ms. Drains everything queued; older versions are dropped."""
        deadline = _deadline(timeout_ms)
        while True:
            raws = self._drain()
            if raws and (got := self._newest(raws)) is not None:
                return got
            remaining = _remaining_ms(deadline)
            if remaining == 0 or not self.socket.poll(remaining):
                return None


# ------------------------------------------------------------------------------ trajectories
class TrajectorySender(_Channel):
    """Actor side: pushes trajectory trees to the learner; `hwm` bounds what may queue."""

    def __init__(self, key: Key, endpoint: str, *, sender: str, hwm: int = 2,
                 batch_dims: int = 0, ctx: zmq.Context | None = None,
                 handshake: Handshake | None = None):
        super().__init__(zmq.PUSH, ctx, SENDER_MAX_BYTES, handshake)
        self._auth = as_authenticator(key)
        self.sender = sender
        self.batch_dims = batch_dims
        self._seq = _first_seq()
        self.socket.sndhwm = hwm
        self._connect(endpoint)

    def send(self, tree: Any, version: int, timeout_ms: int | None = 1000) -> bool:
        """Queues `tree` stamped with `version`. False if the high-water mark stays reached
        for timeout_ms (the learner is not reading): backpressure, nothing was sent.
        Leaves go out without copies: do not write to them until sent."""
        self._seq += 1
        frames = encode(tree, auth=self._auth, kind="traj", version=version, sender=self.sender,
                        seq=self._seq, batch_dims=self.batch_dims)
        # try first, wait only when full: a poll per message costs more than the rare retry.
        # A multipart message is queued whole or not at all, so NOBLOCK cannot split it.
        try:
            self.socket.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
            return True
        except zmq.Again:
            pass
        if not self.socket.poll(timeout_ms, zmq.POLLOUT):
            return False  # the tag and seq are spent; seqs only need to increase
        try:
            self.socket.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return False
        return True


class TrajectoryReceiver(_Channel):
    """Learner side: `recv()` returns the next valid Message (sender, version, seq, tree).
    Bad messages are dropped and counted: `rejected[reason]`; good ones in `accepted`."""

    def __init__(self, key: Key, template: Any, *, endpoint: str | None = None,
                 host: str = DEFAULT_HOST, transport: Literal["tcp", "ipc"] = "tcp",
                 hwm: int = 4, max_bytes: int | None = None, batch_dims: int = 0,
                 ctx: zmq.Context | None = None, handshake: Handshake | None = None,
                 ipc_dir: str | None = None, use_fd: int | None = None):
        spec = template if isinstance(template, TreeSpec) else TreeSpec(template, batch_dims=batch_dims)
        # never above the exact size a template without batch dims fixes
        max_bytes = min(max_bytes or (1 << 62), _default_max_bytes(spec))
        super().__init__(zmq.PULL, ctx, max_bytes, handshake)
        self._auth = as_authenticator(key)
        self.spec = spec
        self.max_bytes = max_bytes
        self.socket.rcvhwm = hwm
        self._bind(endpoint, host, transport, ipc_dir, use_fd)
        self.accepted = 0
        self.rejected: collections.Counter = collections.Counter()
        self._guard = ReplayGuard()

    def recv(self, timeout_ms: int | None = 0) -> Message | None:
        def valid(frames):
            msg = decode(frames, auth=self._auth, spec=self.spec, kind="traj", max_bytes=self.max_bytes)
            self._guard.check(msg)
            return msg

        return self._recv_valid(timeout_ms, valid)


# ------------------------------------------------------------------------------ control
class ControlServer(_Channel):
    """Learner side of control. Clients are addressed by their authenticated sender name
    (bytes). NOTE: ZeroMQ assigns each connection its routing id, and replies to a name go
    to the connection its last *authenticated* message came from, so a peer without the
    key can neither claim a name nor divert an actor's credits and stop messages."""

    def __init__(self, key: Key, *, endpoint: str | None = None, host: str = DEFAULT_HOST,
                 transport: Literal["tcp", "ipc"] = "tcp", sender: str = "learner",
                 max_bytes: int = CONTROL_MAX_BYTES, ctx: zmq.Context | None = None,
                 handshake: Handshake | None = None, ipc_dir: str | None = None,
                 use_fd: int | None = None):
        super().__init__(zmq.ROUTER, ctx, max_bytes, handshake)
        self._auth = as_authenticator(key)
        self.sender = sender
        self.max_bytes = max_bytes
        self._seq = _first_seq()
        # unknown routes raise instead of vanishing
        self.socket.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._bind(endpoint, host, transport, ipc_dir, use_fd)
        self._routes: dict[bytes, bytes] = {}  # sender name -> routing id of its connection
        self.peers: dict[bytes, float] = {}  # identity -> monotonic time last heard
        self.accepted = 0
        self.rejected: collections.Counter = collections.Counter()
        self._guard = ReplayGuard()

    def poll(self, timeout_ms: int | None = 0) -> tuple[bytes, dict] | None:
        def valid(frames):
            msg = decode_json(frames[1:], auth=self._auth, kind="ctrl", max_bytes=self.max_bytes)
            self._guard.check(msg)
            return frames[0].bytes, msg

        got = self._recv_valid(timeout_ms, valid)
        if got is None:
            return None
        route, msg = got
        name = msg.sender.encode()
        self._routes[name] = route  # a restarted actor's new connection takes over
        self.peers[name] = time.monotonic()
        return name, msg.body

    def send(self, identity: bytes, msg: dict) -> bool:
        """Sends to the client named `identity`; False if it is unknown or gone, or its
        queue is full."""
        route = self._routes.get(identity)
        if route is None:
            return False
        self._seq += 1
        frames = encode_json(msg, auth=self._auth, kind="ctrl", sender=self.sender, seq=self._seq)
        try:
            self.socket.send_multipart([route, *frames], flags=zmq.NOBLOCK)
        except (zmq.Again, zmq.ZMQError):
            return False
        return True

    def broadcast(self, msg: dict) -> int:
        """Sends msg to every client heard from; returns how many took it."""
        return sum(self.send(identity, msg) for identity in list(self.peers))

    def forget(self, identity: bytes) -> None:
        self.peers.pop(identity, None)
        self._routes.pop(identity, None)


class ControlClient(_Channel):
    """Actor side of control; `identity` names the actor (its messages' sender)."""

    def __init__(self, key: Key, endpoint: str, *, identity: str, hwm: int = 1000,
                 ctx: zmq.Context | None = None, handshake: Handshake | None = None):
        super().__init__(zmq.DEALER, ctx, CONTROL_MAX_BYTES, handshake)
        self._auth = as_authenticator(key)
        self.identity = identity
        self._seq = _first_seq()
        self.socket.sndhwm = hwm
        self._connect(endpoint)
        self.accepted = 0
        self.rejected: collections.Counter = collections.Counter()
        self._guard = ReplayGuard()

    def send(self, msg: dict) -> bool:
        """Queues msg (a JSON object with a string "type"); False if the queue is full."""
        self._seq += 1
        frames = encode_json(msg, auth=self._auth, kind="ctrl", sender=self.identity, seq=self._seq)
        try:
            self.socket.send_multipart(frames, flags=zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True

    def recv(self, timeout_ms: int | None = 0) -> dict | None:
        def valid(frames):
            msg = decode_json(frames, auth=self._auth, kind="ctrl", max_bytes=CONTROL_MAX_BYTES)
            self._guard.check(msg)
            return msg.body

        return self._recv_valid(timeout_ms, valid)
