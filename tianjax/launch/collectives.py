"""The address the learners' collectives use, whatever the host name resolves to.

JAX's CPU collectives are gloo's (`jax_cpu_collectives_implementation: gloo`, the
default). In jax/jaxlib 0.10 `make_cpu_client` (jax/_src/xla_bridge.py) builds them with
`make_gloo_tcp_collectives(distributed_client=...)`, giving gloo neither of the two
options its binding takes, `hostname` and `interface`. gloo's tcp device then resolves the
machine's own host name (gethostname, then getaddrinfo) and listens on, and advertises to
the other processes through the coordination service, the first of its addresses it can
bind. With Debian's default /etc/hosts (the host name on 127.0.1.1), or any host whose
name maps to 127.0.0.1, that is loopback: every other learner connects to its own
loopback, and the first collective fails.

So a learner chooses the address here, after jax.distributed.initialize and before JAX's
backend starts, and hands it to gloo as `hostname` (gloo takes an address there too):
jax.extend.backend.register_backend_factory replaces the CPU client's factory with one
that builds the same client with those collectives. (JAX has no config option for it;
`make_cpu_client` and the binding are JAX's own internals, so an upgrade of JAX checks
this module: tests/cluster/test_lockstep.py runs it on hosts with Debian's hosts file.)

The address, in this order:
1. `--bind-host`'s, where it names one address that is not loopback: the interface the
   user chose for the run;
2. the local address of this host's route to the coordinator (a UDP socket connected to
   it: nothing is sent), if not loopback;
3. otherwise this learner is on the coordinator's host, under a name that resolves to
   loopback there: the local address of the route to another learner's address from 1 or
   2, which the learners exchange through the coordination service's key-value store;
4. otherwise every learner is on this machine: loopback.

Then every learner opens a tcp connection to every other one's address (a listener on
it, for the check only); a learner that cannot reach another says so in one line with the
address it tried, before any collective can hang on it.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import NamedTuple

WILDCARDS = ("", "*", "0.0.0.0", "::", "[::]")
_KEY = "tianjax/net"
PROBE_TIMEOUT_S = 10.0


class Address(NamedTuple):
    address: str  # an IP address
    how: str  # where it came from, for the learner's start line


class Unreachable(Exception):
    """Some learner cannot reach another's collectives address; the message says which."""


def is_loopback(address: str) -> bool:
    return ipaddress.ip_address(address).is_loopback


def split_host_port(address: str) -> tuple[str, int]:
    """ "host:port" or "[v6]:port" -> (host, port)."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def resolve(host: str) -> str:
    """`host`'s first address as this host's resolver gives it."""
    return socket.getaddrinfo(host.strip("[]"), None, type=socket.SOCK_STREAM)[0][4][0]


def route_to(address: str) -> str:
    """The local address this host would send from to reach `address`."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect((address, 9))  # a UDP connect only picks the route
        return s.getsockname()[0]


def own_choice(coordinator: str, bind_host: str) -> Address:
    """Steps 1 and 2 of the module doc (step 2 may give loopback). Raises Unreachable."""
    if bind_host.strip() not in WILDCARDS:
        try:
            a = resolve(bind_host)
        except OSError as e:
            raise Unreachable(
                f"cannot resolve --bind-host {bind_host} ({e.strerror or e})"
            ) from None
        if not is_loopback(a):
            return Address(a, f"--bind-host {bind_host}")
    host, _ = split_host_port(coordinator)
    target = host
    try:
        target = resolve(host)
        return Address(route_to(target), f"the route to the coordinator {host} ({target})")
    except OSError as e:
        raise Unreachable(
            f"no route from this host to the coordinator {host} ({target}: {e.strerror or e})"
        ) from None


def choose(
    client, index: int, count: int, coordinator: str, bind_host: str, timeout_s: float
) -> Address:
    """This learner's address for the collectives (steps 1-4 of the module doc).
    `client`: jax.distributed's client, connected. Raises Unreachable."""
    mine = own_choice(coordinator, bind_host)
    client.key_value_set(f"{_KEY}/route/{index}", mine.address, allow_overwrite=True)
    if not is_loopback(mine.address):
        return mine
    for j in range(count):
        if j == index:
            continue
        theirs = _get(
            client, f"{_KEY}/route/{j}", timeout_s, f"learner {j} did not say its address"
        )
        if not is_loopback(theirs):
            try:
                a = route_to(theirs)
            except OSError:  # no route to it: check_reach says so
                continue
            if not is_loopback(a):
                return Address(a, f"the route to learner {j} ({theirs})")
    return Address(mine.address, "loopback: every learner is on this machine")


def check_reach(client, index: int, count: int, address: str, timeout_s: float) -> None:
    """Every learner connects to every other one's `address` (see the module doc); raises
    Unreachable naming each pair that failed and the address tried."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.create_server((address, 0), family=family, backlog=max(count, 8)) as listener:
        port = listener.getsockname()[1]
        client.key_value_set(f"{_KEY}/addr/{index}", f"{address} {port}", allow_overwrite=True)
        failed = []
        for j in range(count):
            if j == index:
                continue
            a, p = _get(
                client, f"{_KEY}/addr/{j}", timeout_s, f"learner {j} did not say its address"
            ).split()
            try:
                if is_loopback(a) and not is_loopback(address):  # (its host's loopback, not ours)
                    raise OSError(
                        0, "a loopback address: that learner found no route to the others"
                    )
                socket.create_connection(
                    (a, int(p)), timeout=min(PROBE_TIMEOUT_S, timeout_s)
                ).close()
            except OSError as e:
                why = e.strerror or type(e).__name__
                failed.append(
                    f"learner {index} cannot reach learner {j} at {a} (port {p}, the address "
                    f"learner {j}'s collectives use: {why})"
                )
        # NOTE: the listener stays open until every learner has said how its checks went
        client.key_value_set(f"{_KEY}/reach/{index}", "; ".join(failed), allow_overwrite=True)
        for j in range(count):
            if j != index:
                said = _get(
                    client, f"{_KEY}/reach/{j}", timeout_s, f"learner {j} did not finish its checks"
                )
                failed += [said] if said else []
    if failed:
        raise Unreachable("; ".join(failed))


def _get(client, key: str, timeout_s: float, what: str) -> str:
    try:
        return client.blocking_key_value_get(key, int(timeout_s * 1000))
    except Exception as e:  # noqa: BLE001 - JAX raises its runtime error: a deadline, or the service gone
        raise Unreachable(
            f"{what} within {timeout_s:g} s ({str(e).strip().splitlines()[0][:120]})"
        ) from None


def use_for_gloo(address: str) -> bool:
    """Makes JAX's CPU backend, when it starts, build gloo's collectives on `address`.
    Call after jax.distributed.initialize, before anything starts the backend. False
    (nothing done) where the CPU collectives are not gloo's."""
    import jax
    from jax._src import distributed, xla_bridge
    from jax._src.lib import _jax
    from jax.extend.backend import register_backend_factory

    if jax.config.jax_cpu_collectives_implementation != "gloo":
        return False

    def make_cpu_client():
        collectives = _jax.make_gloo_tcp_collectives(
            distributed_client=distributed.global_state.client, hostname=address
        )
        return xla_bridge.make_cpu_client(collectives=collectives)

    register_backend_factory("cpu", make_cpu_client, priority=0, fail_quietly=False)
    return True


__all__ = [
    "Address",
    "Unreachable",
    "check_reach",
    "choose",
    "is_loopback",
    "own_choice",
    "route_to",
    "use_for_gloo",
]
