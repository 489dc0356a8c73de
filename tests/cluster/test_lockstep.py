"""The lock-step multi-host mode on hosts that are not loopback: docs/multihost.md's "On
separate hosts" commands, as written (only the run directory is this test's own), on 4
namespace hosts with Debian's default /etc/hosts, where each host's own name resolves to
127.0.1.1: learner 0 on host0, learner 1 on host1, the actors on host2 and host3, curve
security (the default of `tianjax launch`), real processes. Both learners reach the target
with their collectives on their bridge addresses. Actors whose learner never comes, or
ends before it says anything, stop after runtime.heartbeat_timeout_s with one line, not
after runtime.connect_timeout_s.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import pytest

from ..integration.conftest import child_env, read_summary, wait_for
from .conftest import REPO

LEARNER_HOSTS = {"on host0": "host0", "on host1": "host1"}
ACTOR_HOSTS = ("host2", "host3")


def separate_hosts_commands(run_dir: Path, *overrides: str) -> list[tuple[str, list[str]]]:
    """docs/multihost.md's separate-hosts commands as (the host each runs on, argv for
    `python`): `tianjax` is `-m tianjax.cli`, learners run where their comment says, the
    actors ("anywhere") on host2 and host3; `overrides` go with the config's."""
    text = (REPO / "docs" / "multihost.md").read_text()
    block = text[text.index("On separate hosts") :]
    block = block[block.index("```bash") + len("```bash") :]
    block = block[: block.index("```")].replace("\\\n", " ")
    out, actors = [], iter(ACTOR_HOSTS)
    for line in block.splitlines():
        command, _, where = line.partition("#")
        command = command.strip()
        if not command.startswith("tianjax launch"):
            continue
        argv = shlex.split(command.replace("run_dir=/shared/mh", f"run_dir={run_dir}"))[1:]
        at = argv.index("mode=sync")
        argv[at:at] = overrides
        host = LEARNER_HOSTS.get(where.strip()) or (where.strip() == "anywhere" and next(actors))
        assert host, f"the block says where each command runs: {line!r}"
        out.append((host, ["-m", "tianjax.cli", *argv]))
    roles = [argv[argv.index("--role") + 1] for _, argv in out]
    assert roles == ["learner", "learner", "actor", "actor"], out
    assert [h for h, _ in out] == ["host0", "host1", "host2", "host3"], out
    return out


@pytest.mark.slow
def test_the_separate_hosts_block_reaches_the_target_with_debians_hosts_file(
    make_cluster, host_procs, tmp_path
):
    cluster = make_cluster(["host0", "host1", "host2", "host3"], hosts_style="debian")
    env = child_env(TIANJAX_RUN_KEY=os.urandom(32).hex())
    cmds = separate_hosts_commands(tmp_path / "run")
    names = ["learner-0", "learner-1", "actor-0", "actor-1"]
    procs = [
        host_procs.start(cluster, host, argv, name, env) for (host, argv), name in zip(cmds, names)
    ]
    learners, actors = procs[:2], procs[2:]
    for p in learners:
        assert host_procs.wait(p, 420) == 0, host_procs.stderr(p)[-4000:]
    for p in actors:
        assert host_procs.wait(p, 60) == 0, host_procs.stderr(p)[-4000:]
    for i, p in enumerate(learners):
        out = host_procs.stdout(p)
        # gloo would have taken 127.0.1.1, what each host's own name resolves to there
        assert f"collectives on {cluster.addr(f'host{i}')} " in out, out[-3000:]
        assert "(curve)" in out
        s = read_summary(tmp_path / "run" / f"learner-{i}")
        assert s["process_index"] == i and s["process_count"] == 2
        assert s["learner_devices"] == 2  # one global mesh over both hosts
        assert s["updates"] == 75_000 // (16 * 32)
        assert s["staleness_max"] == 0  # sync
        assert s["final_return"] >= 475, s


def _error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("tianjax: error:")]


