"""Who may connect to a run's sockets at all: ZeroMQ handshakes keyed by the run key, and
the ZAP handler that admits or refuses each connection before it carries a message.

The per-message MAC (`auth`) stops anything from outside the run from being *accepted*,
but not from costing the learner memory and descriptors first: a peer that can reach a
port can hold connections, send frames up to any size, and subscribe to the parameters.
So every socket of a run also authenticates at the connection (TianJi, arXiv 2502.20190,
section 3, leaves this to the deployment; a shared machine or a network cannot):

    runtime.security: plain  ZeroMQ PLAIN with a token derived from the run key. Cheap (no
                             per-byte cost). The token travels in clear: on loopback only
                             root can read it; on a network an eavesdropper who reads it
                             can connect, and still can neither inject, forge nor replay
                             (MACs; every message is bound to one recipient, direction and
                             sender incarnation, see codec.py), but can cost the learner
                             memory (ZeroMQ caps frames, not messages) and CPU.
                             Parameters and trajectories travel in clear.
    runtime.security: curve  CurveZMQ (Curve25519 + XSalsa20-Poly1305) with a server key
                             pair and a client key pair derived from the run key: the
                             actors are pinned to the server's public key (a squatter on a
                             learner's port cannot complete a handshake with them), the
                             learner admits only the client key, and every byte is
                             encrypted. Costs CPU per byte (see experiments/benchmarks/bench_transport.py).

Derivation (HMAC-SHA256 as a PRF; labels keep the outputs independent of each other and
of the MAC keys in `auth`):

    token          = hex(HMAC(run_key, "tianjax.plain.v1")[:16])
    server secret  = HMAC(run_key, "tianjax.curve.server.v1")   (Curve25519 clamps it)
    client secret  = HMAC(run_key, "tianjax.curve.client.v1")
    public keys    = Curve25519 base-point multiples of the secrets (zmq.curve_public)

Fail closed. Every server socket sets ZAP_ENFORCE_DOMAIN: without a live ZAP handler
libzmq would admit any CURVE client that knows the server's public key (and, unenforced,
treats a missing handler as consent), so a gatekeeper that died would open the door; with
it, no handler means no connection, and the learner stops with one line when its
gatekeeper is gone (`Gatekeeper.alive`). The ZAP domain names the transport ("tianjax.tcp",
"tianjax.ipc"): a tcp peer must come with its address, and `allow_hosts` is enforced on
it twice, by the kernel-side accept filter (ZMQ_TCP_ACCEPT_FILTER: a refused host's
connection is closed at accept, before any handshake or Python code runs) and by the
gatekeeper. ipc peers have no address; their socket's private directory guards them.

Bounds on what an unauthenticated peer costs: every receiving socket has ZeroMQ's
`maxmsgsize` (a larger frame disconnects its sender before it is buffered), a binding
PUB accepts subscriptions of at most `SUBSCRIPTION_MAX_BYTES`, a handshake not finished
within `HANDSHAKE_MS` closes the connection, and a refused handshake closes it at once;
so a peer without the run key holds a descriptor for at most HANDSHAKE_MS and never gets
a frame into the learner. How many connections one host holds on each server socket at
once, with credentials or without, is bounded by `runtime.max_connections_per_host`
(`SecureContext.limit`, tianjax.transport.connections): one over it is ended as soon as
it is accepted and counted as refused ("per_host_limit"), those within it are never
touched. It bounds a host, not a peer with many addresses, and on a shared host (on
loopback: every local user) a peer that fills the host's slots first makes a new actor
connection from there wait for one to free.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import ipaddress
import sys
import threading
from typing import Literal

import zmq
from zmq.utils import z85

from tianjax.transport.auth import RunKey
from tianjax.transport.connections import ConnectionLimit

Security = Literal["plain", "curve"]
SECURITY_LEVELS = ("plain", "curve")
HANDSHAKE_MS = 3000  # a connection that has not authenticated by then is closed
# NOTE: the cap covers handshake commands too: CurveZMQ's INITIATE is ~300 bytes with its
# metadata, so these are not tighter than 4 KiB.
SUBSCRIPTION_MAX_BYTES = 4096  # a SUB's subscribe message is 1 byte + topic; ours is empty
SENDER_MAX_BYTES = 4096  # sockets that only send still cap what a peer may push at them
ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # fixed by the ZAP specification (RFC 27)
_PLAIN_USER = b"tianjax"
_ZAP_POLL_MS = 100


def is_loopback(host: str) -> bool:
    """Whether binding to `host` keeps the sockets on this machine."""
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: assume it is reachable from elsewhere


def resolve_security(security: str | None, bind_host: str) -> Security:
    """`runtime.security`, with null meaning: curve unless the learner binds to loopback."""
    if security is None:
        return "plain" if is_loopback(bind_host) else "curve"
    return security  # type: ignore[return-value]


def _prf(run_key: RunKey | bytes, label: bytes) -> bytes:
    return hmac.digest(bytes(run_key), label, hashlib.sha256)


def limit_frames(socket: zmq.Socket, max_bytes: int) -> None:
    """Frames over max_bytes disconnect their sender before they are buffered, and a
    handshake that has not finished within HANDSHAKE_MS closes the connection."""
    socket.setsockopt(zmq.MAXMSGSIZE, int(max_bytes))
    socket.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_MS)


DOMAIN_TCP, DOMAIN_IPC = b"tianjax.tcp", b"tianjax.ipc"


class Handshake:
    """The connection credentials of one run, derived from its key. `server(socket)` and
    `client(socket)` configure a socket before it binds or connects; `admits` is the ZAP
    handler's check. `allow`: the only hosts a tcp server admits (empty: any with the
    credentials). Holds secrets: its repr hides them and it refuses to be pickled."""

    __slots__ = (
        "security",
        "allow",
        "_token",
        "_server_secret",
        "_client_secret",
        "server_public",
        "client_public",
    )

    def __init__(self, run_key: RunKey | bytes, security: Security, allow: tuple[str, ...] = ()):
        if security not in SECURITY_LEVELS:
            raise ValueError(f"security must be one of {SECURITY_LEVELS}, got {security!r}")
        self.security = security
        self.allow = tuple(str(ipaddress.ip_address(a)) for a in allow)
        self._token = _prf(run_key, b"tianjax.plain.v1")[:16].hex().encode()
        self._server_secret = self._client_secret = b""
        self.server_public = self.client_public = b""
        if security == "curve":
            if not zmq.has("curve"):
                raise ValueError("security 'curve' needs libzmq built with CURVE support")
            self._server_secret = z85.encode(_prf(run_key, b"tianjax.curve.server.v1"))
            self._client_secret = z85.encode(_prf(run_key, b"tianjax.curve.client.v1"))
            self.server_public = zmq.curve_public(self._server_secret)
            self.client_public = zmq.curve_public(self._client_secret)

    def server(self, socket: zmq.Socket, ipc: bool = False) -> None:
        """Before the socket binds (`ipc`: to an ipc endpoint)."""
        socket.setsockopt(zmq.ZAP_DOMAIN, DOMAIN_IPC if ipc else DOMAIN_TCP)
        socket.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)  # no live handler: no connection
        if not ipc:
            for host in self.allow:
                if ":" in host:
                    socket.ipv6 = True  # (the filter parses an IPv6 address only then)
                socket.setsockopt(zmq.TCP_ACCEPT_FILTER, host.encode())
        if self.security == "curve":
            socket.setsockopt(zmq.CURVE_SERVER, 1)
            socket.setsockopt(zmq.CURVE_SECRETKEY, self._server_secret)
        else:
            socket.setsockopt(zmq.PLAIN_SERVER, 1)

    def client(self, socket: zmq.Socket) -> None:
        if self.security == "curve":
            socket.setsockopt(zmq.CURVE_SERVERKEY, self.server_public)
            socket.setsockopt(zmq.CURVE_PUBLICKEY, self.client_public)
            socket.setsockopt(zmq.CURVE_SECRETKEY, self._client_secret)
        else:
            socket.setsockopt(zmq.PLAIN_USERNAME, _PLAIN_USER)
            socket.setsockopt(zmq.PLAIN_PASSWORD, self._token)

    def admits(self, mechanism: bytes, credentials: list[bytes]) -> str | None:
        """None if the credentials are this run's, else why not ("mechanism", "credentials")."""
        if self.security == "curve":
            if mechanism != b"CURVE":
                return "mechanism"
            key = credentials[0] if len(credentials) == 1 else b""
            ok = hmac.compare_digest(z85.encode(key) if len(key) == 32 else b"", self.client_public)
            return None if ok else "credentials"
        if mechanism != b"PLAIN":
            return "mechanism"
        if len(credentials) != 2:
            return "credentials"
        user_ok = hmac.compare_digest(credentials[0], _PLAIN_USER)
        token_ok = hmac.compare_digest(credentials[1], self._token)
        return None if user_ok and token_ok else "credentials"

    def __repr__(self) -> str:
        return f"Handshake({self.security})"

    def __reduce__(self):
        raise TypeError("Handshake holds keys derived from the run key and is not picklable")


