"""`srun tianjax launch CONFIG` on one machine: every task is `tianjax launch CONFIG ...`
without --role, started with the SLURM variables a job step would give it (set by hand,
all tasks on "localhost"), and finds its role itself. 1 learner + 2 actors (async) and
2 learners + 2 actors (sync, one jax.distributed mesh) train to the target; task 0
writes the run key file (mode 0600) that the others read; the key is never printed."""

from __future__ import annotations

import os
import stat

import pytest

from .conftest import ASYNC_CFG, child_env, free_port_block, read_summary


def _slurm_env(rank: int, ntasks: int, job: str) -> dict:
    env = {
        k: v for k, v in child_env().items() if not k.startswith("SLURM") and k != "TIANJAX_RUN_KEY"
    }
    env.update(
        SLURM_PROCID=str(rank),
        SLURM_NTASKS=str(ntasks),
        SLURM_JOB_NODELIST="localhost",
        SLURM_TASKS_PER_NODE=str(ntasks),
        SLURMD_NODENAME="localhost",
        SLURM_NODEID="0",
        SLURM_JOB_ID=job,
        SLURM_STEP_ID="0",
    )
    return env


@pytest.mark.slow
@pytest.mark.parametrize(
    "learners, overrides",
    [
        (1, ["total_env_steps=150000"]),  # the config's async PPO, 2 actors for the one learner
        (2, ["mode=sync", "total_env_steps=150000"]),  # 75k env steps and 1 actor per learner
    ],
)
def test_srun_tasks_find_their_roles_and_train_to_the_target(tmp_path, procs, learners, overrides):
    ntasks, job = learners + 2, f"9{learners}"
    base = free_port_block(3 * learners + 1)  # the learners' ports, then jax.distributed's
    run = tmp_path / "run"
    cmd = [
        "-m",
        "tianjax.cli",
        "launch",
        ASYNC_CFG,
        *overrides,
        f"run_dir={run}",
        "--learners",
        str(learners),
        "--base-port",
        str(base),
    ]
    tasks = [
        procs.start(cmd, name=f"task-{r}", env=_slurm_env(r, ntasks, job)) for r in range(ntasks)
    ]
    for r, p in enumerate(tasks):
        assert procs.wait(p, 300) == 0, procs.stderr(p)[-3000:]
    outs = [procs.stdout(p) for p in tasks]
    for r in range(learners):
        assert f"SLURM task {r}/{ntasks} on localhost: learner {r}/{learners}" in outs[r]
    for k in range(2):
        assert (
            f"SLURM task {learners + k}/{ntasks} on localhost: actor {k} (of learner {k % learners}"
            in outs[learners + k]
        )
    key_file = run / f"run-{job}.0.key"
    assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
    key = key_file.read_text().strip()
    assert all(key not in procs.stdout(p) + procs.stderr(p) for p in tasks)
    summaries = [read_summary(run / f"learner-{i}") for i in range(learners)]
    for i, s in enumerate(summaries):
        assert s["process_index"] == i and s["process_count"] == learners
        assert s["env_steps"] >= 150000 // learners - 16 * 32 * 2
        assert s["final_return"] >= 475, s
