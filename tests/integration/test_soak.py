"""The soak tool (experiments/tools/soak.py), short: an async run with 4 actors while
actors are SIGKILLed and garbage is streamed at the learner's sockets. The run must go on
updating, count the restarts, refuse the garbage at the handshake, keep its memory and
file descriptors bounded, and leave no process behind.
"""

from __future__ import annotations

import json
import os
import signal

import psutil

from .conftest import REPO, ROLE_MARK, alive

SOAK = str(REPO / "experiments" / "tools" / "soak.py")


def _role_processes_in_group(pgid: int) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if ROLE_MARK in (p.info["cmdline"] or []) and os.getpgid(p.pid) == pgid:
                out.append(p)
        except (ProcessLookupError, psutil.Error):
            pass
    return alive(out)


def _still_role_processes(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            if ROLE_MARK in p.cmdline() and alive([p]):
                out.append(pid)
        except psutil.Error:
            pass
    return out


def test_soak_short_run_survives_kills_and_garbage(tmp_path, procs):
    soak_dir = tmp_path / "soak"
    out = tmp_path / "soak.json"
    # the budget ends the run after ~15-25 s of training on 2 idle cores; --minutes only
    # caps a slow (loaded) machine, which then stops it with SIGTERM
    p = procs.start(
        [
            SOAK,
            "--minutes",
            "1.5",
            "--total-env-steps",
            "600000",
            "--kill-every",
            "5",
            "--garbage-rate",
            "50",
            "--sample-every",
            "2",
            "--warmup",
            "4",
            "--rate-window",
            "6",
            "--max-rss-growth",
            "1.5",
            "--max-fd-spread",
            "64",
            "--dir",
            str(soak_dir),
            "--out",
            str(out),
        ],
        name="soak",
    )
    pid_file = soak_dir / "launcher.pid"
    try:
        code = procs.wait(p, 240)
        launcher_pid = int(pid_file.read_text())
        # nothing of the run is left: not in the launcher's process group, not any actor seen
        left = _role_processes_in_group(launcher_pid)
        res = json.loads(out.read_text())
    finally:
        # the launcher has a process group of its own, which the fixture does not know
        if pid_file.exists():
            try:
                os.killpg(int(pid_file.read_text()), signal.SIGKILL)
            except (ProcessLookupError, PermissionError, ValueError):
                pass
    log = procs.stdout(p) + procs.stderr(p)
    assert code == 0, log
    s = res["summary"]
    assert not left, [q.pid for q in left]
    assert s["leftover_processes"] == [], s["leftover_processes"]
    assert res["actor_pids_seen"] and not _still_role_processes(res["actor_pids_seen"])
    assert res["actor_pids_alive_at_end"] == []

    # the run ended cleanly: finished its budget, or stopped by the expected SIGTERM
    ended = s["ended"]
    assert ended["how"] in ("finished", "deadline"), ended
    # (130: the CLI's code for a stop by signal; 0 if the budget ran out as the SIGTERM came)
    assert ended["exit_code"] in ((0,) if ended["how"] == "finished" else (0, 130)), ended
    assert not ended.get("killed_after_grace"), ended
    assert s["tracebacks_in_launcher_stderr"] == 0, (soak_dir / "launcher.err").read_text()[-3000:]

    # killed actors were restarted and counted; none was given up on
    assert s["kills"] >= 1
    if ended["how"] == "finished":
        assert s["restarts_source"] == "summary.json"
        assert res["run_summary"]["actor_restarts"] >= 1, res["run_summary"]
    assert s["restarts"] >= 1 and s["actors_lost"] == 0, s

    # Without the run's credentials no connection gets past the handshake (the learner's
    # gatekeeper), so the garbage went over raw TCP at ZeroMQ's handshake: none of it
    # reached the codec. (What reaches the codec from a peer past the handshake is
    # tests/runtime/learner/test_ingress_fuzz.py's and test_security.py's.)
    g = s["garbage"]
    assert g["error"] is None, g
    assert g["handshake_refused"] and g["connected"] == [], g
    assert len(g["refused_pairs"]) == 2 * len(g["ports"]), g
    assert g["sent"] > 0 and g["raw_sent"] == g["sent"]
    assert s["rejected"] == 0, (s["rejected"], g["sent"])
    if res["run_summary"] is not None:
        assert res["run_summary"]["dropped_nonfinite"] == 0

    # the learner kept updating, and its memory and descriptors stayed bounded
    steady = [x for x in res["samples"] if x["phase"] == "steady"]
    assert len(steady) >= 2, res["samples"]
    table = [
        (x["t"], x["phase"], x["updates"], x["updates_per_min"], x["actors_alive"], x["kills"])
        for x in res["samples"]
    ]
    assert all(x["updates_per_min"] and x["updates_per_min"] > 0 for x in steady), (ended, table)
    assert s["updates_per_min"]["all_positive"]
    rss = s["rss_mib"]
    assert rss["last"] <= 1.5 * rss["first"], rss
    assert s["fds"]["max"] - s["fds"]["min"] <= 64, s["fds"]
