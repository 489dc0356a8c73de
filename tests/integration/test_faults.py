"""Faults survived, with real processes: killed and stopped actors are replaced while the
learner goes on; a killed learner, or one that raises at a checkpoint, comes back from its
checkpoint and the same actors follow it; nothing is left behind.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import subprocess
import time

import psutil
import pytest

from tianjax.checkpoint import store as ckpt

from .conftest import (
    ASYNC_CFG,
    actor_processes,
    alive,
    read_summary,
    records,
    updates_logged,
    wait_exited,
    wait_for,
)


def _launch(procs, run_dir, *overrides):
    return procs.start(
        [
            "-m",
            "tianjax.cli",
            "train",
            ASYNC_CFG,
            f"run_dir={run_dir}",
            *overrides,
            "--no-progress",
        ],
        name="launcher",
    )


def _registered(run_dir) -> int:
    recs = records(run_dir)
    return recs[-1].get("actors_seen", 0) if recs else 0


def _running(procs, launcher, run_dir, updates: int) -> list[psutil.Process]:
    """Waits for the launcher's 2 actors, both registered with the learner (the learner
    trains on the first while the second may still be compiling: a process that never
    registered is not one the learner can find silent), and `updates` logged updates;
    returns the actors."""
    actors = wait_for(
        lambda: len(actor_processes(launcher.pid)) == 2 and actor_processes(launcher.pid),
        120,
        what="2 actors",
    )
    wait_for(
        lambda: (
            updates_logged(run_dir) >= updates
            and _registered(run_dir) == 2
            or launcher.poll() is not None
        ),
        120,
        what=f"{updates} updates from 2 registered actors",
    )
    assert launcher.poll() is None, procs.stderr(launcher)
    return actors


def _actor_id(p: psutil.Process) -> int:
    cmd = p.cmdline()
    return int(cmd[cmd.index("--actor-id") + 1])


@pytest.mark.slow
def test_killed_actor_is_restarted_and_the_run_reaches_its_target(tmp_path, procs):
    run_dir = tmp_path / "run"
    launcher = _launch(procs, run_dir)  # the async config: 2 actors, 150k env steps
    actors = _running(procs, launcher, run_dir, 20)
    victim = actors[0]
    victim_id = _actor_id(victim)
    killed_at = time.time()
    victim.send_signal(signal.SIGKILL)

    assert procs.wait(launcher, 180) == 0, procs.stderr(launcher)
    s = read_summary(run_dir)
    assert s["actor_restarts"] == 1 and s["actors_lost"] == 0
    # every record says when it was written on the shared clock, and when each actor id's
    # newest trajectory was admitted by then: the replacement's came after the kill
    recs = records(run_dir)
    times = [r["unix_time"] for r in recs]
    assert times == sorted(times) and killed_at - 300 < times[0] and times[-1] < time.time()
    admitted = [r.get("actor_admitted_at", {}) for r in recs]
    assert all(t <= r["unix_time"] for r, a in zip(recs, admitted) for t in a.values())
    assert sorted(admitted[-1]) == ["0", "1"], admitted[-1]
    if times[-1] > killed_at + 15:  # (a run that reached its target sooner may end before
        # the replacement, a new process on loaded cores, sent anything)
        assert max(a.get(str(victim_id), 0.0) for a in admitted) > killed_at, (killed_at, admitted)
    # an async run: it reaches the target within its budget (see test_local_runtime)
    assert s["convergence_env_steps"] is not None, {k: s[k] for k in ("final_return", "updates")}
    err = procs.stderr(launcher)
    assert "Traceback" not in err, err
    assert f"actor {victim_id} (killed by SIGKILL) restarted" in err, err
    assert not alive(actors)


def _connections(p: psutil.Process) -> int:
    """The process's TCP connections (a standby opens none until its turn)."""
    try:
        return len(p.net_connections(kind="tcp"))
    except psutil.NoSuchProcess:
        return -1


