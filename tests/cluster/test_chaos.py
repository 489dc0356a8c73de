"""The chaos soak (experiments/studies/chaos/chaos.py).

Short, on namespace hosts, real processes: about a minute and a half of training with one
fault of each kind (an actor killed, an actor stopped, the learner killed and restarted
from its checkpoint, an actor host's link cut, the same link capped to 1 Mbit/s), each
recovered with a time, the accounting closed, the run stopped at its end with its summary,
and nothing left behind. Its timings are not checked: the study reports them.

And the study's arithmetic on records written by hand: recovery times, the samples a
killed learner took with it, an accounting that closes and one that does not.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import psutil
import pytest

from tianjax.launch import netns

from ..integration.conftest import child_env
from .conftest import REPO

SCRIPT = REPO / "experiments" / "studies" / "chaos" / "chaos.py"
_spec = importlib.util.spec_from_file_location("chaos_study", SCRIPT)
chaos = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(chaos)


# ----------------------------------------------------------------------------- arithmetic
RECORDS = [
    {"unix_time": 10.0, "actor_admitted_at": {"1": 9.5, "2": 9.9}},
    {"unix_time": 11.0, "actor_admitted_at": {"1": 10.7, "2": 9.9}},
    {"unix_time": 12.0, "actor_admitted_at": {"1": 11.9, "2": 11.4}},
]


def test_recovery_runs_from_the_fault_to_the_actors_first_admission_or_the_learners_record():
    assert chaos.recovery_s({"kind": "actor_kill", "actor": 1, "end": 10.0}, RECORDS) == (
        pytest.approx(0.7)
    )
    # a stop's recovery counts from its end (SIGCONT), not its start
    stop = {"kind": "actor_stop", "actor": 2, "start": 5.0, "end": 10.0}
    assert chaos.recovery_s(stop, RECORDS) == pytest.approx(1.4)
    kill = {"kind": "learner_kill", "actor": None, "end": 10.2}
    assert chaos.recovery_s(kill, RECORDS) == pytest.approx(0.8)
    assert chaos.recovery_s({"kind": "link_cut", "actor": 0, "end": 10.0}, RECORDS) is None
    assert chaos.recovery_s({"kind": "learner_kill", "actor": None, "end": 12.5}, RECORDS) is None


def _rec(t, updates, produced, fresh=None):
    return {"unix_time": t, "updates": updates, "samples_produced": produced,
            "samples_fresh": produced if fresh is None else fresh}  # fmt: skip


def test_a_killed_learner_takes_what_it_admitted_after_its_last_checkpoint():
    # checkpoint at update 20; the learner went on to 23, was killed at 20.5; its successor
    # resumed from 20 (metrics.jsonl keeps up to it, the rest was superseded) and went on
    kept = [_rec(10.0, 19, 9728), _rec(11.0, 20, 10240), _rec(25.0, 21, 10752)]
    kept.append(_rec(26.0, 22, 11264))
    superseded = [_rec(12.0, 21, 10752), _rec(13.0, 22, 11264), _rec(14.0, 23, 11776)]
    records = sorted(kept + superseded, key=lambda r: r["unix_time"])
    faults = [{"kind": "actor_kill", "start": 5.0}, {"kind": "learner_kill", "start": 20.5}]
    assert chaos.rolled_back(faults, kept, records) == [11776 - 10240]
    # the rate over the kept history, and a series that does not count the set-back
    assert chaos.fresh_rate(kept) == pytest.approx((11264 - 9728) / 16.0)
    xs, ys = chaos.rate_series(records, t0=10.0, bin_s=5.0)
    assert xs == [2.5, 7.5, 12.5, 17.5]
    assert ys == [(11776 - 9728) / 5, 0.0, 0.0, 512 / 5]


def _summary(received, sent=None):
    return {
        "resumed_from_step": 20,
        "env_steps": 20480 + 10 * 512,
        "balance": {"dropped_samples": 3 * 512, "expired_samples": 512},
        "dropped_nonfinite": 1,
        "dropped_bad_versions": 0,
        "trajectories_received": received,
        "trajectories_written_off": 1,
        "rejected_messages": 2,
        "rejected_by_reason": {"old_incarnation": 2},
        "trajectories_by_actor": {"0": {"received": received, "sent": sent or received}},
    }


def test_the_accounting_closes_only_when_every_trajectory_received_and_sent_is_placed():
    kept = [{"updates": 20, "env_steps": 20480, "dropped_samples": 512, "expired_samples": 0}]
    # since update 20: 10 admitted, 1 too stale (2 drops of which 1 expired in the pool,
    # against 1 before), 1 non-finite: 12 trajectories received
    a = chaos.accounting(_summary(12), kept, 512, [1024])
    assert a["samples_admitted"] == 10 * 512
    assert a["dropped_on_arrival"] == {
        "too_stale_or_beyond_budget": 512,
        "nonfinite": 512,
        "bad_versions": 0,
    }
    assert a["closes"] and a["samples_lost_with_killed_learners"] == [1024]
    assert not chaos.accounting(_summary(13), kept, 512, [])["closes"]  # one unplaced
    # ... unless the learner's receiver held it, unread, when the run stopped
    unread = {**_summary(13), "trajectories_unread_at_stop": 1}
    assert chaos.accounting(unread, kept, 512, [])["closes"]
    # an actor that said it sent 2 more than came, with 1 written off: 1 unaccounted
    a = chaos.accounting(_summary(12, sent=14), kept, 512, [])
    assert not a["closes"] and a["sent_unaccounted_by_actor"] == {"0": 1}
    # ... unless that one was read, unread, from the learner's socket at the stop
    s = _summary(13, sent=14)
    s["trajectories_unread_at_stop"] = 1
    s["trajectories_by_actor"]["0"].update(received=12, unread_at_stop=1)
    a = chaos.accounting(s, kept, 512, [])
    assert a["closes"] and a["sent_unaccounted_by_actor"] == {}, a


def test_with_groups_recovery_reads_the_actors_group_and_the_averagers_rounds():
    groups = chaos.chaos_groups
    # actor 3 trains for group 1 of 2: its admissions are in group 1's records
    by_group = [[{"unix_time": 10.0, "actor_admitted_at": {"3": 10.9}}], RECORDS]
    assert groups.recovery_s({"kind": "actor_kill", "actor": 3, "end": 10.0}, by_group, []) is None
    by_group = [[], [{"unix_time": 11.0, "actor_admitted_at": {"3": 10.6}}]]
    kill = {"kind": "actor_kill", "actor": 3, "group": None, "end": 10.0}
    assert groups.recovery_s(kill, by_group, []) == pytest.approx(0.6)
    rounds = [
        {"unix_time": 9.0, "merged_groups": [0, 1]},
        {"unix_time": 11.5, "merged_groups": [0]},
        {"unix_time": 13.0, "merged_groups": [0, 1]},
    ]
    # the averager: its first round after the kill; a cut group: its first merged delta
    averager = {"kind": "averager_kill", "actor": None, "group": None, "end": 10.0}
    assert groups.recovery_s(averager, by_group, rounds) == pytest.approx(1.5)
    cut = {"kind": "group_cut", "actor": None, "group": 1, "end": 10.0}
    assert groups.recovery_s(cut, by_group, rounds) == pytest.approx(3.0)
    assert groups.recovery_s({**cut, "end": 13.5}, by_group, rounds) is None


def test_the_groups_ledger_adds_up_and_closes_only_when_every_groups_does():
    groups = chaos.chaos_groups
    kept = [{"updates": 20, "env_steps": 20480, "dropped_samples": 512, "expired_samples": 0}]
    a = chaos.accounting(_summary(12), kept, 512, [])
    b = chaos.accounting(_summary(13), kept, 512, [])  # one trajectory unplaced
    both = groups.combined_accounting([a, a])
    assert both["closes"] and both["trajectories_received"] == 24
    assert both["samples_admitted"] == 2 * a["samples_admitted"]
    assert both["dropped_on_arrival"]["nonfinite"] == 2 * 512
    assert not groups.combined_accounting([a, b])["closes"]
    assert groups.combined_accounting([a, None]) is None  # a group without its summary


def test_a_results_file_names_paths_relative_to_the_repository():
    repo = chaos.REPO
    res = {
        "args": {"repo": repo, "dir": f"{repo}/runs/c", "config": "configs/x.yaml", "n": 3},
        "runs": [{"run_dir": f"{repo}/runs/c/free-0"}],
        "elsewhere": "/srv/data/x",
    }
    assert chaos.repo_relative(res) == {
        "args": {"repo": ".", "dir": "runs/c", "config": "configs/x.yaml", "n": 3},
        "runs": [{"run_dir": "runs/c/free-0"}],
        "elsewhere": "/srv/data/x",
    }
    assert chaos.repo_relative(repo + "x/y") == repo + "x/y"  # a sibling folder, not inside


# ----------------------------------------------------------------------------- the soak
def _left(path: str) -> list[int]:
    """Processes whose command line names `path` (the run's config carries its run_dir)."""
    out = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if any(path in part for part in p.info["cmdline"] or []):
                out.append(p.pid)
        except psutil.Error:
            pass
    return out


@pytest.mark.slow
def test_a_short_soak_recovers_from_one_fault_of_each_kind(tmp_path):
    why = netns.available()
    if why is not None:
        pytest.skip(why)
    out = tmp_path / "chaos.json"
    argv = [
        sys.executable,
        str(SCRIPT),
        "--minutes", "1.5",
        "--every", "12",
        "--stop-s", "5",
        "--cut-s", "8",
        "--cap-s", "8",
        "--actors", "3",
        "--no-baseline",
        "--dir", str(tmp_path / "runs"),
        "--out", str(out),
    ]  # fmt: skip
    done = subprocess.run(
        argv, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "fault" in done.stdout and "closes: True" in done.stdout, done.stdout
    res = json.loads(out.read_text())
    assert res["summary"]["where"].startswith("namespace hosts"), res["summary"]["where"]
    (run,) = res["runs"]
    # it trained to its end and was stopped there, with its summary and a final checkpoint
    # (a stop that hung has every thread's stack, dumped before the kill, in launcher.err)
    err = (tmp_path / "runs" / "chaos-0" / "launcher.err").read_text(errors="replace")
    assert run["ended"] == "deadline" and run["summary_written"], (run["ended"], err[-6000:])
    assert run["training_s"] > 80, run["training_s"]
    # a fault of each kind, in turn (and another actor kill, if it fits), each recovered
    kinds = [f["kind"] for f in run["faults"]]
    assert run["faults_skipped"] == [], run["faults_skipped"]
    assert kinds[:5] == list(chaos.KINDS) and len(kinds) <= 6, run["faults"]
    for f in run["faults"]:
        assert f["recovery_s"] is not None and f["recovery_s"] >= 0, f
        assert "undo_error" not in f, f
    assert run["actor_restarts"] == kinds.count("actor_kill"), run
    # the killed learner's warm standby took its place (the soak's default)
    assert run["learner_restarts"] == 1 and run["learner_restarts_from_standby"] == 1, run
    recovery = res["summary"]["recovery_s"]
    assert all(recovery[k]["n"] == kinds.count(k) for k in chaos.KINDS), recovery
    # every trajectory the last learner received was admitted or dropped by a named
    # reason, what each actor sent came or was written off, and the killed learner's
    # admissions since its checkpoint are counted lost with it
    a = run["accounting"]
    assert a["closes"], a
    assert len(a["samples_lost_with_killed_learners"]) == 1, a
    assert a["samples_admitted"] > 0 and a["trajectories_received"] > 0, a
    assert run["fresh_per_s"] > 0 and (tmp_path / "chaos.png").stat().st_size > 0
    # nothing left behind: no process of the run, no namespace
    assert _left(str(tmp_path)) == []
    prefix = res["args"].get("netns_prefix")
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert prefix and prefix not in listed, (prefix, listed)