class Gatekeeper:
    """The ZAP handler of one ZeroMQ context: a thread that admits a connection only if its
    handshake carries this run's credentials and, when `allow` is not empty, it comes from
    one of those addresses. Counts: `admitted`, `refused[reason]` (reason: "address",
    "domain", "mechanism", "credentials"). `alive` is False once its thread has stopped
    (closed, or failed: `error`); with ZAP_ENFORCE_DOMAIN nothing is admitted then.

    NOTE: libzmq asks the handler of the socket's own context, so there is one Gatekeeper
    per context, started before any server socket binds (a PLAIN server with no handler
    would admit anyone) and closed before the context is terminated.
    """

    def __init__(
        self, ctx: zmq.Context, handshake: Handshake, allow: tuple[str, ...] | None = None
    ):
        self.handshake = handshake
        self.allow = frozenset(
            str(ipaddress.ip_address(a)) for a in (handshake.allow if allow is None else allow)
        )
        self.admitted = 0
        self.refused: collections.Counter = collections.Counter()
        self._ctx = ctx
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name="tianjax-zap", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    def _serve(self) -> None:
        try:
            sock = self._ctx.socket(zmq.REP)
            sock.linger = 0
            sock.bind(ZAP_ENDPOINT)
        except zmq.ZMQError as e:
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        try:
            while not self._stop.is_set():
                if not sock.poll(_ZAP_POLL_MS):
                    continue
                request = sock.recv_multipart()
                try:
                    reply = self._answer(request)
                except Exception:  # noqa: BLE001 - a request it cannot read is refused, not fatal
                    self.refused["malformed"] += 1
                    reply = [
                        b"1.0",
                        request[1] if len(request) > 1 else b"",
                        b"500",
                        b"malformed",
                        b"",
                        b"",
                    ]
                sock.send_multipart(reply)
        except BaseException as e:  # noqa: BLE001 - the learner sees it through `alive`
            self.error = e
        finally:
            sock.close(linger=0)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def error(self) -> BaseException | None:
        return self._error

    @error.setter
    def error(self, e: BaseException) -> None:
        self._error = e

    def _answer(self, request: list[bytes]) -> list[bytes]:
        if len(request) < 6:
            return [b"1.0", request[1] if len(request) > 1 else b"", b"500", b"malformed", b"", b""]
        version, request_id, domain, address, _identity, mechanism, *credentials = request
        why = None
        if domain == DOMAIN_TCP:
            # a tcp peer always has an address: none is refused, as is one not allowed
            try:
                host = str(ipaddress.ip_address(address.decode("ascii", "replace")))
            except ValueError:
                host = ""
            if not host or (self.allow and host not in self.allow):
                why = "address"
        elif domain != DOMAIN_IPC:  # (ipc peers have no address: their directory guards them)
            why = "domain"
        why = why or self.handshake.admits(mechanism, credentials)
        if why is None:
            self.admitted += 1
            return [version, request_id, b"200", b"OK", b"tianjax", b""]
        self.refused[why] += 1
        return [version, request_id, b"400", why.encode(), b"", b""]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class SecureContext:
    """A role's own ZeroMQ context, with the run's handshake; on the learner (the side
    that binds), the gatekeeper that checks it; and the connection watcher its sockets
    are given (`limit`, see tianjax.transport.connections): it caps the TCP back-off of
    every connection of theirs and, on a server (`server=True`), holds each host to
    `max_connections_per_host` connections per socket (0: no limit). `io_threads`:
    CurveZMQ encrypts in the I/O threads, so curve gets two by default (one is the
    limit otherwise)."""

    def __init__(
        self,
        run_key: RunKey | bytes,
        security: Security,
        *,
        server: bool,
        allow: tuple[str, ...] = (),
        io_threads: int | None = None,
        max_connections_per_host: int = 0,
    ):
        self.handshake = Handshake(run_key, security, allow)
        self.io_threads = io_threads or (2 if security == "curve" else 1)
        self.ctx = zmq.Context(io_threads=self.io_threads)
        self.gatekeeper: Gatekeeper | None = None
        self.limit: ConnectionLimit | None = None
        try:
            if server:
                self.gatekeeper = Gatekeeper(self.ctx, self.handshake)
            # (with no limit, and on a client, it still caps each connection's TCP back-off)
            self.limit = ConnectionLimit(self.ctx, (server and max_connections_per_host) or None)
        except BaseException:
            self.close()
            raise

    @property
    def refused(self) -> collections.Counter:
        """Connections refused, by reason: at the handshake (the gatekeeper's reasons) and
        over the per-host limit ("per_host_limit")."""
        out: collections.Counter = collections.Counter()
        for part in (self.gatekeeper, self.limit):
            if part is not None:
                out.update(dict(part.refused))
        return out

    def close(self) -> None:
        if self.limit is not None:
            self.limit.close()
        if self.gatekeeper is not None:
            self.gatekeeper.close()
        self.ctx.destroy(linger=0)


