"""Hosts made of Linux network namespaces on one machine, for tests and benchmarks.

A `NamespaceCluster` is a small network inside this machine. A "switch" namespace holds
one bridge; each host is a namespace with one veth (`eth0` inside, its peer a port of the
bridge), its own address on a private subnet, loopback up, its own `/etc/hosts`, and, for
every process started on it, its own host name (a UTS namespace). Nothing is added to the
machine's root namespace: the bridge and both ends of every veth live in the cluster's own
namespaces, so clusters are isolated from the machine and from each other (two test
workers may even use the same subnet).

    with NamespaceCluster(["host0", "host1"], hosts_style="debian") as cluster:
        p = cluster.run("host1", [sys.executable, "-m", "http.server"])
        cluster.call("host0", ["curl", f"http://host1:8000/"])
        cluster.cut("host1"); cluster.heal("host1")   # a partition: its cable pulled, then back
        cluster.cap("host1", "100mbit")               # tc tbf, both directions

Hosts files (`ip netns exec` bind-mounts /etc/netns/<namespace>/hosts over /etc/hosts):
- "own": every host name resolves to its bridge address, on every host;
- "debian": Debian's default file: localhost on 127.0.0.1, the host's own name on
  127.0.1.1, the other hosts' names on their bridge addresses. A program that looks up
  its own host name to find its address gets loopback there.

Nothing outlives a cluster: `close()` (the context manager's exit, also on an exception or
Ctrl-C) kills every process started on its hosts, process groups and anything else left in
its namespaces, deletes the namespaces (their veths and the bridge go with them) and the
/etc/netns entries. A cluster holds a lock file (/run/tianjax-netns/<prefix>.lock, flock)
for its whole life; one starting cleans what any cluster whose lock nobody holds left
behind (its owner was killed), and refuses a prefix another live cluster holds.
"""

from __future__ import annotations

import atexit
import fcntl
import functools
import ipaddress
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Literal

LOCK_DIR = "/run/tianjax-netns"
NETNS_ETC = "/etc/netns"
HOST_IF = "eth0"  # each host's end of its veth, inside its namespace
HostsStyle = Literal["own", "debian"]
_HOST_NAME = re.compile(r"[a-z][a-z0-9-]{0,30}")
_PREFIX = re.compile(r"[a-z][a-z0-9]{0,19}")  # no '-': '<prefix>-' starts only its own names
_counter = itertools.count()
# run as the last step before a host's program: its own host name, in its own UTS namespace
_SET_HOSTNAME = (
    "import os, socket, sys; socket.sethostname(sys.argv[1]); os.execvp(sys.argv[2], sys.argv[2:])"
)


class NetnsError(RuntimeError):
    """A namespace command failed; the message names it and what it printed."""


def _run(*argv: str, check: bool = True, timeout: float = 30) -> str:
    r = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )
    if check and r.returncode:
        raise NetnsError(f"{' '.join(argv)}: {r.stderr.strip() or f'exit code {r.returncode}'}")
    return r.stdout


@functools.cache
def available() -> str | None:
    """None where clusters can be made here (root, `ip netns`, veths, bridges and `unshare`
    work); else one line naming what is missing."""
    if os.geteuid() != 0:
        return "network namespace hosts need root"
    for tool, package in (("ip", "iproute2"), ("tc", "iproute2"), ("unshare", "util-linux")):
        if shutil.which(tool) is None:
            return (
                f"network namespace hosts need `{tool}` (package {package}), which is not installed"
            )
    probe = f"tjprobe{os.getpid()}"
    try:
        _run("ip", "netns", "add", probe)
        try:
            _run("ip", "-n", probe, "link", "add", "br0", "type", "bridge")
            _run("ip", "-n", probe, "link", "add", "v0", "type", "veth", "peer", "name", "v1")
            _run("ip", "netns", "exec", probe, "unshare", "--uts", "--", "true")
        finally:
            _run("ip", "netns", "delete", probe, check=False)
    except (NetnsError, OSError, subprocess.TimeoutExpired) as e:
        return f"network namespace hosts do not work here: {str(e).strip().splitlines()[0]}"
    return None


