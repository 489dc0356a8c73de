"""stop_at_target: a run ends once it has converged, in every runner, and says so.

A low target (a 100-episode mean of 60 on CartPole) is reached within a few thousand
updates' worth of a large budget; the run must end there: fewer env steps than the
budget, the convergence time recorded, `stopped_at_target` in summary.json, a final
checkpoint as at a budget's end. Without the key the same run spends its budget.
"""

from __future__ import annotations

import json

import pytest

import tianjax
from tianjax.config import ConfigError, load_config

from .conftest import ASYNC_CFG, REPO

FUSED = str(REPO / "configs" / "ppo_cartpole.yaml")
HOST = str(REPO / "configs" / "ppo_cartpole_gymnasium.yaml")
BUDGET = 2_000_000
LOW = ["target_return=60", f"total_env_steps={BUDGET}", "stop_at_target=true", "compile_cache=null"]

CASES = {
    "fused": (FUSED, ["num_envs=8", "rollout_len=32", "log_every=1"]),
    "host": (HOST, ["num_actors=0", "num_envs=4", "rollout_len=32", "ppo.num_minibatches=2"]),
    "async-2": (ASYNC_CFG, ["num_actors=2", "num_envs=4", "rollout_len=32"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_run_ends_where_it_converges(case, tmp_path):
    config, overrides = CASES[case]
    r = tianjax.train(
        config, [*overrides, *LOW], run_dir=str(tmp_path / "run"), verbose=False, progress=False
    )
    s = r.summary
    assert s["convergence_time_s"] is not None and s["convergence_env_steps"] is not None
    assert s["stopped_at_target"] is True and s["interrupted"] is False
    # it ended soon after converging: a small share of the budget. (Fused: one chunk later,
    # about CHUNK_SECONDS of training; the distributed learner: the updates in flight)
    assert s["convergence_env_steps"] <= s["env_steps"] < BUDGET // 4, s
    assert s["final_return"] >= 60
    with open(tmp_path / "run" / "summary.json") as f:
        assert json.load(f)["stopped_at_target"] is True
    assert any(p.name.isdigit() for p in (tmp_path / "run" / "checkpoints").iterdir())


def test_without_the_key_a_run_spends_its_budget(tmp_path):
    budget = 16_384
    r = tianjax.train(
        FUSED,
        [
            "num_envs=8",
            "rollout_len=32",
            "target_return=20",
            f"total_env_steps={budget}",
            "compile_cache=null",
        ],
        run_dir=str(tmp_path / "run"),
        verbose=False,
        progress=False,
    )
    assert r.summary["convergence_time_s"] is not None  # converged early on ...
    assert (
        r.summary["env_steps"] == budget and r.summary["stopped_at_target"] is False
    )  # ... and went on


def test_stop_at_target_needs_a_target():
    with pytest.raises(ConfigError, match="stop_at_target"):
        load_config(FUSED, ["stop_at_target=true", "target_return=null"])


def test_a_sweep_refuses_it():
    from tianjax.runtime.runners.sweep import make_points

    with pytest.raises(ConfigError, match="stop_at_target"):
        make_points(FUSED, ["stop_at_target=true", "ppo.lr=1e-3,2e-3"])
