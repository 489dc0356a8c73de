"""Hosts made of Linux network namespaces (tianjax.launch.netns) for tests that need a
network that is not loopback: each host its own address, /etc/hosts and host name.

`make_cluster(hosts, **options)` makes a started NamespaceCluster, closed in teardown;
`host_procs` starts `python ...` on a cluster's hosts with their output in files. Where
clusters cannot be made (not root, no iproute2), the tests skip with the one line
`netns.available()` gives. `wait_for_lines` waits for a channel process's output.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tianjax.launch import netns

REPO = Path(__file__).resolve().parents[2]


def wait_for_lines(count, n: int, procs, what: str, timeout_s: float = 60) -> None:
    """Waits until `count()` (lines a process wrote) reaches `n`, failing with `what` after
    timeout_s, or at once if one of `procs` ends."""
    deadline = time.monotonic() + timeout_s
    while count() < n:
        assert time.monotonic() < deadline, what
        assert all(p.poll() is None for p in procs), "a channel process ended"
        time.sleep(0.2)


@pytest.fixture
def make_cluster():
    why = netns.available()
    if why is not None:
        pytest.skip(why)
    made: list[netns.NamespaceCluster] = []

    def make(hosts=2, **options) -> netns.NamespaceCluster:
        cluster = netns.NamespaceCluster(hosts, **options)
        made.append(cluster)
        return cluster.start()

    try:
        yield make
    finally:
        for cluster in made:
            cluster.close()


class HostProcs:
    """`python args...` on a cluster's hosts, stdout and stderr to files in `log_dir`. The
    cluster kills whatever is left when it closes."""

    def __init__(self, log_dir: Path):
        self.log_dir = log_dir

    def start(
        self, cluster: netns.NamespaceCluster, host: str, args: list[str], name: str, env: dict
    ) -> subprocess.Popen:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with (
            open(self.log_dir / f"{name}.out", "wb") as out,
            open(self.log_dir / f"{name}.err", "wb") as err,
        ):
            p = cluster.run(
                host, [sys.executable, *args], env=env, cwd=REPO, stdout=out, stderr=err
            )
        p.log_name = name
        return p

    def stdout(self, p: subprocess.Popen) -> str:
        return (self.log_dir / f"{p.log_name}.out").read_text(errors="replace")

    def stderr(self, p: subprocess.Popen) -> str:
        return (self.log_dir / f"{p.log_name}.err").read_text(errors="replace")

    def wait(self, p: subprocess.Popen, timeout: float) -> int:
        try:
            return p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGUSR1)  # tianjax's processes print their stacks
            try:
                p.wait(2)
            except subprocess.TimeoutExpired:
                pass
            raise AssertionError(
                f"{p.log_name} still running after {timeout:.0f} s; stderr:\n"
                + self.stderr(p)[-6000:]
            ) from None


@pytest.fixture
def host_procs(tmp_path):
    return HostProcs(tmp_path / "logs")
