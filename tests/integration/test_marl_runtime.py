"""Multi-agent runs with actor processes: IPPO trajectories [T, B, N] with structured
observations cross real sockets from 2 actor processes to the learner."""

import json

import numpy as np
import pytest

import tianjax

from .conftest import REPO

CFG = str(REPO / "configs" / "ippo_mpe_spread_async.yaml")


@pytest.mark.parametrize("mode", ["async"])
def test_ippo_with_two_actor_processes(tmp_path, mode):
    run = tmp_path / mode
    # 3 updates of 2 trajectories (8 envs x 128 steps each)
    result = tianjax.train(
        CFG,
        [f"mode={mode}", "total_env_steps=6144", "log_every=1", "compile_cache=null"],
        run_dir=str(run),
        progress=False,
        verbose=False,
    )
    s = result.summary
    assert s["env_steps"] == 6144 and s["updates"] == 3 and s["skipped_updates"] == 0
    assert s["rejected_messages"] == 0 and s["actor_restarts"] == 0
    assert s["episodes"] > 0 and np.isfinite(s["final_return"])
    assert "final_win_rate" not in s  # MPE reports no wins
    records = [json.loads(line) for line in open(run / "metrics.jsonl")]
    assert any(np.isfinite(r.get("loss", np.nan)) for r in records)