def hosts_file(host: str, addresses: dict[str, str], style: HostsStyle) -> str:
    """The /etc/hosts of `host` in a cluster whose hosts have `addresses`."""
    if style == "own":
        lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
        return "\n".join(lines + [f"{a}\t{h}" for h, a in addresses.items()]) + "\n"
    if style == "debian":  # as Debian's installer writes it (the host's own name on 127.0.1.1)
        lines = ["127.0.0.1\tlocalhost", f"127.0.1.1\t{host}"]
        lines += [f"{a}\t{h}" for h, a in addresses.items() if h != host]
        lines += [
            "",
            "# The following lines are desirable for IPv6 capable hosts",
            "::1     localhost ip6-localhost ip6-loopback",
            "ff02::1 ip6-allnodes",
            "ff02::2 ip6-allrouters",
        ]
        return "\n".join(lines) + "\n"
    raise ValueError(f"hosts_style must be 'own' or 'debian', got {style!r}")


class NamespaceCluster:
    """Hosts `hosts` (names, or a count: host0, host1, ...) on one bridge; see the module doc.

    `subnet`: the hosts' addresses, from its second address on (.2, .3, ...). `prefix`:
    names the cluster's namespaces `<prefix>-<host>` and `<prefix>-switch` (default: unique
    to this process and cluster)."""

    def __init__(
        self,
        hosts: Sequence[str] | int = 2,
        *,
        hosts_style: HostsStyle = "own",
        subnet: str = "10.213.0.0/24",
        prefix: str | None = None,
    ):
        names = [f"host{i}" for i in range(hosts)] if isinstance(hosts, int) else list(hosts)
        if not names or len(set(names)) != len(names):
            raise ValueError(f"hosts must be distinct names, at least one: {names}")
        for h in names:
            if not _HOST_NAME.fullmatch(h):
                raise ValueError(f"host name {h!r}: lowercase letters, digits and '-', up to 31")
        self.prefix = prefix or f"tj{os.getpid()}n{next(_counter)}"
        if not _PREFIX.fullmatch(self.prefix):
            raise ValueError(f"prefix {self.prefix!r}: lowercase letters and digits, up to 20")
        hosts_file("x", {}, hosts_style)  # checks the style
        self.hosts_style = hosts_style
        network = ipaddress.ip_network(subnet)
        if network.num_addresses < len(names) + 3:
            raise ValueError(f"subnet {subnet} is too small for {len(names)} hosts")
        self.prefixlen = network.prefixlen
        self._addr = {h: str(network[i + 2]) for i, h in enumerate(names)}
        self._port = {h: f"port{i}" for i, h in enumerate(names)}  # its veth's end on the bridge
        self.hosts = tuple(names)
        self.switch = f"{self.prefix}-switch"
        self._procs: list[subprocess.Popen] = []
        self._lock: int | None = None

    # ------------------------------------------------------------------ life
    def __enter__(self) -> NamespaceCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> NamespaceCluster:
        why = available()
        if why is not None:
            raise NetnsError(why)
        self._lock = _take_lock(self.prefix)
        atexit.register(self.close)
        try:
            _sweep_stale()
            _clean_prefix(self.prefix)  # a leftover of an earlier cluster of this prefix
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def _build(self) -> None:
        ip, sw = "ip", self.switch
        _run(ip, "netns", "add", sw)
        _run(ip, "-n", sw, "link", "set", "lo", "up")
        _run(ip, "-n", sw, "link", "add", "br0", "type", "bridge")
        _run(ip, "-n", sw, "link", "set", "br0", "up")
        for h in self.hosts:
            ns, port = self.netns(h), self._port[h]
            _write_hosts(ns, hosts_file(h, self._addr, self.hosts_style))
            _run(ip, "netns", "add", ns)
            # both ends are made inside the cluster's namespaces: none is ever in the root one
            _run(
                ip,
                "-n",
                sw,
                "link",
                "add",
                port,
                "type",
                "veth",
                "peer",
                "name",
                HOST_IF,
                "netns",
                ns,
            )
            _run(ip, "-n", sw, "link", "set", port, "master", "br0")
            _run(ip, "-n", sw, "link", "set", port, "up")
            _run(ip, "-n", ns, "addr", "add", f"{self._addr[h]}/{self.prefixlen}", "dev", HOST_IF)
            _run(ip, "-n", ns, "link", "set", HOST_IF, "up")
            _run(ip, "-n", ns, "link", "set", "lo", "up")

    def close(self) -> None:
        """Kills every process on the hosts and removes all the cluster made. Idempotent."""
        if self._lock is None:
            return
        atexit.unregister(self.close)
        for p in self._procs:  # the process groups it started (each its own session)
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        _clean_prefix(self.prefix)  # and whatever else is left in its namespaces
        for p in self._procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self._procs.clear()
        _release_lock(self.prefix, self._lock)
        self._lock = None

    # ------------------------------------------------------------------ hosts
    def netns(self, host: str) -> str:
        """The name of `host`'s network namespace."""
        self._check(host)
        return f"{self.prefix}-{host}"

    def addr(self, host: str) -> str:
        """`host`'s address on the bridge."""
        self._check(host)
        return self._addr[host]

    def run(
        self,
        host: str,
        argv: Sequence[str],
        *,
        env: dict | None = None,
        cwd=None,
        stdin=subprocess.DEVNULL,
        stdout=None,
        stderr=None,
    ) -> subprocess.Popen:
        """Starts `argv` on `host`: in its network namespace, with its /etc/hosts and its
        host name, in a session (process group) of its own. The Popen's pid is the
        program's own (each step execs the next)."""
        cmd = [
            _tool("ip"),
            "netns",
            "exec",
            self.netns(host),
            _tool("unshare"),
            "--uts",
            "--",
            sys.executable,
            "-I",
            "-S",
            "-c",
            _SET_HOSTNAME,
            host,
            *argv,
        ]
        p = subprocess.Popen(
            cmd, env=env, cwd=cwd, stdin=stdin, stdout=stdout, stderr=stderr, start_new_session=True
        )
        self._procs = [q for q in self._procs if q.poll() is None] + [p]
        return p

    def call(
        self,
        host: str,
        argv: Sequence[str],
        *,
        env: dict | None = None,
        timeout: float = 60,
        check: bool = True,
    ) -> subprocess.CompletedProcess:
        """Runs `argv` on `host` to its end; returns its exit code and output (text)."""
        p = self.run(host, argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
            raise NetnsError(
                f"on {host}: {' '.join(argv)} ran past {timeout:g} s; stderr: "
                f"{err.decode(errors='replace')[-2000:]}"
            ) from None
        done = subprocess.CompletedProcess(
            list(argv), p.returncode, out.decode(errors="replace"), err.decode(errors="replace")
        )
        if check and p.returncode:
            raise NetnsError(
                f"on {host}: {' '.join(argv)} exited {p.returncode}: {done.stderr[-2000:]}"
            )
        return done

    def pids(self, host: str) -> list[int]:
        """Every process running on `host` (in its network namespace)."""
        return _ns_pids(self.netns(host))

    def kill(self, host: str, sig: int = signal.SIGKILL) -> None:
        """Sends `sig` to every process on `host` (SIGKILL: the host crashed)."""
        for pid in self.pids(host):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    # ------------------------------------------------------------------ the network
    def cut(self, host: str) -> None:
        """Cuts `host` off (its cable pulled: the bridge's end of its veth goes down). Its
        packets vanish and nothing answers it; its address and routes stay."""
        _run("ip", "-n", self.switch, "link", "set", self._port[self._check(host)], "down")

    def heal(self, host: str) -> None:
        """Undoes cut(): `host` is on the bridge again."""
        _run("ip", "-n", self.switch, "link", "set", self._port[self._check(host)], "up")

    def cap(
        self, host: str, rate: str = "100mbit", *, burst: str | None = None, latency: str = "50ms"
    ) -> None:
        """Limits `host`'s link to `rate` (tc's units: 100mbit, 10mbps, ...) both ways: a
        token bucket (tbf) on the egress of both ends of its veth. `burst` defaults to
        10 ms of `rate`, at least 32 KiB."""
        burst = burst or str(max(int(_rate_bytes(rate) / 100), 32 * 1024))
        tbf = ["root", "tbf", "rate", rate, "burst", burst, "latency", latency]
        h = self._check(host)
        _run("tc", "-n", self.netns(h), "qdisc", "replace", "dev", HOST_IF, *tbf)
        _run("tc", "-n", self.switch, "qdisc", "replace", "dev", self._port[h], *tbf)

    def uncap(self, host: str) -> None:
        """Removes cap()'s limits (the links' default queues come back)."""
        h = self._check(host)
        _run("tc", "-n", self.netns(h), "qdisc", "del", "dev", HOST_IF, "root", check=False)
        _run("tc", "-n", self.switch, "qdisc", "del", "dev", self._port[h], "root", check=False)

    def qdisc(self, host: str) -> tuple[str, str]:
        """`tc qdisc show` of `host`'s link: (out of the host, into the host)."""
        h = self._check(host)
        return (
            _run("tc", "-n", self.netns(h), "qdisc", "show", "dev", HOST_IF).strip(),
            _run("tc", "-n", self.switch, "qdisc", "show", "dev", self._port[h]).strip(),
        )

    def _check(self, host: str) -> str:
        if host not in self._addr:
            raise KeyError(f"no host {host!r} in this cluster (hosts: {', '.join(self.hosts)})")
        return host

    def __repr__(self) -> str:
        hosts = ", ".join(f"{h}={a}" for h, a in self._addr.items())
        return f"NamespaceCluster({self.prefix}: {hosts}; hosts_style={self.hosts_style})"


# ---------------------------------------------------------------------------- plumbing
def _rate_bytes(rate: str) -> float:
    """Bytes per second of a tc rate: a number with bit/kbit/mbit/gbit (or a bare number:
    bits) or bps/kbps/mbps/gbps (bytes)."""
    m = re.fullmatch(r"([0-9.]+)\s*([kmgt]?)(bit|bps|)", rate.strip().lower())
    if not m:
        raise ValueError(
            f"rate {rate!r}: a number with bit, kbit, mbit, gbit, bps, kbps, mbps or gbps"
        )
    scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m.group(2)]
    return float(m.group(1)) * scale / (1 if m.group(3) == "bps" else 8)


