"""Resuming runs of the distributed runtime and of the in-process host trainer.

The learner's state, version, env-step count and episode statistics come back from the
newest checkpoint and go on; metrics are appended to the same run directory. Progress
(fresh env steps learned) goes on too: a run resumed with a larger `total_env_steps` takes
the learning-rate schedule up at the fresh-step count it stopped at, over the new budget.
"""

from __future__ import annotations

import json
import os
import threading
import time

import jax
import numpy as np
import pytest

import tianjax
from tianjax.checkpoint import store as ckpt
from tianjax.core.update import learning_rate
from tianjax.metrics import RunLogger
from tianjax.runtime.actor.actor import Actor
from tianjax.runtime.learner.learner import Learner
from tianjax.transport.auth import new_run_key

from .conftest import ASYNC_CFG, REPO

GYM_CFG = str(REPO / "configs" / "ppo_cartpole_gymnasium.yaml")


def _records(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.mark.parametrize(
    "cfg,extra",
    [
        (ASYNC_CFG, ["mode=async"]),  # learner + 2 actor processes
        (GYM_CFG, []),  # the in-process host trainer
    ],
    ids=["async", "host"],
)
def test_resume_continues_version_and_env_steps(tmp_path, cfg, extra):
    per_update = tianjax.load_config(cfg, extra).steps_per_update
    common = [*extra, "log_every=2", "checkpoint.every=4", "eval.episodes=0", "target_return=null"]
    first = tianjax.train(
        cfg,
        [*common, f"total_env_steps={6 * per_update}"],
        run_dir=str(tmp_path / "r"),
        progress=False,
        verbose=False,
    )
    v1 = first.summary["updates"]
    assert v1 >= 6
    saved = ckpt.read_meta(first.run_dir)
    assert saved["updates"] == v1 and saved["env_steps"] == first.summary["env_steps"]

    started = time.perf_counter()
    second = tianjax.train(
        cfg,
        [*common, f"total_env_steps={12 * per_update}", f"resume={first.run_dir}"],
        progress=False,
        verbose=False,
    )
    took = time.perf_counter() - started
    s = second.summary
    assert second.run_dir == first.run_dir
    assert s["resumed_from_step"] == v1
    assert s["updates"] >= v1 + 6  # six more fresh batches (async may also reuse)
    assert s["env_steps"] >= 12 * per_update
    assert s["episodes"] > first.summary["episodes"]
    recs = _records(first.run_dir)
    updates = [r["updates"] for r in recs]
    assert updates == sorted(updates) and updates[-1] == s["updates"]
    steps = [r["env_steps"] for r in recs]
    assert steps == sorted(steps)
    meta = ckpt.read_meta(first.run_dir)
    assert meta["updates"] == s["updates"]
    # the run's wall time, its past counted once: the second session's clock goes on from
    # the first one's last checkpoint (the first session's moments after it, its summary
    # among them, are not counted again), so its last checkpoint comes after that one and
    # before the summary (counted twice, the past would exceed the summary by the first
    # session's length). The last record may follow the last checkpoint: a final record of
    # the same version is written after the loop.
    assert saved["wall_time_s"] < meta["wall_time_s"] <= s["wall_time_s"] + 1.0, (saved, meta, s)
    # ... and the second session added no more than it lasted
    assert s["wall_time_s"] - saved["wall_time_s"] <= took, (saved, s, took)
    assert recs[-1]["wall_time_s"] <= s["wall_time_s"] + 1.0
    assert s["wall_time_s"] > saved["wall_time_s"]


def test_eval_plays_a_host_env_run(tmp_path, capsys):
    from tianjax.cli import main

    run = tianjax.train(
        GYM_CFG,
        ["total_env_steps=4096", "eval.episodes=0"],
        run_dir=str(tmp_path / "r"),
        progress=False,
        verbose=False,
    )
    capsys.readouterr()
    assert main(["eval", run.run_dir, "episodes=3", "greedy=false", "seed=5"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith(f"eval 3 episodes (checkpoint step {run.summary['updates']}): mean ")
    mean, lo, hi = (float(line.split(k)[1].split()[0]) for k in ("mean ", "min ", "max "))
    assert 1 <= lo <= mean <= hi <= 500  # CartPole returns: at least one step, at most 500


def test_resumed_dqn_without_its_buffer_refills_it_before_learning(tmp_path):
    cfg = str(REPO / "configs" / "dqn_cartpole.yaml")
    common = [
        "env_backend=gymnasium",
        "mode=sync",
        "num_actors=0",
        "num_envs=4",
        "rollout_len=32",
        "dqn.learning_starts=256",
        "dqn.buffer_size=2048",
        "log_every=1",
        "eval.episodes=0",
        "target_return=null",
        "checkpoint.replay=false",
    ]
    first = tianjax.train(
        cfg,
        [*common, "total_env_steps=1024"],
        run_dir=str(tmp_path / "r"),
        progress=False,
        verbose=False,
    )
    v1 = first.summary["updates"]
    # 4 gradient steps per rollout of 128 samples, from the rollout that reaches 256 on
    assert v1 == (1024 - 256 + 128) // 128 * 4
    second = tianjax.train(
        cfg,
        [*common, "total_env_steps=2048", f"resume={first.run_dir}"],
        progress=False,
        verbose=False,
    )
    after = [r for r in _records(first.run_dir) if r["env_steps"] > 1024]
    # the buffer came back empty: the first 128 new samples are only collected, then it learns
    assert [r["updates"] for r in after[:3]] == [v1, v1 + 4, v1 + 8]
    assert after[0]["loss"] == 0.0 and after[1]["loss"] > 0.0
    assert second.summary["updates"] == v1 + (1024 - 256 + 128) // 128 * 4


def _saved_learner(run_dir) -> dict:
    """The newest checkpoint's learner state, as saved (nested dicts of arrays)."""
    _, tree, _ = ckpt.restore_latest(run_dir)
    return tree["learner"]


def test_the_learning_rate_goes_on_from_the_fresh_steps_learned_across_a_resume(tmp_path):
    # 64 env steps per update, K = 2 epochs x 2 minibatches: gradient step j of the update
    # that starts at F fresh steps runs at lr0 * (1 - (F + 64 j / K) / total_env_steps), and the
    # update leaves the last one's in the optimizer state
    common = [
        "num_envs=4",
        "rollout_len=16",
        "ppo.num_epochs=2",
        "ppo.num_minibatches=2",
        "log_every=1",
        "eval.episodes=0",
        "target_return=null",
    ]
    n, K, t1, t2 = 64, 4, 4 * 64, 10 * 64
    lr0 = tianjax.load_config(GYM_CFG).ppo.lr
    first = tianjax.train(
        GYM_CFG,
        [*common, f"total_env_steps={t1}"],
        run_dir=str(tmp_path / "r"),
        progress=False,
        verbose=False,
    )
    saved = _saved_learner(first.run_dir)
    assert int(saved["fresh_steps"]) == t1
    assert float(saved["opt_state"]["hyperparams"]["learning_rate"]) == pytest.approx(
        lr0 * n / K / t1, rel=1e-5
    )

    tianjax.train(
        GYM_CFG,
        [*common, f"total_env_steps={t2}", f"resume={first.run_dir}"],
        progress=False,
        verbose=False,
    )
    recs = _records(first.run_dir)
    assert [r["updates"] for r in recs] == list(range(1, 11))
    for r in recs:  # "lr" is read back from the optimizer state after each update
        start = (r["updates"] - 1) * n
        total = t1 if r["updates"] <= 4 else t2
        assert r["lr"] == pytest.approx(lr0 * (1 - (start + n * (K - 1) / K) / total), rel=1e-5), r
    # the first update after the resume goes on from 256 fresh steps of 640, neither from 0 (a
    # restarted schedule) nor past the end of the first run's (the old budget)
    assert recs[4]["lr"] == pytest.approx(lr0 * (1 - (4.75 * n) / t2), rel=1e-5)
    saved = _saved_learner(first.run_dir)
    assert int(saved["fresh_steps"]) == t2
    assert float(saved["opt_state"]["hyperparams"]["learning_rate"]) == pytest.approx(
        lr0 * n / K / t2, rel=1e-5
    )


def _learn_in_process(config, run_dir, stop_when=lambda learner: False):
    """A Learner in this process (checkpointing into run_dir) and its actors in threads; the
    run ends at its budget or once `stop_when(learner)`, checkpointing either way."""
    run_key = new_run_key()
    logger = RunLogger(config, run_dir, tensorboard=False)
    learner = Learner(config, run_key, logger)
    actors = [Actor(config, i, learner.endpoints, run_key) for i in range(config.num_actors)]
    threads = [threading.Thread(target=a.run, daemon=True) for a in actors]
    for t in threads:
        t.start()
    try:
        learner.run(lambda: stop_when(learner))
    finally:
        learner.stop_actors()
        for t in threads:
            t.join(30)
        learner.close()
        logger.close()
    return learner


def test_an_async_run_with_reuse_resumes_its_schedule_at_the_fresh_steps_learned(tmp_path):
    # reuse passes take gradient steps without moving progress: only fresh batches count,
    # before and after each resume
    def config(total, *extra):
        return tianjax.load_config(
            ASYNC_CFG,
            [
                "num_actors=1",
                "num_envs=4",
                "rollout_len=16",
                "ppo.num_epochs=2",
                "ppo.num_minibatches=2",
                "runtime.max_reuse=4",
                "staleness.max_staleness=null",
                "runtime.heartbeat_timeout_s=60",
                "target_return=null",
                f"total_env_steps={total}",
                *extra,
            ],
        )

    n, K, t1, t2 = 64, 4, 6 * 64, 12 * 64
    run_dir = str(tmp_path / "r")
    first = _learn_in_process(config(t1), run_dir)
    lr0 = first.config.ppo.lr
    assert first.fresh_updates == 6 and int(first.state.fresh_steps) == t1
    assert float(learning_rate(first.state.opt_state)) == pytest.approx(lr0 * n / K / t1, rel=1e-4)
    # resumed with a larger budget and stopped after its first update, which is fresh (a
    # session has nothing to reuse before it): that batch's last gradient step runs at
    # 6 3/4 batches of 12, neither from 0 (a restarted schedule) nor past the old budget's end
    second = _learn_in_process(
        config(t2, f"resume={run_dir}"),
        run_dir,
        stop_when=lambda learner: learner.fresh_updates > 6,
    )
    assert second.resumed_from == int(first.state.version)
    assert int(second.state.version) == int(first.state.version) + 1
    assert int(second.state.fresh_steps) == t1 + n
    expected = lr0 * (1 - (t1 + n * (K - 1) / K) / t2)
    assert float(learning_rate(second.state.opt_state)) == pytest.approx(expected, rel=1e-4)
    # and on to the end: the last gradient step of the last fresh batch, at 1 - 1 / (12 K)
    third = _learn_in_process(config(t2, f"resume={run_dir}"), run_dir)
    assert third.fresh_updates == 12 and int(third.state.fresh_steps) == t2
    # every update: 12 fresh batches, the rest reuse passes (counted on across the resumes)
    assert int(third.state.version) == 12 + third.measures.reused_batches
    assert float(learning_rate(third.state.opt_state)) == pytest.approx(lr0 * n / K / t2, rel=1e-4)


def test_records_after_the_checkpoint_resumed_from_are_moved_aside(tmp_path):
    """A run that died after its newest checkpoint wrote records past it: a resume does that
    training again, so those records go to metrics.superseded.jsonl and metrics.jsonl holds
    each update once, in order."""
    import shutil

    fused = str(REPO / "configs" / "ppo_cartpole.yaml")
    common = [
        "num_envs=4",
        "rollout_len=32",
        "log_every=1",
        "checkpoint.every=8",
        "checkpoint.keep=10",
        "target_return=null",
        "compile_cache=null",
    ]
    first = tianjax.train(
        fused,
        [*common, "total_env_steps=8192"],
        run_dir=str(tmp_path / "r"),
        progress=False,
        verbose=False,
    )
    root = os.path.join(first.run_dir, ckpt.CHECKPOINT_DIR)
    steps = sorted(int(d) for d in os.listdir(root) if d.isdigit())
    assert len(steps) >= 3
    for step in steps[-2:]:  # as if it had died before saving these
        shutil.rmtree(os.path.join(root, str(step)))
    kept = steps[-3]
    before = _records(first.run_dir)
    later = [r for r in before if r["updates"] > kept]
    assert later  # records past the checkpoint it will resume from

    second = tianjax.train(
        fused,
        [*common, "total_env_steps=8192", f"resume={first.run_dir}"],
        progress=False,
        verbose=False,
    )
    assert second.summary["resumed_from_step"] == kept
    records = _records(first.run_dir)
    updates = [r["updates"] for r in records if "eval_return" not in r]
    assert (
        updates == sorted(set(updates)) and updates[-1] == second.summary["updates"]
    )  # once each, in order
    # the final evaluation once: the first session's went aside with the records past the
    # checkpoint, the second session wrote its own
    assert [r["updates"] for r in records if "eval_return" in r] == [second.summary["updates"]]
    with open(os.path.join(first.run_dir, "metrics.superseded.jsonl")) as f:
        assert [json.loads(line) for line in f] == later  # nothing lost: moved whole, in order
    # and the training done again is the same training: a fused run resumed from a
    # checkpoint ends with the uninterrupted run's parameters bit for bit, and the records it
    # wrote again equal those moved aside but for the clock
    for a, b in zip(jax.tree.leaves(first.params), jax.tree.leaves(second.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    clock = ("wall_time_s", "env_steps_per_s", "samples_fresh_per_s", "eval_s")
    again = {(r["updates"], "eval_return" in r): r for r in records if r["updates"] > kept}
    for old in later:
        new = again[old["updates"], "eval_return" in old]
        same = {k for k in old if k not in clock and not k.endswith("_per_s")}
        assert {k: new.get(k) for k in same} == {k: old[k] for k in same}, old["updates"]


def test_a_fused_dqn_run_resumed_from_a_checkpoint_ends_as_the_uninterrupted_one(tmp_path):
    """Exact resume with a replay buffer: a fused DQN checkpoint holds the buffer, the
    exploration schedule's position and the keys, so training resumed from one ends with
    the parameters of the run that never stopped, bit for bit."""
    import shutil

    common = [
        "num_envs=4",
        "rollout_len=8",
        "log_every=4",
        "checkpoint.every=16",
        "checkpoint.keep=10",
        "dqn.learning_starts=256",
        "eval.episodes=0",
        "target_return=null",
        "compile_cache=null",
        "total_env_steps=4096",
    ]
    cfg = str(REPO / "configs" / "dqn_cartpole.yaml")
    first = tianjax.train(cfg, common, run_dir=str(tmp_path / "d"), progress=False, verbose=False)
    root = os.path.join(first.run_dir, ckpt.CHECKPOINT_DIR)
    steps = sorted(int(d) for d in os.listdir(root) if d.isdigit())
    assert len(steps) >= 3
    for step in steps[-2:]:
        shutil.rmtree(os.path.join(root, str(step)))
    second = tianjax.train(cfg, [*common, f"resume={first.run_dir}"], progress=False, verbose=False)
    assert second.summary["resumed_from_step"] == steps[-3]
    assert second.summary["updates"] == first.summary["updates"]
    for a, b in zip(jax.tree.leaves(first.params), jax.tree.leaves(second.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
