"""Exact resume under kill -9, with real processes: a run killed at 10 random points and
resumed each time from its newest checkpoint ends as the run that was never killed.

- fused (`tianjax train configs/ppo_cartpole.yaml`, one process): the final parameters
  equal the uninterrupted run's bit for bit, and the counters go on (every update recorded
  once, in order; the env steps and updates of the end equal);
- the runtime with `runtime.restart_learner` and its learner killed at random points: the
  counters go on (a checkpoint never behind the one before, the budget reached exactly),
  the balance controller's state comes back, and every trajectory is accounted for:
  learned, given back at a resume, dropped by a named reason, or lost with the learner
  that held it; in the deterministic-lag mode the final parameters equal the
  uninterrupted run's bit for bit.

A seeded RNG picks the points (a delay after a new checkpoint appears, so that a kill may
land mid-update, mid-record or mid-checkpoint)."""

from __future__ import annotations

import os
import random
import signal
import time

import jax
import numpy as np
import pytest

import tianjax
from tianjax.checkpoint import store as ckpt

from .conftest import (
    ASYNC_CFG,
    REPO,
    actor_processes,
    read_summary,
    records,
    wait_for,
)

FUSED_CFG = str(REPO / "configs" / "ppo_cartpole.yaml")
KILLS = 10


def _steps(run_dir) -> list[int]:
    """The checkpoint steps on disk (complete ones are renamed into place)."""
    root = os.path.join(run_dir, ckpt.CHECKPOINT_DIR)
    return sorted(int(d) for d in os.listdir(root) if d.isdigit()) if os.path.isdir(root) else []


def _train(procs, name, run_dir, overrides, resume=False):
    return procs.start(
        [
            "-m",
            "tianjax.cli",
            "train",
            *overrides,
            f"run_dir={run_dir}",
            *([f"resume={run_dir}"] if resume else []),
            "--no-progress",
        ],
        name=name,
    )


def _kill(p) -> None:
    os.killpg(p.pid, signal.SIGKILL)  # the process group it was started in
    p.wait(30)


def _params(run_dir):
    _, tree, _ = ckpt.restore_latest(str(run_dir))
    return tree["learner"]["params"]


@pytest.mark.slow
def test_a_fused_run_killed_at_10_random_points_ends_as_the_uninterrupted_one(tmp_path, procs):
    rng = random.Random(34)
    run = [
        FUSED_CFG,
        "num_envs=4",
        "rollout_len=32",
        "total_env_steps=16384",  # 128 updates
        "log_every=1",
        "checkpoint.every=4",
        "checkpoint.keep=2",
        "eval.episodes=0",
        "target_return=null",
        "loggers=[]",
    ]
    whole = _train(procs, "whole", tmp_path / "whole", run)
    killed = str(tmp_path / "killed")
    kills = []
    for i in range(KILLS):
        before = max(_steps(killed), default=0)
        p = _train(procs, f"part{i}", killed, run, resume=bool(before))
        # a checkpoint newer than the one it resumed from, then a random moment after it
        wait_for(
            lambda: max(_steps(killed), default=0) > before or p.poll() is not None,
            120,
            what="a new checkpoint",
        )
        time.sleep(rng.uniform(0.0, 0.3))
        assert p.poll() is None, f"the run ended before kill {i + 1}: " + procs.stderr(p)[-2000:]
        _kill(p)
        kills.append(max(_steps(killed)))
    last = _train(procs, "last", killed, run, resume=True)
    assert procs.wait(last, 120) == 0, procs.stderr(last)
    assert procs.wait(whole, 120) == 0, procs.stderr(whole)
    assert kills == sorted(kills) and len(set(kills)) == KILLS  # every kill after new progress

    s, ref = read_summary(killed), read_summary(tmp_path / "whole")
    assert (s["updates"], s["env_steps"]) == (ref["updates"], ref["env_steps"]) == (128, 16384)
    # the counters went on: every update recorded once, in order (what a killed session
    # recorded past its checkpoint was moved aside and recorded again)
    assert [r["updates"] for r in records(killed)] == list(range(1, 129))
    assert [r["env_steps"] for r in records(killed)] == [128 * u for u in range(1, 129)]
    # bit for bit: the same parameters and optimizer state
    a, b = _params(killed), _params(tmp_path / "whole")
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


LEARNER_KILLS = 10


def _kill_learner_at_random_points(procs, launcher, run_dir, rng) -> None:
    """Kills the launcher's learner process LEARNER_KILLS times, each at a random moment
    after it wrote a new checkpoint; the launcher restarts it from its newest."""
    killed = []
    for i in range(LEARNER_KILLS):
        # the working one: a warm standby (runtime.standby_learner) is started after it
        learner = wait_for(
            lambda: (
                sorted(
                    (
                        p
                        for p in actor_processes(launcher.pid, role="learner")
                        if p.pid not in killed
                    ),
                    key=lambda p: p.create_time(),
                )
                or launcher.poll() is not None
            ),
            120,
            what="a learner process",
        )
        assert launcher.poll() is None, procs.stderr(launcher)[-3000:]
        before = max(_steps(run_dir), default=0)
        wait_for(
            lambda: max(_steps(run_dir), default=0) > before or launcher.poll() is not None,
            120,
            what="a new checkpoint",
        )
        time.sleep(rng.uniform(0.0, 0.5))
        assert launcher.poll() is None, f"the run ended before kill {i + 1}"
        learner[0].send_signal(signal.SIGKILL)
        killed.append(learner[0].pid)