def test_killed_actor_is_replaced_by_its_warm_standby_which_connects_only_then(tmp_path, procs):
    run_dir = tmp_path / "run"
    launcher = _launch(
        procs, run_dir, "runtime.standby_actors=true", "total_env_steps=5000000", "log_every=1"
    )
    actors = wait_for(
        lambda: len(actor_processes(launcher.pid)) == 4 and actor_processes(launcher.pid),
        120,
        what="2 actors and their 2 standbys",
    )
    standby = {_actor_id(p): p for p in actors if "--standby" in p.cmdline()}
    working = [p for p in actors if "--standby" not in p.cmdline()]
    assert sorted(standby) == [0, 1] and len(working) == 2
    wait_for(
        lambda: (
            updates_logged(run_dir) >= 5
            and _registered(run_dir) == 2
            or launcher.poll() is not None
        ),
        120,
        what="5 updates from 2 registered actors",
    )
    assert launcher.poll() is None, procs.stderr(launcher)
    victim = working[0]
    victim_id = _actor_id(victim)
    spare = standby[victim_id]
    # built and waiting, it holds no connection to the learner; its actor holds three
    assert _connections(spare) == 0 and _connections(victim) >= 3
    killed_at = time.time()
    victim.send_signal(signal.SIGKILL)
    # the standby takes the id's place: it connects, and the learner admits its trajectories
    wait_for(
        lambda: (
            any(
                r.get("actor_admitted_at", {}).get(str(victim_id), 0.0) > killed_at
                for r in records(run_dir)
            )
            or launcher.poll() is not None
        ),
        120,
        what="a trajectory of the replacement admitted",
    )
    assert launcher.poll() is None, procs.stderr(launcher)
    assert spare.is_running() and _connections(spare) >= 3
    # and a new standby waits behind it, unconnected
    behind = wait_for(
        lambda: [
            p
            for p in actor_processes(launcher.pid)
            if "--standby" in p.cmdline() and _actor_id(p) == victim_id and p.pid != spare.pid
        ],
        120,
        what="a new standby",
    )
    assert _connections(behind[0]) == 0
    launcher.send_signal(signal.SIGTERM)
    assert procs.wait(launcher, 120) == 130, procs.stderr(launcher)
    err = procs.stderr(launcher)
    assert "Traceback" not in err, err
    said = f"actor {victim_id} (killed by SIGKILL) restarted (its warm standby took over)"
    assert said in err, err
    s = read_summary(run_dir)
    assert s["actor_restarts"] == 1 and s["actor_restarts_from_standby"] == 1, s
    assert s["actors_lost"] == 0
    # the standbys were dismissed with the actors: nothing is left behind
    wait_exited([*actors, *behind], 10)


def test_stopped_actor_times_out_and_is_replaced_while_the_learner_goes_on(tmp_path, procs):
    run_dir = tmp_path / "run"
    timeout = 4.0
    # a budget no machine spends before the test is done: the run must still be training
    # when the timeout fires and for a while after, however fast the surviving actor is
    launcher = _launch(
        procs,
        run_dir,
        "total_env_steps=5000000",
        "log_every=2",
        f"runtime.heartbeat_timeout_s={timeout}",
    )
    actors = _running(procs, launcher, run_dir, 10)
    victim = actors[1]
    victim_id = _actor_id(victim)
    victim.send_signal(signal.SIGSTOP)  # alive, holding its sockets, saying nothing
    stopped_at = len(records(run_dir))

    said = f"actor {victim_id} (silent for more than {timeout:g} s) restarted"
    try:
        wait_for(
            lambda: said in procs.stderr(launcher) or launcher.poll() is not None,
            120,
            what="the silent actor's restart",
        )
    except TimeoutError as e:
        raise AssertionError(
            f"{e}; last record: {records(run_dir)[-1:]}; stderr: {procs.stderr(launcher)}"
        )
    assert launcher.poll() is None and said in procs.stderr(launcher), procs.stderr(launcher)
    restarted_at = len(records(run_dir))
    wait_for(
        lambda: len(records(run_dir)) >= restarted_at + 10 or launcher.poll() is not None,
        120,
        what="10 records after the restart",
    )
    seen = records(run_dir)
    launcher.send_signal(signal.SIGTERM)
    assert procs.wait(launcher, 120) == 130, procs.stderr(launcher)  # the CLI's stop by signal
    assert "Traceback" not in procs.stderr(launcher), procs.stderr(launcher)
    assert not alive([victim])  # killed, not left stopped
    s = read_summary(run_dir)
    # (under load a replacement can itself stay silent past this short timeout while it
    # compiles, and be replaced again: at least one restart, and never a lost actor)
    assert s["actor_restarts"] >= 1 and s["actors_lost"] == 0
    # the learner never stalled: from the stop on, records kept coming (every 2 updates)
    # at intervals well under the heartbeat timeout the replacement took
    after = seen[stopped_at - 1 :]
    gaps = [b["wall_time_s"] - a["wall_time_s"] for a, b in zip(after, after[1:])]
    assert len(after) > 10 and max(gaps) < timeout, gaps


