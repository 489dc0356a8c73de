"""SLURM task -> role (tianjax/launch/slurm.py), on variables set by hand: the node-list
and tasks-per-node forms SLURM writes, the block distribution, learners first, each actor
at its learner's host, and the run key file (mode 0600, whole when it appears)."""

import os
import stat

import pytest

from tianjax.config import ConfigError
from tianjax.launch.slurm import (
    expand_nodelist,
    expand_tasks_per_node,
    role_of,
    role_of_groups,
    slurm_task,
    wait_for_key_file,
    write_key_file,
)


def test_node_lists_expand_as_slurm_writes_them():
    assert expand_nodelist("n[01-03,07],gpu-a1") == ["n01", "n02", "n03", "n07", "gpu-a1"]
    assert expand_nodelist("localhost") == ["localhost"]
    assert expand_nodelist("r[8-10]x") == ["r8x", "r9x", "r10x"]
    assert expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    with pytest.raises(ConfigError, match="node list"):
        expand_nodelist("n[a-b]")


def env(rank, ntasks, nodes, per_node=None, **extra):
    e = {
        "SLURM_PROCID": str(rank),
        "SLURM_NTASKS": str(ntasks),
        "SLURM_JOB_NODELIST": nodes,
        "SLURM_JOB_ID": "77",
        "SLURM_STEP_ID": "3",
        **extra,
    }
    if per_node:
        e["SLURM_TASKS_PER_NODE"] = per_node
    return e


def test_learners_first_then_actors_pointed_at_their_learners_host():
    # 6 tasks on 3 nodes, 2 each: n1 = tasks 0, 1; n2 = 2, 3; n3 = 4, 5
    roles = [role_of(slurm_task(env(r, 6, "n[1-3]", "2(x3)")), 2) for r in range(6)]
    assert [(r.role, r.index) for r in roles] == [
        ("learner", 0),
        ("learner", 1),
        ("actor", 0),
        ("actor", 1),
        ("actor", 2),
        ("actor", 3),
    ]
    assert [r.learner_host for r in roles] == ["n1", "n1", "n1", "n1", "n1", "n1"]
    assert {r.actors_per_learner for r in roles} == {2} and {r.coordinator_host for r in roles} == {
        "n1"
    }
    # one task per node: learner 1 is on n2, so actors 1 and 3 (k mod 2 == 1) go there
    roles = [role_of(slurm_task(env(r, 6, "n[1-6]")), 2) for r in range(6)]
    assert [r.learner_host for r in roles] == ["n1", "n2", "n1", "n2", "n1", "n2"]
    assert slurm_task(env(0, 6, "n[1-6]")).job == "77.3"


def test_groups_learners_first_then_the_averager_then_actors_on_their_groups_hosts():
    # --groups 2, 7 tasks one per node: learners of groups 0 and 1 on n1 and n2, the
    # averager on n3, actors 0..3 on n4..n7 training for group k mod 2
    roles = [role_of_groups(slurm_task(env(r, 7, "n[1-7]")), 2) for r in range(7)]
    assert [(r.role, r.index) for r in roles] == [
        ("learner", 0),
        ("learner", 1),
        ("averager", 0),
        ("actor", 0),
        ("actor", 1),
        ("actor", 2),
        ("actor", 3),
    ]
    assert [r.learner_host for r in roles] == ["n1", "n2", "n3", "n1", "n2", "n1", "n2"]
    assert {r.averager_host for r in roles} == {"n3"} and {r.num_actors for r in roles} == {4}
    with pytest.raises(ConfigError, match="task count must be 3 \\+ a multiple of 2"):
        role_of_groups(slurm_task(env(0, 6, "n[1-6]")), 2)


def test_uneven_actors_and_missing_variables_are_one_line_errors():
    with pytest.raises(ConfigError, match="task count must be 2 \\+ a multiple of 2"):
        role_of(slurm_task(env(0, 5, "n1", "5")), 2)
    with pytest.raises(ConfigError, match="SLURM_PROCID is not set"):
        slurm_task({})
    with pytest.raises(ConfigError, match="do not add up"):
        slurm_task(env(0, 4, "n[1-2]", "3,3"))
    with pytest.raises(ConfigError, match="block distribution"):
        slurm_task(env(1, 2, "n[1-2]", "1(x2)", SLURMD_NODENAME="n1"))


def test_the_key_file_is_0600_and_whole(tmp_path):
    path = tmp_path / "shared" / "run.key"
    write_key_file(str(path))
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert len(bytes.fromhex(path.read_text())) == 32
    assert [p.name for p in path.parent.iterdir()] == ["run.key"]  # no temporary left
    wait_for_key_file(str(path), 1.0)
    with pytest.raises(ConfigError, match="shares"):
        wait_for_key_file(str(tmp_path / "nope.key"), 0.3)
