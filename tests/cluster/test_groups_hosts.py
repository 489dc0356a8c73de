"""Learner groups across hosts made of network namespaces (tianjax.launch.netns), one role
per command as docs/multihost.md writes them, curve security (the default of `tianjax
launch`), real processes: the averager and group 0's learner on host0, group 1's learner
on host1, group 0's actors (ids 0 and 2) on host2 and group 1's (1 and 3) on host3.

2 groups of 2 actors, group 1's learner host cut off for 20 s mid-run: group 0 goes on at
0.8 or more of its updates/s from before the cut; group 1 rejoins once the link heals and
its first delta after that is merged; both groups end at their budgets, every delta merged
and none lost, and reach the target (each group's moving average of 100 episodes reaches
475 during the run: a PPO policy's return can dip after that, as one group's did to 417 by
the end on a loaded machine); and in every group each trajectory an actor sent was
admitted, refused on arrival, or counted lost (none is unaccounted for). (Without the cut,
the same run is docs/multihost.md's; one run checks both, for the suite's time.)
"""

from __future__ import annotations

import os
import time

import pytest

from ..integration.conftest import child_env, read_summary, records, wait_for
from .conftest import REPO

CONFIG = str(REPO / "configs" / "ppo_latency_async.yaml")
BASE_PORT = 5555
# 2 groups of 2 actors, each group's share 120,000 env steps; actors at about 2,000 env
# steps/s each (8 ms vector steps of 16 envs, no hiccups) so that a run lasts about a minute
RUN = [
    "groups.count=2",
    "num_actors=4",
    "total_env_steps=240000",
    "groups.sync_every=1",
    "env_options.step_ms=8",
    "env_options.sigma=0.5",
    "env_options.hiccup_p=0",
    "log_every=1",
]
HOSTS = ["host0", "host1", "host2", "host3"]


def _start(cluster, host_procs, run_dir, *extra):
    """The run's processes, one command per role (docs/multihost.md, learner groups)."""
    env = child_env(TIANJAX_RUN_KEY=os.urandom(32).hex())
    cli = ["-m", "tianjax.cli", "launch"]
    common = [CONFIG, *RUN, *extra, f"run_dir={run_dir}", "--base-port", str(BASE_PORT)]
    bind = ["--bind-host", "0.0.0.0"]
    roles = {
        "averager": ("host0", [*cli, "--role", "averager", *common, *bind]),
        "group-0": ("host0", [*cli, "--role", "learner", *common, "--group", "0", *bind]),
        "group-1": ("host1", [*cli, "--role", "learner", *common, "--group", "1", *bind]),
    }
    for g in (0, 1):
        roles["group-" + str(g)][1].extend(["--averager-host", "host0"])
    for k in range(4):
        where = ["host2", "host3"][k % 2]
        learner = ["host0", "host1"][k % 2]
        roles[f"actor-{k}"] = (
            where,
            [*cli, "--role", "actor", *common, "--actor-id", str(k), "--learner-host", learner],
        )
    return {
        name: host_procs.start(cluster, host, argv, name, env)
        for name, (host, argv) in roles.items()
    }


def _wait_all(host_procs, procs, timeout: float) -> None:
    for name in ("group-0", "group-1"):
        assert host_procs.wait(procs[name], timeout) == 0, host_procs.stderr(procs[name])[-4000:]
    for name, p in procs.items():
        if name.startswith("actor") or name == "averager":
            assert host_procs.wait(p, 60) == 0, (name, host_procs.stderr(p)[-4000:])


def _accounted(s: dict, config_steps: int) -> None:
    """Every trajectory sent is admitted, refused on arrival (too stale, or beyond the
    budget) or counted lost, and what the actors' newest heartbeats said they sent arrived."""
    arrival_drops = s["dropped_samples"] - s["balance"]["expired_samples"]
    unread = s["trajectories_unread_at_stop"] * config_steps
    assert s["trajectories_received"] * config_steps == s["env_steps"] + arrival_drops + unread, s
    assert s["rejected_messages"] == 0, s["rejected_by_reason"]
    for actor, c in s["trajectories_by_actor"].items():
        arrived = c["received"] + c.get("unread_at_stop", 0)
        assert c.get("sent", 0) <= arrived + s["trajectories_written_off"], (actor, c)


def _updates_per_s(run_dir, t0: float, t1: float) -> float:
    """A group's updates per second between two of its records' wall times."""
    recs = [r for r in records(run_dir) if t0 <= r["wall_time_s"] <= t1]
    assert len(recs) >= 2, (t0, t1, len(recs))
    return (recs[-1]["updates"] - recs[0]["updates"]) / (
        recs[-1]["wall_time_s"] - recs[0]["wall_time_s"]
    )


def _wall(run_dir) -> float:
    recs = records(run_dir)
    return recs[-1]["wall_time_s"] if recs else 0.0


@pytest.mark.slow
def test_a_group_whose_learner_host_is_cut_off_rejoins_and_the_other_goes_on(
    make_cluster, host_procs, tmp_path
):
    cluster = make_cluster(HOSTS, hosts_style="debian")
    run_dir = tmp_path / "run"
    procs = _start(cluster, host_procs, run_dir)
    g0, g1, av = run_dir / "group-0", run_dir / "group-1", run_dir / "averager"
    # about 10 s of training before the cut (its pace before it is measured over them)
    wait_for(
        lambda: (
            len(records(av)) >= 3
            and len(records(g0)) >= 35
            or any(p.poll() is not None for p in procs.values())
        ),
        180,
        what="3 rounds and 35 updates",
    )
    assert all(p.poll() is None for p in procs.values())
    before = (_wall(g0), time.monotonic())
    cluster.cut("host1")
    time.sleep(20)
    during = (_wall(g0), time.monotonic())
    rounds_at_heal = len(records(av))
    cluster.heal("host1")

    _wait_all(host_procs, procs, 300)
    # group 0 went on while group 1 was cut off: its pace during the cut against before it
    # (the same length of time before the cut, from its own records)
    span = during[0] - before[0]
    assert span > 15, span
    pace = _updates_per_s(g0, before[0], during[0]) / _updates_per_s(
        g0, max(before[0] - span, 0.0), before[0]
    )
    assert pace >= 0.8, pace
    # group 1 rejoined: its first delta after the heal was merged into a round
    after = records(av)[rounds_at_heal:]
    first = next((r for r in after if 1 in r["groups"]), None)
    assert first is not None, after
    assert first["merged_groups"].count(1) == first["groups"].count(1), first
    s0, s1 = read_summary(g0), read_summary(g1)
    assert s1["group_averages_merged"] >= 3 and s1["group_deltas_merged"] >= 3, s1
    assert s1["group_deltas_lost"] == 0 and s1["group_deltas_dropped"] == 0, s1
    a = read_summary(av)
    assert a["groups_done"] == [0, 1] and a["rounds"] >= 5 and a["deltas_dropped"] == 0, a
    assert a["rejected_messages"] == 0 and not a["handshakes_refused"], a
    assert "(curve)" in host_procs.stdout(procs["averager"])
    # each group ended at its budget, its last delta sent, nothing lost on the way
    for s in (s0, s1):
        assert s["env_steps"] == 120_000 // (2 * 16 * 32) * 2 * 16 * 32, s
        assert s["group_deltas_merged"] >= 3 and s["group_deltas_lost"] == 0, s
        assert s["group_final_delta_sent"], s
        _accounted(s, 16 * 32)
    # and the run reached its target (475) in each group, its cut notwithstanding
    assert s0["convergence_time_s"] is not None and s1["convergence_time_s"] is not None, (s0, s1)
