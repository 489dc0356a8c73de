"""The namespace cluster itself (tianjax.launch.netns), with real sockets between real
processes: hosts reach each other by name and by address; a host's name resolves as its
hosts style says; a cut host is unreachable until healed; a cap installs tbf at the rate
asked; and nothing outlives a cluster: no namespace, no /etc/netns entry, no process, also
after its owner was killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import psutil
import pytest

from tianjax.launch import netns

from ..integration.conftest import wait_for
from .conftest import REPO

PORT = 7001
# on the host it runs on: answers each connection with "<its host name> <the peer's address>",
# or with the byte count of what it read when the client says "count"
SERVER = textwrap.dedent("""
    import socket, sys
    s = socket.create_server(("0.0.0.0", int(sys.argv[1])))
    while True:
        c, peer = s.accept()
        with c:
            first = c.recv(5)
            if first == b"count":
                n = 0
                while chunk := c.recv(1 << 16):
                    n += len(chunk)
                c.sendall(str(n).encode())
            else:
                c.sendall(f"{socket.gethostname()} {peer[0]}".encode())
""")
# connects to argv[1]:argv[2]; prints "<its host name> <the reply>" or "error <what>";
# with argv[3] (MB), sends that much first and prints the seconds it took too
CLIENT = textwrap.dedent("""
    import socket, sys, time
    try:
        c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3)
        t = time.perf_counter()
        if len(sys.argv) > 3:
            c.sendall(b"count" + bytes(int(float(sys.argv[3]) * 2**20)))
            c.shutdown(socket.SHUT_WR)
        else:
            c.sendall(b"hello")
        reply = c.recv(100).decode()
        print(socket.gethostname(), reply, f"{time.perf_counter() - t:.3f}")
    except OSError as e:
        print("error", type(e).__name__)
