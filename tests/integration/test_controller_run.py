"""The balance controller in a real async run (learner and two actor processes over ZeroMQ):
asked for fresher samples than its bounds give, it moves its actions and the consumed
staleness falls below that of the same run with `balance.mode: fixed`; every move is in
the summary."""

from __future__ import annotations

import pytest

import tianjax

from .conftest import ASYNC_CFG

# bounds that make samples stale: 4 credits per actor, a publication every 4 updates
LOOSE = [
    "runtime.credits_per_actor=4",
    "runtime.publish_every=4",
    "runtime.max_reuse=2",
    "total_env_steps=120000",
    "target_return=null",
    "balance.period_s=0.25",
    "balance.target_staleness=0.5",
    "staleness.max_staleness=null",
]


@pytest.mark.slow
def test_adaptive_controller_brings_staleness_down_where_fixed_does_not(tmp_path):
    runs = {
        mode: tianjax.train(
            ASYNC_CFG,
            [*LOOSE, f"balance.mode={mode}"],
            run_dir=str(tmp_path / mode),
            progress=False,
            verbose=False,
        ).summary
        for mode in ("fixed", "adaptive")
    }
    fixed, adaptive = runs["fixed"]["balance"], runs["adaptive"]["balance"]
    assert fixed["balance_moves"] == 0 and fixed["balance_publish_every"] == 4
    assert fixed["balance_window"] == 8
    assert adaptive["balance_moves"] > 0
    assert adaptive["balance_publish_every"] < 4
    assert adaptive["balance_target_staleness"] == 0.5
    assert runs["adaptive"]["staleness_mean"] < runs["fixed"]["staleness_mean"], runs
    # the budget holds whatever the controller did
    for s in runs.values():
        assert s["updates"] - s["balance"]["reused_batches"] == 120000 // (2 * 16 * 32)
