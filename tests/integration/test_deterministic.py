"""The deterministic-lag mode (runtime.deterministic), with real actor processes: the final
parameters are a function of the config alone, the same whether the env shards run in one
actor process or two, and the same run after run; every sample is learned from exactly k
updates after the version it was acted with (once past the first k updates)."""

from __future__ import annotations

import hashlib

import jax
import numpy as np
import pytest

import tianjax

from .conftest import ASYNC_CFG

K = 2
SHARDS = 2
SMALL = [
    "env_backend=gymnax",
    "runtime.deterministic=true",
    f"runtime.deterministic_lag={K}",
    f"runtime.batch_trajectories={SHARDS}",
    "num_envs=4",
    "rollout_len=16",
    "ppo.num_minibatches=2",
    "total_env_steps=1280",  # 10 updates of 2 shards x 4 envs x 16 steps
    "eval.episodes=0",
    "target_return=null",
    "loggers=[]",
]


def _hash(params) -> str:
    leaves = jax.tree.leaves(params)
    return hashlib.sha256(b"".join(np.asarray(x).tobytes() for x in leaves)).hexdigest()


@pytest.mark.slow
def test_same_parameters_with_one_or_two_actor_processes_and_across_runs(tmp_path):
    runs = []
    for i, actors in enumerate((1, 2, 2)):
        out = tianjax.train(
            ASYNC_CFG,
            [*SMALL, f"num_actors={actors}"],
            run_dir=str(tmp_path / f"run{i}"),
            progress=False,
            verbose=False,
        )
        runs.append(out)
    per_update = SHARDS * 4 * 16
    for out in runs:
        s = out.summary
        assert s["updates"] == 10 and s["env_steps"] == 10 * per_update
        assert s["dropped_samples"] == 0 and s["dropped_order_by_reason"] == {}
        # update u learns from rollout u, acted with version max(0, u - K): tau = min(u, K)
        assert s["staleness_histogram"] == {
            **{str(t): per_update for t in range(K)},
            str(K): (10 - K) * per_update,
        }
    hashes = [_hash(out.params) for out in runs]
    assert hashes[0] == hashes[1] == hashes[2], hashes