def _learners(launcher, standby: bool) -> list:
    """The launcher's learner processes: the working one, or its warm standbys."""
    return [
        p
        for p in actor_processes(launcher.pid, role="learner")
        if ("--standby" in p.cmdline()) == standby
    ]


@pytest.mark.slow
@pytest.mark.parametrize("standby", [False, True], ids=["cold", "standby"])
def test_killed_learner_resumes_from_its_checkpoint_and_actors_follow(tmp_path, procs, standby):
    """A killed learner's replacement, a cold process or (runtime.standby_learner) the warm
    one waiting beside it, resumes from the newest checkpoint and the same actors follow."""
    run_dir = tmp_path / "run"
    launcher = _launch(
        procs,
        run_dir,
        "runtime.restart_learner=true",
        f"runtime.standby_learner={str(standby).lower()}",
        "checkpoint.every=20",
        "total_env_steps=200000",
    )
    actors = wait_for(
        lambda: len(actor_processes(launcher.pid)) == 2 and actor_processes(launcher.pid),
        120,
        what="2 actors",
    )
    ids = {a.pid: _actor_id(a) for a in actors}
    learner = wait_for(lambda: _learners(launcher, False), 60, what="the learner process")[0]
    if standby:
        spare = wait_for(lambda: _learners(launcher, True), 60, what="the standby learner")[0]
    wait_for(
        lambda: (
            ckpt.has_checkpoint(str(run_dir))
            and ckpt.read_meta(str(run_dir))["updates"] >= 40
            or launcher.poll() is not None
        ),
        120,
        what="a checkpoint at 40 updates",
    )
    assert launcher.poll() is None, procs.stderr(launcher)
    learner.send_signal(signal.SIGKILL)
    # what the replacement must start from (a checkpoint may still be written after this
    # read and before the kill lands; the replacement then starts from that newer one)
    last_step = ckpt.read_meta(str(run_dir))["updates"]
    logged_before = updates_logged(run_dir)
    # the replacement learner trains on what the same two actor processes send
    if standby:
        # the standby took over (its process goes on, its command line unchanged), and
        # another waits behind it
        spares = wait_for(
            lambda: [p for p in _learners(launcher, True) if p.pid != spare.pid],
            60,
            what="a new standby learner",
        )
        assert alive([spare]) == [spare] and not _learners(launcher, False)
    else:
        wait_for(
            lambda: _learners(launcher, False) or launcher.poll() is not None,
            60,
            what="a new learner process",
        )
    wait_for(
        lambda: updates_logged(run_dir) >= logged_before + 20 or launcher.poll() is not None,
        120,
        what="20 updates by the new learner",
    )
    assert alive(actors) == actors, "an actor process did not survive the learner's restart"

    assert procs.wait(launcher, 240) == 0, procs.stderr(launcher)
    err = procs.stderr(launcher)
    assert "Traceback" not in err, err
    assert "the learner process exited with code -9; restarting it (1/2)" in err, err
    assert ("(its warm standby took over)" in err) == standby, err
    s = read_summary(run_dir)
    assert s["learner_restarts"] == 1 and s["actor_restarts"] == 0
    assert s["learner_restarts_from_standby"] == int(standby), s
    assert s["updates"] >= 200000 // (2 * 16 * 32)
    # the version went on from the checkpoint: never below it once the new learner logged
    updates = [r["updates"] for r in records(run_dir)]
    if len(updates) >= 2 and updates[-1] == updates[-2]:
        # the final record holds the metrics of the last updates, read back after the loop
        # (lazily, a few updates behind): it may repeat the version last logged
        updates = updates[:-1]
    drop = next((i for i in range(1, len(updates)) if updates[i] <= updates[i - 1]), None)
    if drop is not None:  # the old learner had logged past its checkpoint
        assert updates[drop - 1] <= logged_before
        assert updates[drop] > last_step
        assert updates[drop:] == sorted(updates[drop:])
    for a in actors:
        log = (run_dir / "actors" / f"actor-{ids[a.pid]}.log").read_text()
        assert "stopping:" not in log, log  # none gave up on the learner
    with open(run_dir / "summary.json") as f:
        assert json.load(f)["final_return"] > 0
    assert not alive(actors)
    if standby:  # the learner and the standby behind it ended with the run
        assert not alive([spare, *spares])
    # the staleness bound held across the kill and the restart: no sample learned from was
    # staler than staleness.max_staleness (8 in this config), and admission by version paced
    # the actors rather than dropping what they sent
    learned = [r for r in records(run_dir) if "staleness_max" in r]
    assert learned and max(r["staleness_max"] for r in learned) <= 8
    assert max(r["tau_max"] for r in learned if "tau_max" in r) <= 8
    assert learned[-1]["dropped_fraction"] < 0.01, learned[-1]


