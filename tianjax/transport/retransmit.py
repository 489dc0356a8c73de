"""TCP's retransmission back-off, capped on a run's connections.

When a link goes down, TCP retransmits what is unacknowledged with a timeout that doubles
each time, up to two minutes. After the link comes back, nothing moves until the next
retransmission is due: after a 20 s cut that is anywhere from at once to several seconds
later (6.5 s in a probe here), and after a minute's cut up to 42 s (the retries come
0.2, 0.6, 1.4, ... 25.4, 51.0, 102.2 s after the cut). Meanwhile
an actor waits for the credits the learner sent it during the cut, though the link is
up. The side whose own cable was pulled does not wait: its sends fail locally, and the
kernel tries again every half second.

`cap_backoff(sock)` sets `TCP_RTO_MAX_MS` (Linux 6.15 and later) on one connection, so
that its retransmissions come at least every `RTO_MAX_MS` while a cut lasts and the
connection moves again within that of the heal. Nothing is closed or sent again, so
nothing is lost: the bytes are TCP's, as before. With the cap, `tcp_retries2`'s
retransmissions would run out in about 15 s and end the connection (what was queued on
it lost), so it also sets `TCP_USER_TIMEOUT` to the time they take without the cap
(`GIVE_UP_MS`): a connection is given up no sooner than today. The cost: a retransmission
a second, of one segment, per connection with data unacknowledged during a cut.

Older kernels refuse the option (ENOPROTOOPT): the connection is left as it is, and
`cap_backoff` says so. `net.ipv4.tcp_rto_max_ms` (the same cap, for every connection of
a host or network namespace) does it from outside.
"""

from __future__ import annotations

import socket as _socket

# Linux's option numbers (include/uapi/linux/tcp.h); Python's socket module names neither
# on every version
TCP_USER_TIMEOUT = getattr(_socket, "TCP_USER_TIMEOUT", 18)
TCP_RTO_MAX_MS = getattr(_socket, "TCP_RTO_MAX_MS", 44)

RTO_MAX_MS = 1000
# what tcp_retries2 (15) allows without the cap: 200 ms doubled up to 120 s, then 120 s
# each: (2^10 - 1) * 0.2 s + 6 * 120 s
GIVE_UP_MS = 924_600


def cap_backoff(sock: _socket.socket, rto_max_ms: int = RTO_MAX_MS) -> bool:
    """Caps `sock`'s retransmission timeout at `rto_max_ms` and keeps its give-up time;
    False (and `sock` untouched) where the kernel has no such option, or `sock` is no
    tcp connection."""
    try:
        sock.setsockopt(_socket.IPPROTO_TCP, TCP_USER_TIMEOUT, GIVE_UP_MS)
    except OSError:
        return False
    try:
        sock.setsockopt(_socket.IPPROTO_TCP, TCP_RTO_MAX_MS, int(rto_max_ms))
    except OSError:
        sock.setsockopt(_socket.IPPROTO_TCP, TCP_USER_TIMEOUT, 0)  # (0: the kernel's own)
        return False
    return True


__all__ = ["GIVE_UP_MS", "RTO_MAX_MS", "cap_backoff"]