@pytest.mark.slow
def test_actors_whose_learner_never_comes_or_ends_silent_stop_after_the_heartbeat_timeout(
    make_cluster, host_procs, tmp_path
):
    """Learner 1 never starts; learner 0 starts and waits in jax.distributed for it, holding
    its ports but saying nothing to its actor. Actor 1 stops once heartbeat_timeout_s has
    passed without a learner; actor 0 waits on while its learner is there, and stops the
    same way once learner 0's host goes down."""
    timeout = 8
    cluster = make_cluster(["host0", "host1", "host2", "host3"], hosts_style="debian")
    env = child_env(TIANJAX_RUN_KEY=os.urandom(32).hex())
    cmds = separate_hosts_commands(tmp_path / "run", f"runtime.heartbeat_timeout_s={timeout}")
    learner0 = host_procs.start(cluster, *cmds[0], "learner-0", env)
    knock = "import socket, sys; socket.create_connection(('host0', 5557), timeout=2).close()"
    wait_for(
        lambda: (
            cluster.call("host2", [sys.executable, "-c", knock], check=False).returncode == 0
            or learner0.poll() is not None
        ),
        120,
        interval=0.5,
        what="learner 0 to hold its ports",
    )
    actors = [
        host_procs.start(cluster, host, argv, f"actor-{k}", env)
        for k, (host, argv) in enumerate(cmds[2:])
    ]

    # the default connect_timeout_s (600 s) would keep it far longer than this wait
    assert host_procs.wait(actors[1], timeout + 120) == 1
    err = host_procs.stderr(actors[1])
    assert f"actor 1 stopping: no learner at tcp://host1:5560 for {timeout} s" in err, err[-3000:]
    lines = _error_lines(err)
    assert len(lines) == 1 and "its learner (tcp://host1:5560)" in lines[0], err[-3000:]
    assert "restarted" not in err

    # actor 0's learner is there, starting: it has waited as long, and waits on
    wait_for(
        lambda: "tianjax: actor 0 ->" in host_procs.stdout(actors[0]),
        60,
        what="actor 0's start line",
    )
    assert actors[0].poll() is None and learner0.poll() is None, host_procs.stderr(actors[0])[
        -3000:
    ]
    cluster.kill("host0")  # the host goes down with its learner
    assert host_procs.wait(actors[0], timeout + 60) == 1
    err = host_procs.stderr(actors[0])
    assert f"actor 0 stopping: no learner at tcp://host0:5557 for {timeout} s" in err, err[-3000:]
    assert len(_error_lines(err)) == 1, err[-3000:]


@pytest.mark.slow
def test_a_learner_that_cannot_reach_another_says_which_address_it_tried(
    make_cluster, host_procs, tmp_path
):
    """Learner 1 binds (--bind-host) an address of another subnet, which host0 has no route
    to: both learners end before any collective, each with one line naming the address
    learner 0 tried."""
    cluster = make_cluster(["host0", "host1"], hosts_style="debian")
    cluster.call("host1", ["ip", "addr", "add", "10.214.0.3/24", "dev", "eth0"])
    env = child_env(TIANJAX_RUN_KEY=os.urandom(32).hex())
    cmds = separate_hosts_commands(tmp_path / "run")[:2]
    cmds[1][1][cmds[1][1].index("--bind-host") + 1] = "10.214.0.3"
    learners = [
        host_procs.start(cluster, host, argv, f"learner-{i}", env)
        for i, (host, argv) in enumerate(cmds)
    ]
    for i, p in enumerate(learners):
        assert host_procs.wait(p, 180) == 1
        err = host_procs.stderr(p)
        lines = _error_lines(err)
        assert len(lines) == 1 and lines[0].startswith(f"tianjax: error: learner {i}/2: "), err[
            -3000:
        ]
        assert "learner 0 cannot reach learner 1 at 10.214.0.3 (port " in lines[0], lines[0]
        assert "Traceback" not in err