@pytest.mark.slow
def test_a_runtime_whose_learner_is_killed_at_random_points_counts_on_and_loses_nothing_uncounted(
    tmp_path, procs
):
    rng = random.Random(3434)
    run_dir = str(tmp_path / "run")
    config = tianjax.load_config(ASYNC_CFG)
    per_update = config.steps_per_update
    n_updates = 96  # (each kill comes after a new checkpoint, 4 updates on at least)
    launcher = _train(
        procs,
        "launcher",
        run_dir,
        [
            ASYNC_CFG,
            "runtime.restart_learner=true",
            f"runtime.max_learner_restarts={LEARNER_KILLS}",
            "checkpoint.every=4",
            "checkpoint.keep=100",
            "balance.period_s=0.1",  # (decisions to count in the short sessions)
            f"total_env_steps={n_updates * per_update}",
            "log_every=1",
            "eval.episodes=0",
            "target_return=null",
            "loggers=[]",
        ],
    )
    _kill_learner_at_random_points(procs, launcher, run_dir, rng)
    assert procs.wait(launcher, 240) == 0, procs.stderr(launcher)[-3000:]
    err = procs.stderr(launcher)
    for i in range(1, LEARNER_KILLS + 1):
        assert f"exited with code -9; restarting it ({i}/{LEARNER_KILLS})" in err, err

    s = read_summary(run_dir)
    assert s["learner_restarts"] == LEARNER_KILLS and s["actor_restarts"] == 0
    # the budget, exactly: every fresh batch once (no reuse in this config)
    assert (s["updates"], s["env_steps"]) == (n_updates, n_updates * per_update)
    # the counters never went back past a checkpoint: every checkpoint's counters and the
    # controller's count of decisions are at least the one's before it
    metas = [ckpt.read_meta(run_dir, step) for step in _steps(run_dir)]
    for key in ("updates", "env_steps", "received_total"):
        seq = [m[key] for m in metas]
        assert seq == sorted(seq), (key, seq)
    decisions = [m["controller"]["decisions"] for m in metas]
    assert decisions == sorted(decisions) and decisions[-1] > decisions[0], decisions

    # every trajectory accounted for. Received by some learner incarnation and kept by a
    # checkpoint (or by the last one): learned from (the budget), given back at a resume
    # (pooled at its checkpoint), or dropped by a named reason
    resumed = [
        int(line.split("is step ")[1].split()[0])
        for line in err.splitlines()
        if "restarting it" in line
    ]
    assert len(resumed) == LEARNER_KILLS
    given_back = sum(ckpt.read_meta(run_dir, step)["unlearned_samples"] for step in resumed)
    traj = config.num_envs * config.rollout_len
    received = s["trajectories_received_before"] + s["trajectories_received"]
    assert received * traj == s["env_steps"] + given_back + s["dropped_samples"], s
    # ... or sent to a learner that was killed after its last checkpoint (learned from,
    # pooled or in flight there): lost with it, at most what a learner holds past its
    # checkpoint (checkpoint.every batches and the actors' credits) per kill
    held = 4 * config.batch_trajectories + config.num_actors * config.runtime.credits_per_actor
    assert 0 <= s["trajectories_lost_with_learners"] <= LEARNER_KILLS * held, s


@pytest.mark.slow
def test_a_deterministic_run_whose_learner_is_killed_at_random_points_ends_bit_for_bit(
    tmp_path, procs
):
    """runtime.deterministic: a restarted learner resumes from its checkpoint at version V,
    and the actors rewind their shards to where they were before round V (they keep the
    last rounds' rollout states), so the rounds after it are made again as they were.
    Each replacement is the warm standby learner (runtime.standby_learner), whose update
    was built and compiled before the checkpoint it resumes from was written (the async
    test above restarts cold learners)."""
    rng = random.Random(343434)
    n_updates = 200  # (each kill comes after a new checkpoint, 4 updates on at least)
    run = [
        ASYNC_CFG,
        "env_backend=gymnax",
        "runtime.deterministic=true",
        "runtime.batch_trajectories=2",
        "num_envs=4",
        "rollout_len=16",
        "ppo.num_minibatches=2",
        f"total_env_steps={n_updates * 128}",
        "runtime.restart_learner=true",
        f"runtime.max_learner_restarts={LEARNER_KILLS}",
        "runtime.standby_learner=true",
        "checkpoint.every=4",
        "log_every=1",
        "eval.episodes=0",
        "target_return=null",
        "loggers=[]",
    ]
    whole = _train(procs, "whole", tmp_path / "whole", run)
    run_dir = str(tmp_path / "killed")
    launcher = _train(procs, "launcher", run_dir, run)
    _kill_learner_at_random_points(procs, launcher, run_dir, rng)
    assert procs.wait(launcher, 240) == 0, procs.stderr(launcher)[-3000:]
    assert procs.wait(whole, 240) == 0, procs.stderr(whole)[-3000:]
    s = read_summary(run_dir)
    assert s["learner_restarts"] == LEARNER_KILLS and s["actor_restarts"] == 0
    assert s["learner_restarts_from_standby"] == LEARNER_KILLS, s
    assert (s["updates"], s["env_steps"]) == (n_updates, n_updates * 128)
    # every sample one update old once past the first, across the restarts too
    assert s["staleness_histogram"] == {"0": 128, "1": (n_updates - 1) * 128}
    for actor in (tmp_path / "killed" / "actors").glob("actor-*.log"):
        assert "not as the uninterrupted run" not in actor.read_text()
    a, b = _params(run_dir), _params(tmp_path / "whole")
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