@contextlib.contextmanager
def _failing_saves(directory):
    """Yields `fail()` and `free()`: after fail() a checkpoint save in `directory` raises
    (the steps already there stay readable), after free() it works again. A full tmpfs
    (ENOSPC) where this process may mount one; else, for a user that is not root, a
    directory made read-only (EACCES). Skips where neither is possible."""
    os.makedirs(directory)
    mounted = (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(directory)], capture_output=True
        ).returncode
        == 0
    )
    if not mounted and os.geteuid() == 0:
        pytest.skip("no tmpfs can be mounted, and root ignores a read-only directory")
    filler = os.path.join(directory, "filler")

    def fail():
        if mounted:
            with open(filler, "wb") as f:  # fill it: the next save meets ENOSPC
                chunk = bytes(1 << 20)
                with contextlib.suppress(OSError):
                    while True:
                        f.write(chunk)
                        f.flush()
        else:
            os.chmod(directory, 0o500)

    def free():
        if mounted:
            os.remove(filler)
        else:
            os.chmod(directory, 0o700)

    try:
        yield fail, free
    finally:
        if mounted:
            for _ in range(50):  # the launcher's children may hold it a moment longer
                if subprocess.run(["umount", str(directory)], capture_output=True).returncode == 0:
                    break
                time.sleep(0.2)
        else:
            os.chmod(directory, 0o700)


@pytest.mark.slow
def test_a_learner_that_raises_at_a_checkpoint_is_restarted_and_the_run_reaches_its_target(
    tmp_path, procs
):
    """A learner that dies of an exception (not a kill) must not take its actors with it:
    before, it told them to stop, they exited 0 (the run's end, to the supervisor) and the
    restarted learner waited for actors that would never come."""
    run_dir = tmp_path / "run"
    with _failing_saves(run_dir / "checkpoints") as (fail, free):
        launcher = _launch(
            procs,
            run_dir,
            "runtime.restart_learner=true",
            "checkpoint.every=20",
            "total_env_steps=200000",
        )
        actors = _running(procs, launcher, run_dir, 1)
        ids = {a.pid: _actor_id(a) for a in actors}
        wait_for(
            lambda: ckpt.has_checkpoint(str(run_dir)) or launcher.poll() is not None,
            120,
            what="a first checkpoint",
        )
        assert launcher.poll() is None, procs.stderr(launcher)
        fail()
        wait_for(
            lambda: "restarting it" in procs.stderr(launcher) or launcher.poll() is not None,
            120,
            what="the learner to fail at its next checkpoint and be restarted",
        )
        free()  # (long before the new learner, still starting up, saves)
        assert procs.wait(launcher, 240) == 0, procs.stderr(launcher)
        err = procs.stderr(launcher)
        assert "the learner process exited with code 1; restarting it (1/2)" in err, err
        # the learner's own error: a full disk (tmpfs) or a refused write (read-only)
        assert os.strerror(errno.ENOSPC) in err or os.strerror(errno.EACCES) in err, err
        # ... said on the launcher's line (the learner's stderr passes only tianjax's lines then)
        restart = next(line for line in err.splitlines() if "restarting it (1/2)" in line)
        assert "; it failed with OSError: [Errno" in restart, err
        s = read_summary(run_dir)
        assert s["learner_restarts"] == 1 and s["actor_restarts"] == 0, s
        assert s["convergence_time_s"] is not None, s  # reached its target (475)
        assert s["updates"] >= 200000 // (2 * 16 * 32)
        for a in actors:  # the same actor processes served both learners, to the end
            log = (run_dir / "actors" / f"actor-{ids[a.pid]}.log").read_text()
            assert "stopping:" not in log, log
        assert not alive(actors)
        print(
            f"restart after an exception at a checkpoint: {s['updates']} updates, "
            f"converged at {s['convergence_time_s']:.1f} s"
        )