MAC_OFF_LOOPBACK = (
    "tianjax: warning: runtime.security is plain and the learner binds to {host}, beyond loopback: anyone "
    "who can observe that network reads the connection token and every parameter and trajectory in "
    "clear; with the token they can connect to the learner's ports and make it spend memory and CPU "
    "on messages it then rejects (only the per-message MACs stop them from injecting or replaying "
    "anything). Use runtime.security: curve off loopback."
)


def secure_context(
    run_key: RunKey | bytes, runtime, *, server: bool, max_connections_per_host: int = 0
) -> SecureContext:
    """The SecureContext a role's `runtime` config section asks for (a learner binding
    beyond loopback under `plain` is warned what an observer of its network can do);
    `max_connections_per_host`: as resolved by the config (Config.max_connections_per_host)."""
    security = resolve_security(runtime.security, runtime.bind_host)
    if server and security == "plain" and not is_loopback(runtime.bind_host):
        print(MAC_OFF_LOOPBACK.format(host=runtime.bind_host), file=sys.stderr, flush=True)
    return SecureContext(
        run_key,
        security,
        server=server,
        allow=tuple(runtime.allow_hosts),
        io_threads=runtime.io_threads,
        max_connections_per_host=max_connections_per_host,
    )


__all__ = [
    "HANDSHAKE_MS",
    "SECURITY_LEVELS",
    "SUBSCRIPTION_MAX_BYTES",
    "Gatekeeper",
    "Handshake",
    "SecureContext",
    "is_loopback",
    "limit_frames",
    "resolve_security",
    "secure_context",
]
