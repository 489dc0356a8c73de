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

from tianjax.transport.control import ControlClient, ControlServer
from tianjax.transport.params import ParamPublisher, ParamSubscriber
from tianjax.transport.sockets import CONTROL_MAX_BYTES, DEFAULT_HOST
from tianjax.transport.trajectories import TrajectoryReceiver, TrajectorySender

__all__ = [
    "CONTROL_MAX_BYTES",
    "DEFAULT_HOST",
    "ControlClient",
    "ControlServer",
    "ParamPublisher",
    "ParamSubscriber",
    "TrajectoryReceiver",
    "TrajectorySender",
]