def _tool(name: str) -> str:
    """A tool's full path: a host's program may run with a PATH that lacks sbin."""
    return shutil.which(name) or name


def _ns_pids(ns: str) -> list[int]:
    out = _run("ip", "netns", "pids", ns, check=False)
    return [int(x) for x in out.split() if x.isdigit()]


def _write_hosts(ns: str, text: str) -> None:
    d = os.path.join(NETNS_ETC, ns)
    for _ in range(3):  # another cluster may remove an empty /etc/netns meanwhile
        try:
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, "hosts"), "w") as f:
                f.write(text)
            return
        except FileNotFoundError:
            continue
    raise NetnsError(f"cannot write {d}/hosts")


def _clean_prefix(prefix: str) -> None:
    """Kills every process in the namespaces named `<prefix>-*` and deletes them, and their
    /etc/netns entries."""
    mine = [
        line.split()[0]
        for line in _run("ip", "netns", "list", check=False).splitlines()
        if line.split() and line.split()[0].startswith(f"{prefix}-")
    ]
    deadline = time.monotonic() + 10
    while (left := [pid for ns in mine for pid in _ns_pids(ns)]) and time.monotonic() < deadline:
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    for ns in mine:
        _run("ip", "netns", "delete", ns, check=False)
    if os.path.isdir(NETNS_ETC):
        for name in os.listdir(NETNS_ETC):
            if name.startswith(f"{prefix}-"):
                shutil.rmtree(os.path.join(NETNS_ETC, name), ignore_errors=True)
        try:
            os.rmdir(NETNS_ETC)  # only if empty: leave the machine as it was found
        except OSError:
            pass


