"""Resuming runs of the distributed runtime and of the in-process host trainer.

The learner's state, version, env-step count and episode statistics come back from the
newest checkpoint and go on; metrics are appended to the same run directory.
"""

from __future__ import annotations

import json
import os

import pytest

import tianjax
from tianjax import checkpoint as ckpt

from .conftest import ASYNC_CFG, REPO

GYM_CFG = str(REPO / "configs" / "ppo_cartpole_gymnasium.yaml")


def _records(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.mark.parametrize("cfg,extra", [
    (ASYNC_CFG, ["mode=async"]),  # learner + 2 actor processes
    (GYM_CFG, []),  # the in-process host trainer
], ids=["async", "host"])
def test_resume_continues_version_and_env_steps(tmp_path, cfg, extra):
    per_update = tianjax.load_config(cfg, extra).steps_per_update
    common = [*extra, "log_every=2", "checkpoint.every=4", "eval_episodes=0", "target_return=null"]
    first = tianjax.train(cfg, [*common, f"total_env_steps={6 * per_update}"], run_dir=str(tmp_path / "r"),
                          progress=False, verbose=False)
    v1 = first.summary["updates"]
    assert v1 >= 6
    saved = ckpt.read_meta(first.run_dir)
    assert saved["updates"] == v1 and saved["env_steps"] == first.summary["env_steps"]

    second = tianjax.train(cfg, [*common, f"total_env_steps={12 * per_update}", f"resume={first.run_dir}"],
                           progress=False, verbose=False)
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
    assert ckpt.read_meta(first.run_dir)["updates"] == s["updates"]


def test_eval_plays_a_host_env_run(tmp_path, capsys):
    from tianjax.cli import main

    run = tianjax.train(GYM_CFG, ["total_env_steps=4096", "eval_episodes=0"], run_dir=str(tmp_path / "r"),
                        progress=False, verbose=False)
    capsys.readouterr()
    assert main(["eval", run.run_dir, "episodes=3", "greedy=false", "seed=5"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith(f"eval 3 episodes (checkpoint step {run.summary['updates']}): mean ")
    mean, lo, hi = (float(line.split(k)[1].split()[0]) for k in ("mean ", "min ", "max "))
    assert 1 <= lo <= mean <= hi <= 500  # CartPole returns: at least one step, at most 500


def test_resumed_dqn_without_its_buffer_refills_it_before_learning(tmp_path):
    cfg = str(REPO / "configs" / "dqn_cartpole.yaml")
    common = ["env_backend=gymnasium", "mode=sync", "num_actors=0", "num_envs=4", "rollout_len=32",
              "dqn.learning_starts=256", "dqn.buffer_size=2048", "log_every=1", "eval_episodes=0",
              "target_return=null", "checkpoint.replay=false"]
    first = tianjax.train(cfg, [*common, "total_env_steps=1024"], run_dir=str(tmp_path / "r"),
                          progress=False, verbose=False)
    v1 = first.summary["updates"]
    # 4 gradient steps per rollout of 128 samples, from the rollout that reaches 256 on
    assert v1 == (1024 - 256 + 128) // 128 * 4
    second = tianjax.train(cfg, [*common, "total_env_steps=2048", f"resume={first.run_dir}"],
                           progress=False, verbose=False)
    after = [r for r in _records(first.run_dir) if r["env_steps"] > 1024]
    # the buffer came back empty: the first 128 new samples are only collected, then it learns
    assert [r["updates"] for r in after[:3]] == [v1, v1 + 4, v1 + 8]
    assert after[0]["loss"] == 0.0 and after[1]["loss"] > 0.0
    assert second.summary["updates"] == v1 + (1024 - 256 + 128) // 128 * 4
