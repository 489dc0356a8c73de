"""Evaluation inside a fused run: every eval.every_updates updates and at the end, each a
record of the version and env steps it evaluated; training is the same bit for bit with
evaluation on or off (its key is its own); the best evaluation's params are kept as a run
directory that tianjax.evaluate reads."""

import json

import jax
import numpy as np

import tianjax
from tianjax.checkpoint import store as ckpt

BASE = ["total_env_steps=18432", "log_every=4", "loggers=[]", "compile_cache=null"]  # 36 updates


def test_fused_evaluations_are_records_of_pinned_versions_and_change_no_training(tmp_path):
    on = tianjax.train(
        "ppo_cartpole",
        [*BASE, "eval.episodes=3", "eval.every_updates=10", "eval.keep_best=true"],
        run_dir=tmp_path / "on",
        progress=False,
        verbose=False,
    )
    off = tianjax.train(
        "ppo_cartpole", [*BASE, "eval.episodes=0"], save=False, progress=False, verbose=False
    )
    # the same training: evaluation draws from a key of its own
    for a, b in zip(jax.tree.leaves(on.params), jax.tree.leaves(off.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    evals = [
        json.loads(line)
        for line in (tmp_path / "on" / "metrics.jsonl").read_text().splitlines()
        if "eval_return" in line
    ]
    # at the first record boundary (every 4 updates) at or past each multiple of 10, and
    # the final parameters
    assert [e["updates"] for e in evals] == [12, 20, 32, 36]
    assert [e["env_steps"] for e in evals] == [u * 512 for u in (12, 20, 32, 36)]
    assert all(e["eval_episodes"] == 3 and "return_mean_100" not in e for e in evals)
    assert "eval_return" not in off.metrics  # no evaluation record
    assert off.summary["eval_return"] is None and off.summary["evaluations"] == 0
    s = on.summary
    best = max(evals, key=lambda e: e["eval_return"])
    assert (s["eval_return"], s["eval_version"]) == (evals[-1]["eval_return"], 36)
    assert (s["eval_best_return"], s["eval_best_version"]) == (best["eval_return"], best["updates"])
    assert s["evaluations"] == 4
    # the best params, as a run directory of their own
    kept = tmp_path / "on" / "best"
    assert ckpt.read_meta(str(kept))["updates"] == best["updates"]
    replay = tianjax.evaluate(str(kept), episodes=3)
    assert replay.step == best["updates"]
    assert replay.returns.shape == (3,)
