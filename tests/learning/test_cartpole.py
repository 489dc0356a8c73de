"""Learning tests on CartPole: each trains a shipped config to its target (slow: minutes on
2 CPU cores). Fused PPO through the README's command, DQN (plain and frame-once replay),
IMPALA, and PPO on envpool in one process."""

import json
import os
import subprocess
import sys
import time

import pytest

import tianjax
from tests.core.test_fused import SUMMARY_KEYS
from tests.runtime.runners.test_host_training import ENVPOOL_CFG, IN_PROCESS


@pytest.mark.slow
def test_readme_train_command_reaches_500_on_cartpole(tmp_path):
    """The README's main job: the default config, through the CLI, learns CartPole."""
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tianjax.cli",
            "train",
            "configs/ppo_cartpole.yaml",
            f"run_dir={run_dir}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, CI="1"),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "tianjax run summary" in proc.stdout and "target 475 reached" in proc.stdout
    summary = json.load(open(run_dir / "summary.json"))
    assert SUMMARY_KEYS <= set(summary)
    assert summary["final_return"] >= 475
    assert summary["convergence_env_steps"] <= 500_000
    assert summary["eval_return"] >= 475


@pytest.mark.slow
def test_dqn_learns_cartpole(tmp_path):
    import tianjax

    t0 = time.perf_counter()
    result = tianjax.train(
        "configs/dqn_cartpole.yaml",
        ["eval.episodes=0"],
        verbose=False,
        progress=False,
        run_dir=str(tmp_path / "run"),
    )
    wall = time.perf_counter() - t0
    s = result.summary
    print(
        f"dqn cartpole: final_return {s['final_return']:.1f} in {wall:.1f}s "
        f"(compile {s['compile_time_s']:.1f}s)"
    )
    assert s["skipped_updates"] == 0
    assert s["final_return"] >= 400, s


@pytest.mark.slow
def test_fused_dqn_frame_once_learns_cartpole(tmp_path):
    """configs/dqn_cartpole.yaml with dqn.frame_once=true reaches what the default does
    (test_dqn_learns_cartpole above: final return >= 400 of the 475 target)."""
    import tianjax

    t0 = time.perf_counter()
    result = tianjax.train(
        "configs/dqn_cartpole.yaml",
        ["eval.episodes=0", "dqn.frame_once=true"],
        verbose=False,
        progress=False,
        run_dir=str(tmp_path / "run"),
    )
    wall = time.perf_counter() - t0
    s = result.summary
    print(
        f"dqn cartpole frame_once: final_return {s['final_return']:.1f} in {wall:.1f}s "
        f"(compile {s['compile_time_s']:.1f}s)"
    )
    assert s["skipped_updates"] == 0
    assert s["final_return"] >= 400, s


@pytest.mark.slow
def test_fused_impala_solves_cartpole(tmp_path):
    t0 = time.perf_counter()
    result = tianjax.train(
        "configs/impala_cartpole.yaml",
        ["eval.episodes=0"],
        verbose=False,
        progress=False,
        run_dir=str(tmp_path / "impala"),
    )
    elapsed = time.perf_counter() - t0
    s = result.summary
    assert s["skipped_updates"] == 0
    assert s["final_return"] >= 475, (s["final_return"], elapsed)


@pytest.mark.slow
def test_ppo_learns_cartpole_on_envpool(tmp_path):
    res = tianjax.train(
        ENVPOOL_CFG, [IN_PROCESS], verbose=False, progress=False, run_dir=str(tmp_path / "r")
    )
    s = res.summary
    assert s["final_return"] >= 475, s
    assert s["convergence_time_s"] is not None and s["skipped_updates"] == 0
    assert os.path.exists(tmp_path / "r" / "summary.json")
