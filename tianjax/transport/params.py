"""The parameter channel: the learner's `ParamPublisher` (PUB, binds) to the actors'
`ParamSubscriber`s (SUB, connect, conflating: each keeps only the newest version)."""

from __future__ import annotations

import collections
from typing import Any, Literal

import zmq

from tianjax.transport import envelope
from tianjax.transport.auth import as_authenticator
from tianjax.transport.codec import BROADCAST, CodecError, ReplayGuard, TreeSpec, decode, encode
from tianjax.transport.connections import ConnectionLimit
from tianjax.transport.security import SUBSCRIPTION_MAX_BYTES, Handshake
from tianjax.transport.sockets import (
    DEFAULT_HOST,
    Key,
    _Channel,
    _deadline,
    _default_max_bytes,
    _remaining_ms,
    address,
    keep_alive,
    process_incarnation,
)


class ParamPublisher(_Channel):
    """Learner side: publishes (version, params) to every subscribed actor.

    Subscriptions are the publisher's to approve (an XPUB with ZMQ_XPUB_MANUAL): the only
    ones taken are its `topics` (by default the empty topic, everything, which is what
    every actor asks for); any other is counted in `subscriptions_refused` and never
    stored, so a peer past the handshake cannot make the socket keep an unbounded set of
    topics.
    `serve_subscriptions()` reads the ones queued (publish() does it first); the thread
    that owns the socket calls it while idle too.

    A message goes out as one frame (tianjax.transport.envelope: the subscriber conflates, and
    ZeroMQ conflates single frames only), packed by one copy, so the caller may reuse the
    tree's arrays once publish() returns. At its HWM a PUB drops the message being
    published, i.e. the newest. The HWM is therefore not tiny: a burst of publishes can
    outrun the I/O thread, and the newest version must not be the one lost. The
    subscriber's I/O thread reads everything that arrives and keeps the newest, so what
    the PUB queues for it drains at the speed of the connection, not of the actor.
    """

    KIND = "params"  # the codec's kind of what it sends (a subclass may send another)

    def __init__(
        self,
        key: Key,
        *,
        endpoint: str | None = None,
        host: str = DEFAULT_HOST,
        transport: Literal["tcp", "ipc"] = "tcp",
        sender: str = "learner",
        hwm: int = 8,
        batch_dims: int = 0,
        ctx: zmq.Context | None = None,
        handshake: Handshake | None = None,
        ipc_dir: str | None = None,
        use_fd: int | None = None,
        incarnation: str | None = None,
        limit: ConnectionLimit | None = None,
        topics: tuple[bytes, ...] = (b"",),
    ):
        # what a PUB receives are subscriptions: tiny, so an oversized one is refused unread
        super().__init__(zmq.XPUB, ctx, SUBSCRIPTION_MAX_BYTES, handshake)
        self.socket.setsockopt(zmq.XPUB_MANUAL, 1)
        keep_alive(self.socket)  # a connection to a cut-off actor is closed, not backed off
        self.subscriptions = 0
        self.subscriptions_refused = 0
        self.topics = frozenset(topics)  # the only subscriptions taken
        self.subscribed: list[bytes] = []  # topics subscribed to since the caller last looked
        self._auth = as_authenticator(key)
        self.sender = sender
        self.incarnation = incarnation or process_incarnation()
        self.address = address(sender, self.incarnation)  # what actors address the learner as
        self.batch_dims = batch_dims
        self._seq = -1
        self.socket.sndhwm = hwm
        self._bind(endpoint, host, transport, ipc_dir, use_fd, limit)

    def serve_subscriptions(self, limit: int = 1024) -> None:
        """Approves the subscriptions queued (at most `limit`) to its topics, refuses others."""
        for _ in range(limit):
            try:
                msg = self.socket.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            if msg[:1] == b"\x01" and msg[1:] in self.topics:
                # (a subscription applies to the peer it came from)
                self.socket.setsockopt(zmq.SUBSCRIBE, msg[1:])
                self.subscriptions += 1
                if msg[1:]:  # (a named topic: its subscriber is one the caller may serve)
                    self.subscribed.append(msg[1:])
            elif msg[:1] != b"\x00":  # (an unsubscribe needs nothing: nothing else is stored)
                self.subscriptions_refused += 1

    def publish(
        self, version: int, params: Any, body: dict | None = None, topic: bytes = b""
    ) -> None:
        """Sends (version, params) to every subscriber (of `topic`: to those who subscribed
        to it), with `body` (a small JSON object)."""
        self.serve_subscriptions()
        self._seq += 1
        frames = encode(
            params,
            auth=self._auth,
            kind=self.KIND,
            version=version,
            sender=self.sender,
            seq=self._seq,
            inc=self.incarnation,
            to=BROADCAST,
            batch_dims=self.batch_dims,
            body=body,
        )
        self.socket.send(envelope.pack(frames, topic), copy=False)  # PUB never blocks