""")


def _serve(cluster, host):
    return cluster.run(host, [sys.executable, "-c", SERVER, str(PORT)])


def _connect(cluster, host, target, mb=None) -> list[str]:
    argv = [sys.executable, "-c", CLIENT, target, str(PORT), *([str(mb)] if mb else [])]
    return cluster.call(host, argv, timeout=30).stdout.split()


def _reachable(cluster, host, target) -> list[str]:
    return wait_for(
        lambda: (out := _connect(cluster, host, target))[0] != "error" and out,
        30,
        interval=0.2,
        what=f"{target} to answer {host}",
    )


def test_hosts_reach_each_other_by_name_and_by_address(make_cluster):
    cluster = make_cluster(3, hosts_style="own")
    _serve(cluster, "host1")
    _reachable(cluster, "host0", "host1")
    for target in ("host1", cluster.addr("host1")):
        # the server saw host0's own address: the connection crossed the bridge
        assert _connect(cluster, "host0", target)[:3] == ["host0", "host1", cluster.addr("host0")]
    assert _connect(cluster, "host2", "host1")[:3] == ["host2", "host1", cluster.addr("host2")]
    assert len({cluster.addr(h) for h in cluster.hosts}) == 3


@pytest.mark.parametrize("style", ["own", "debian"])
def test_each_host_has_its_own_name_and_hosts_file(make_cluster, style):
    cluster = make_cluster(["alpha", "beta"], hosts_style=style)
    lookup = (
        "import socket; name = socket.gethostname(); "
        "print(name, *(socket.gethostbyname(h) for h in (name, 'beta', 'localhost')))"
    )
    out = cluster.call("alpha", [sys.executable, "-c", lookup]).stdout.split()
    own = "127.0.1.1" if style == "debian" else cluster.addr("alpha")  # Debian's default file
    assert out == ["alpha", own, cluster.addr("beta"), "127.0.0.1"]
    with open(os.path.join(netns.NETNS_ETC, cluster.netns("alpha"), "hosts")) as f:
        assert f.read() == netns.hosts_file(
            "alpha", {h: cluster.addr(h) for h in cluster.hosts}, style
        )


def test_a_cut_host_is_unreachable_until_healed(make_cluster):
    cluster = make_cluster(2)
    _serve(cluster, "host1")
    _reachable(cluster, "host0", "host1")
    cluster.cut("host1")
    assert (
        _connect(cluster, "host0", "host1")[0] == "error"
    )  # (a timeout, or no host at its address)
    assert _connect(cluster, "host1", "host0")[0] == "error"
    cluster.heal("host1")
    assert _reachable(cluster, "host0", "host1")[:2] == ["host0", "host1"]


def test_a_cap_installs_tbf_at_the_rate_asked_both_ways(make_cluster):
    cluster = make_cluster(2)
    _serve(cluster, "host1")
    _reachable(cluster, "host0", "host1")
    mb = 3
    free = _connect(cluster, "host0", "host1", mb)
    cluster.cap("host1", "40mbit")
    for side in cluster.qdisc("host1"):  # out of host1, and into it
        assert side.startswith("qdisc tbf ") and " rate 40Mbit " in side, side
    capped = _connect(cluster, "host0", "host1", mb)
    for out in (free, capped):  # every byte arrived
        assert out[:2] == ["host0", str(mb * 2**20)], out
    # a figure, not a check: the machine is shared
    print(
        f"\n{mb} MB from host0 to host1: {float(free[2]):.3f} s uncapped, {float(capped[2]):.3f} s "
        f"at 40mbit ({mb * 8 * 2**20 / 40e6:.3f} s at the line rate)"
    )
    cluster.uncap("host1")
    assert not any("tbf" in side for side in cluster.qdisc("host1"))


def _gone(pids) -> bool:
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            pass
    return True


def _leftovers(prefix: str) -> list[str]:
    names = [
        line.split()[0]
        for line in subprocess.run(
            ["ip", "netns", "list"], capture_output=True, text=True
        ).stdout.splitlines()
        if line.strip()
    ]
    etc = os.listdir(netns.NETNS_ETC) if os.path.isdir(netns.NETNS_ETC) else []
    return [n for n in names + etc if n.startswith(f"{prefix}-")]


def test_closing_leaves_no_namespace_no_hosts_file_and_no_process(make_cluster):
    cluster = make_cluster(2)
    # a process, and a grandchild in a session of its own (out of the first one's group)
    cluster.run("host0", ["sleep", "300"])
    cluster.run(
        "host1",
        [
            sys.executable,
            "-c",
            "import subprocess; subprocess.Popen(['sleep', '300'], start_new_session=True); "
            "import time; time.sleep(300)",
        ],
    )
    pids = wait_for(
        lambda: (p := cluster.pids("host0") + cluster.pids("host1")) and len(p) == 3 and p,
        30,
        what="3 processes on the hosts",
    )
    assert _leftovers(cluster.prefix)
    cluster.close()
    assert _leftovers(cluster.prefix) == []
    assert _gone(pids), pids
    cluster.close()  # idempotent


def test_a_cluster_closes_on_an_exception_too():
    if (why := netns.available()) is not None:
        pytest.skip(why)
    with pytest.raises(RuntimeError, match="a test failed"):
        with netns.NamespaceCluster(["a"]) as cluster:
            p = cluster.run("a", ["sleep", "300"])
            raise RuntimeError("a test failed")
    assert _leftovers(cluster.prefix) == [] and p.poll() is not None


# the owner of a cluster, killed with -9 once its host runs a process
OWNER = textwrap.dedent("""
    import sys, time
    from tianjax.launch.netns import NamespaceCluster
    c = NamespaceCluster(["a", "b"], prefix=sys.argv[1]).start()
    c.run("a", ["sleep", "300"])
    print("ready", flush=True)
    time.sleep(300)
""")


def test_a_killed_owners_leftovers_are_cleaned_and_a_live_prefix_is_refused():
    if (why := netns.available()) is not None:
        pytest.skip(why)
    prefix = f"tjt{os.getpid()}"
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, prefix],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        start_new_session=True,
    )
    try:
        assert owner.stdout.readline().strip() == b"ready"
        with pytest.raises(netns.NetnsError, match="in use by a running process"):
            netns.NamespaceCluster(["a"], prefix=prefix).start()
        left = wait_for(lambda: netns._ns_pids(f"{prefix}-a"), 30, what="the owner's process")
    finally:
        os.killpg(owner.pid, signal.SIGKILL)
        owner.wait(10)
    assert _leftovers(prefix) and not _gone(left)  # what a killed run leaves behind
    with netns.NamespaceCluster(["a"], prefix=prefix) as cluster:
        assert _gone(left)
        assert set(_leftovers(prefix)) == {
            f"{prefix}-a",
            f"{prefix}-switch",
        }  # its own, made afresh
        assert cluster.pids("a") == []
    assert _leftovers(prefix) == []
