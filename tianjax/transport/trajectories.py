"""The trajectory channel: actors' `TrajectorySender`s (PUSH, connect) to the learner's
`TrajectoryReceiver` (PULL, binds); high-water marks are the backpressure."""

from __future__ import annotations

import collections
from typing import Any, Literal

import zmq

from tianjax.transport.auth import as_authenticator
from tianjax.transport.codec import Message, ReplayGuard, TreeSpec, decode, encode
from tianjax.transport.connections import ConnectionLimit
from tianjax.transport.security import SENDER_MAX_BYTES, Handshake
from tianjax.transport.sockets import (
    DEFAULT_HOST,
    Key,
    _Channel,
    _default_max_bytes,
    address,
    process_incarnation,
)


class TrajectorySender(_Channel):
    """Actor side: pushes trajectory trees to the learner; `hwm` bounds what may queue.
    `to` is the learner incarnation they are for (its `address`, "learner-0@..."): an actor
    sets it to the one it registered with, and a learner takes no other's. `incarnation`:
    this sender's (default: the process's)."""

    KIND = "traj"  # the codec's kind of what it sends (a subclass may send another)

    def __init__(
        self,
        key: Key,
        endpoint: str,
        *,
        sender: str,
        to: str | None = None,
        hwm: int = 2,
        batch_dims: int = 0,
        ctx: zmq.Context | None = None,
        handshake: Handshake | None = None,
        limit: ConnectionLimit | None = None,
        incarnation: str | None = None,
    ):
        super().__init__(zmq.PUSH, ctx, SENDER_MAX_BYTES, handshake)
        self._auth = as_authenticator(key)
        self.sender = sender
        self.incarnation = incarnation or process_incarnation()
        self.to = to
        self.batch_dims = batch_dims
        self._seq = -1  # the first message is 0
        self.socket.sndhwm = hwm
        self._connect(endpoint, limit)

    @property
    def seq(self) -> int:
        """The sequence number of the newest message sent (-1: none yet)."""
        return self._seq

    def send(
        self, tree: Any, version: int, timeout_ms: int | None = 1000, body: dict | None = None
    ) -> bool:
        """Queues `tree` stamped with `version` (and `body`, a small JSON object). False if
        the high-water mark stays reached for timeout_ms (the learner is not reading):
        backpressure, nothing was sent. Leaves go out without copies: do not write to them
        until sent."""
        if self.to is None:
            raise RuntimeError("a trajectory sender needs its recipient (`to`) before it sends")
        self._seq += 1
        frames = encode(
            tree,
            auth=self._auth,
            kind=self.KIND,
            version=version,
            sender=self.sender,
            seq=self._seq,
            inc=self.incarnation,
            to=self.to,
            batch_dims=self.batch_dims,
            body=body,
        )
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
    Bad messages are dropped and counted: `rejected[reason]`; good ones in `accepted`.
    Only messages addressed to `address` ("name@incarnation") are taken."""

    KIND = "traj"  # the codec's kind of what it takes (a subclass may take another)

    def __init__(
        self,
        key: Key,
        template: Any,
        *,
        endpoint: str | None = None,
        host: str = DEFAULT_HOST,
        transport: Literal["tcp", "ipc"] = "tcp",
        hwm: int = 4,
        max_bytes: int | None = None,
        batch_dims: int = 0,
        ctx: zmq.Context | None = None,
        handshake: Handshake | None = None,
        ipc_dir: str | None = None,
        use_fd: int | None = None,
        name: str = "learner",
        incarnation: str | None = None,
        limit: ConnectionLimit | None = None,
    ):
        spec = (
            template
            if isinstance(template, TreeSpec)
            else TreeSpec(template, batch_dims=batch_dims)
        )
        # never above the exact size a template without batch dims fixes
        max_bytes = min(max_bytes or (1 << 62), _default_max_bytes(spec))
        super().__init__(zmq.PULL, ctx, max_bytes, handshake)
        self._auth = as_authenticator(key)
        self.spec = spec
        self.max_bytes = max_bytes
        self.socket.rcvhwm = hwm
        self._bind(endpoint, host, transport, ipc_dir, use_fd, limit)
        self.accepted = 0
        self.rejected: collections.Counter = collections.Counter()
        self._guard = ReplayGuard()
        self.address = address(name, incarnation or process_incarnation())

    def recv(self, timeout_ms: int | None = 0) -> Message | None:
        def valid(frames):
            msg = decode(
                frames,
                auth=self._auth,
                spec=self.spec,
                kind=self.KIND,
                max_bytes=self.max_bytes,
                to=self.address,
            )
            self._guard.check(msg)
            return msg

        return self._recv_valid(timeout_ms, valid)


__all__ = ["TrajectoryReceiver", "TrajectorySender"]