def _take_lock(prefix: str) -> int:
    path = os.path.join(LOCK_DIR, f"{prefix}.lock")
    while True:
        try:
            os.makedirs(LOCK_DIR, mode=0o700, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except FileNotFoundError:  # another cluster removed the empty directory meanwhile
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(fd, 32, 0).decode(errors="replace").strip()
            os.close(fd)
            raise NetnsError(
                f"cluster prefix {prefix!r} is in use by a running process (pid {owner or '?'})"
            ) from None
        try:  # a sweeper may have removed the file between our open and flock
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                os.ftruncate(fd, 0)
                os.pwrite(fd, str(os.getpid()).encode(), 0)
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


def _release_lock(prefix: str, fd: int) -> None:
    try:
        os.unlink(os.path.join(LOCK_DIR, f"{prefix}.lock"))
    except FileNotFoundError:
        pass
    os.close(fd)
    try:
        os.rmdir(LOCK_DIR)  # only if empty
    except OSError:
        pass


def _sweep_stale() -> None:
    """Cleans up after every cluster whose owner is gone (its lock file held by nobody)."""
    if not os.path.isdir(LOCK_DIR):
        return
    for name in os.listdir(LOCK_DIR):
        prefix = name.removesuffix(".lock")
        if not name.endswith(".lock") or not _PREFIX.fullmatch(prefix):
            continue
        try:
            fd = _take_lock(prefix)
        except (NetnsError, OSError):
            continue  # alive (or just taken by a starting cluster)
        try:
            _clean_prefix(prefix)
        finally:
            _release_lock(prefix, fd)


__all__ = ["NamespaceCluster", "NetnsError", "available", "hosts_file"]