class ParamSubscriber(_Channel):
    """Actor side: `latest()` hands out the newest valid version, once.

    `template` is an example params tree (arrays or ShapeDtypeStructs) or a TreeSpec.
    Counters: `accepted`, `rejected` (by reason), `stale` (valid but not newer than the
    version held), `skipped` (older messages behind a newer valid one, never verified).
    `source` is the address ("name@incarnation") of the learner whose version is held: the
    one an actor registers with and addresses. A restarted learner is a new incarnation;
    its first valid message is taken whatever its version (a resumed learner goes on from its last
    checkpoint, which may be behind what the subscriber held), and `source_changes`
    counts such restarts. With `same_version`, a newer message of the version held is
    handed out too (the learner republishes a version when what rides with it, such as its
    env-step count, has moved on). `body` is the JSON body of the version handed out last.
    """

    KIND = "params"  # the codec's kind of what it takes (a subclass may take another)

    # NOTE: the socket conflates (ZMQ_CONFLATE): its I/O thread reads every message as it
    # arrives and keeps the newest, so nothing waits in the kernel's socket buffers to be
    # handed out later. (With a small RCVHWM instead, a backlog of old versions stayed
    # there and an actor reading once per rollout fell ever further behind.) The drain
    # keeps the newest few in case several frames are read at once (a test's raw socket).
    _KEEP = 8
    _MAX_DRAIN = 100_000

    def __init__(
        self,
        key: Key,
        endpoint: str,
        template: Any,
        *,
        max_bytes: int | None = None,
        batch_dims: int = 0,
        same_version: bool = False,
        ctx: zmq.Context | None = None,
        handshake: Handshake | None = None,
        limit: ConnectionLimit | None = None,
        topic: bytes = b"",
    ):
        spec = (
            template
            if isinstance(template, TreeSpec)
            else TreeSpec(template, batch_dims=batch_dims)
        )
        # never above the exact size a template without batch dims fixes
        max_bytes = min(max_bytes or (1 << 62), _default_max_bytes(spec))
        # the envelope is one frame: the payload's bound plus its table and padding (and
        # the topic it opens with)
        super().__init__(
            zmq.SUB,
            ctx,
            max_bytes + envelope.overhead(len(spec.leaves) + 2) + envelope.ALIGN,
            handshake,
        )
        self.topic = topic
        self.same_version = same_version
        self._auth = as_authenticator(key)
        self.spec = spec
        self.max_bytes = max_bytes
        # one message held, the newest (set before connecting; RCVHWM is then ignored)
        self.socket.setsockopt(zmq.CONFLATE, 1)
        self.socket.setsockopt(zmq.SUBSCRIBE, topic)
        keep_alive(self.socket)  # after a cut link, a new connection within about a second
        self._connect(endpoint, limit)
        self.version = -1
        self.body: dict | None = None
        self.source: str | None = None  # the address (learner incarnation) of `version`
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
                msg = decode(
                    envelope.unpack(raws[i].buffer, topic=bool(self.topic)),
                    auth=self._auth,
                    spec=self.spec,
                    kind=self.KIND,
                    max_bytes=self.max_bytes,
                    to=BROADCAST,
                )
                self._guard.check(msg)
            except CodecError as e:
                self.rejected[e.reason] += 1
                continue
            older = msg.version < self.version or (
                msg.version == self.version and not self.same_version
            )
            if older and msg.source == self.source:
                self.stale += 1
                continue
            if self.source is not None and msg.source != self.source:
                self.source_changes += 1  # a restarted learner: its count is the one to follow
            self.source = msg.source
            self.accepted += 1
            self.skipped += i
            self.version = msg.version
            self.body = msg.body
            return msg.version, msg.tree
        return None

    def latest(self, timeout_ms: int | None = 0) -> tuple[int, Any] | None:
        """(version, params) newer than any handed out before, or None if none arrives
        within timeout_ms. Drains everything queued; older versions are dropped."""
        if timeout_ms == 0 and not self.socket.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            # NOTE: nothing queued, said without a receive that fails: an actor looks before
            # every vector step (runtime.param_refresh: step), and a failed NOBLOCK receive
            # costs a fast env's actor about 7% of its steps (experiments/benchmarks/bench_inflight.py)
            return None
        deadline = _deadline(timeout_ms)
        while True:
            raws = self._drain()
            if raws and (got := self._newest(raws)) is not None:
                return got
            remaining = _remaining_ms(deadline)
            if remaining == 0 or not self.socket.poll(remaining):
                return None


__all__ = ["ParamPublisher", "ParamSubscriber"]
