"""In-flight parameters with real processes: async actors on the latency-bound CartPole
take newer versions mid-rollout (runtime.param_refresh: step). Trajectories with several
versions inside arrive; every one of them has honest per-step stamps (non-decreasing along
T, the oldest in the header, none newer than the learner: the ingress drops and counts any
other); the learned samples' staleness is per step, so some are learned at tau 0; and the
policy still reaches 475."""

from __future__ import annotations

import pytest

import tianjax
from tianjax.config import load_config

from .conftest import REPO

LATENCY_CFG = str(REPO / "configs" / "ppo_latency_async.yaml")


@pytest.mark.slow  # trains to 475: about a minute on 2 cores
def test_actors_refresh_mid_rollout_with_honest_stamps_and_still_reach_475(tmp_path):
    config = load_config(
        LATENCY_CFG,
        [
            "num_actors=8",
            "runtime.param_refresh=step",
            "stop_at_target=true",
            "total_env_steps=400000",
            "checkpoint.final=false",
            "compile_cache=null",
        ],
        run_dir=str(tmp_path / "run"),
    )
    s = tianjax.train(config, progress=False, verbose=False).summary

    assert s["dropped_bad_versions"] == 0, s["dropped_bad_versions_by_reason"]
    assert s["rejected_messages"] == 0 and s["dropped_nonfinite"] == 0
    # a rollout of 32 vector steps (~0.6 s) spans several learner updates: many of the
    # trajectories hold more than one version (without the refresh, none does)
    received = s["trajectories_received"]
    assert s["trajectories_mixed_versions"] >= received // 4, (
        s["trajectories_mixed_versions"],
        received,
    )
    # per-step staleness: steps acted after the last update was published are learned at 0
    hist = {int(k): v for k, v in s["staleness_histogram"].items()}
    assert hist.get(0, 0) > 0 and min(hist) >= 0, hist
    # learning: the 100-episode moving average reached 475 within the budget
    assert s["convergence_env_steps"] is not None and s["stopped_at_target"] is True, s
    assert s["final_return"] >= 400, s["final_return"]
