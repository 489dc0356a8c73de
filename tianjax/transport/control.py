"""The control channel: the learner's `ControlServer` (ROUTER, binds) and the actors'
`ControlClient`s (DEALER, connect) exchange small JSON messages: register, heartbeat,
credit, stop. Actor to learner is the kind "ctrl.up", learner to actor "ctrl.down"; each
message names its recipient's incarnation (see codec), so none is good anywhere else."""

from __future__ import annotations

import collections
import time
from typing import Literal

import zmq

from tianjax.transport.auth import as_authenticator
from tianjax.transport.codec import CodecError, ReplayGuard, decode_json, encode_json
from tianjax.transport.connections import ConnectionLimit
from tianjax.transport.security import Handshake
from tianjax.transport.sockets import (
    CONTROL_MAX_BYTES,
    DEFAULT_HOST,
    Key,
    _Channel,
    address,
    process_incarnation,
)

CONTROL_RCVHWM = 64


class ControlServer(_Channel):
    """Learner side of control. Clients are addressed by their authenticated sender name
    (bytes). NOTE: ZeroMQ assigns each connection its routing id, and replies to a name go
    to the connection its last *authenticated* message came from, so a peer without the
    key can neither claim a name nor divert an actor's credits and stop messages. It takes
    only messages addressed to `address` (`sender`@`incarnation`), and addresses each reply
    to the incarnation of the client that last wrote under that name."""

    def __init__(
        self,
        key: Key,
        *,
        endpoint: str | None = None,
        host: str = DEFAULT_HOST,
        transport: Literal["tcp", "ipc"] = "tcp",
        sender: str = "learner",
        max_bytes: int = CONTROL_MAX_BYTES,
        ctx: zmq.Context | None = None,
        handshake: Handshake | None = None,
        ipc_dir: str | None = None,
        use_fd: int | None = None,
        incarnation: str | None = None,
        limit: ConnectionLimit | None = None,
    ):
        super().__init__(zmq.ROUTER, ctx, max_bytes, handshake)
        self._auth = as_authenticator(key)
        self.sender = sender
        self.incarnation = incarnation or process_incarnation()
        self.address = address(sender, self.incarnation)
        self.max_bytes = max_bytes
        self._seq = -1
        # unknown routes raise instead of vanishing
        self.socket.setsockopt(zmq.ROUTER_MANDATORY, 1)
        # NOTE: what one connection may have queued unread, in messages (libzmq's default is
        # 1000). An actor sends a register and a heartbeat a second; a flooding holder of
        # the PLAIN token, 64-frame messages of ~60 KB: about 27 MiB per connection at 1000
        self.socket.rcvhwm = CONTROL_RCVHWM
        self._bind(endpoint, host, transport, ipc_dir, use_fd, limit)
        self._routes: dict[bytes, tuple[bytes, str]] = {}  # name -> (routing id, incarnation)
        self.peers: dict[bytes, float] = {}  # identity -> monotonic time last heard
        self.accepted = 0
        self.rejected: collections.Counter = collections.Counter()
        self._guard = ReplayGuard()

    def poll(self, timeout_ms: int | None = 0) -> tuple[bytes, dict] | None:
        def valid(frames):
            msg = decode_json(
                frames[1:],
                auth=self._auth,
                kind="ctrl.up",
                max_bytes=self.max_bytes,
                to=self.address,
            )
            self._guard.check(msg)
            return frames[0].bytes, msg

        got = self._recv_valid(timeout_ms, valid)
        if got is None:
            return None
        route, msg = got
        name = msg.sender.encode()
        self._routes[name] = (route, msg.inc)  # a restarted actor's new connection takes over
        self.peers[name] = time.monotonic()
        return name, msg.body

    def send(self, identity: bytes, msg: dict) -> bool:
        """Sends to the client named `identity`; False if it is unknown or gone, or its
        queue is full."""
        got = self._routes.get(identity)
        if got is None:
            return False
        route, inc = got
        self._seq += 1
        frames = encode_json(
            msg,
            auth=self._auth,
            kind="ctrl.down",
            sender=self.sender,
            seq=self._seq,
            inc=self.incarnation,
            to=address(identity.decode(), inc),
        )
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
    """Actor side of control; `identity` names the actor (its messages' sender). `to` is the
    learner incarnation it talks to (its address, "learner-0@..."; None until the actor
    knows it): it sends there, and takes only that learner's messages addressed to its own
    `address` (`identity`@`incarnation`)."""

    def __init__(
        self,
        key: Key,
        endpoint: str,
        *,
        identity: str,
        to: str | None = None,
        hwm: int = 1000,
        ctx: zmq.Context | None = None,
        handshake: Handshake | None = None,
        limit: ConnectionLimit | None = None,
        incarnation: str | None = None,
    ):
        super().__init__(zmq.DEALER, ctx, CONTROL_MAX_BYTES, handshake)
        self._auth = as_authenticator(key)
        self.identity = identity
        self.incarnation = incarnation or process_incarnation()
        self.address = address(identity, self.incarnation)
        self.to = to
        self._seq = -1
        self.socket.sndhwm = hwm
        self._connect(endpoint, limit)
        self.accepted = 0
        self.rejected: collections.Counter = collections.Counter()
        self._guard = ReplayGuard()

    def send(self, msg: dict) -> bool:
        """Queues msg (a JSON object with a string "type"); False if the queue is full."""
        if self.to is None:
            raise RuntimeError("a control client needs its learner (`to`) before it sends")
        self._seq += 1
        frames = encode_json(
            msg,
            auth=self._auth,
            kind="ctrl.up",
            sender=self.identity,
            seq=self._seq,
            inc=self.incarnation,
            to=self.to,
        )
        try:
            self.socket.send_multipart(frames, flags=zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True

    def recv(self, timeout_ms: int | None = 0) -> dict | None:
        def valid(frames):
            msg = decode_json(
                frames,
                auth=self._auth,
                kind="ctrl.down",
                max_bytes=CONTROL_MAX_BYTES,
                to=self.address,
            )
            if msg.source != self.to:  # another learner, or one before a restart
                raise CodecError("incarnation", f"from {msg.source[:64]}, not the learner followed")
            self._guard.check(msg)
            return msg.body

        return self._recv_valid(timeout_ms, valid)


__all__ = ["CONTROL_RCVHWM", "ControlClient", "ControlServer"]
