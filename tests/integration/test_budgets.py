"""Budgets, schedules and exploration that hold in every mode, with real actor processes.

- A run ends with `total_env_steps` env steps admitted to within one batch per actor, in
  every mode and algorithm, and the actors stop producing there (a budget that is not a
  multiple of the batch included).
- With heavy reuse, the learning rate read back from the optimizer state ends where the
  fresh-step schedule ends, not before.
- Async DQN's actors explore on one global schedule: the env-step count each trajectory
  was acted at lags the learner's by at most what is in flight.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import tianjax
from tianjax.algos.dqn import epsilon_schedule
from tianjax.config import load_config
from tianjax.learner import learning_rate
from tianjax.runtime.actor import Actor
from tianjax.runtime.learner import Learner
from tianjax.transport.auth import new_run_key

from .conftest import ASYNC_CFG, REPO

TOTAL = 10_000  # not a multiple of any batch below
PPO_FUSED = str(REPO / "configs" / "ppo_cartpole.yaml")
DQN = str(REPO / "configs" / "dqn_cartpole.yaml")
HOST = str(REPO / "configs" / "ppo_cartpole_envpool.yaml")
SMALL_DQN = ["num_envs=4", "rollout_len=16", "dqn.learning_starts=1000", "dqn.buffer_size=5000",
             "dqn.batch_size=32", "dqn.updates_per_rollout=2", "env_backend=envpool"]

CASES = {
    "fused-ppo": (PPO_FUSED, ["num_envs=4", "rollout_len=32"]),
    "fused-dqn": (DQN, ["num_envs=4", "rollout_len=16"]),
    "host-ppo": (HOST, ["num_envs=8", "rollout_len=32", "ppo.num_minibatches=2"]),
    "sync-ppo-2": (ASYNC_CFG, ["mode=sync", "num_actors=2", "num_envs=4", "rollout_len=32"]),
    "async-ppo-1": (ASYNC_CFG, ["num_actors=1", "num_envs=4", "rollout_len=32", "ppo.num_minibatches=4"]),
    "async-ppo-4": (ASYNC_CFG, ["num_actors=4", "num_envs=4", "rollout_len=32"]),
    "async-dqn-2": (DQN, ["mode=async", "num_actors=2", *SMALL_DQN]),
    "async-impala-2": (str(REPO / "configs" / "impala_cartpole.yaml"),
                       ["mode=async", "num_actors=2", "env_backend=envpool", "num_envs=4", "rollout_len=32",
                        "impala.num_minibatches=2"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_mode_ends_within_one_batch_per_actor_of_the_budget(tmp_path, case):
    path, overrides = CASES[case]
    config = load_config(path, [*overrides, f"total_env_steps={TOTAL}", "eval_episodes=0",
                                "target_return=null", "checkpoint.final=false"], run_dir=str(tmp_path / case))
    s = tianjax.train(config, progress=False, verbose=False).summary
    per_actor = config.num_envs * config.rollout_len
    slack = max(config.num_actors, 1) * per_actor
    assert TOTAL - slack <= s["env_steps"] <= TOTAL, s["env_steps"]
    if "trajectories_received" in s:  # the actors stopped producing at the budget: what
        # arrived is what was admitted, plus what was too stale to admit (given back)
        arrival_drops = s["dropped_samples"] - s["balance"]["expired_samples"]
        assert s["trajectories_received"] * per_actor == s["env_steps"] + arrival_drops, s


def _run_in_process(config):
    """A Learner in this process and its actors in threads: the learner's state stays readable."""
    run_key = new_run_key()
    learner = Learner(config, run_key)
    actors = [Actor(config, i, learner.endpoints, run_key) for i in range(config.num_actors)]
    threads = [threading.Thread(target=a.run, daemon=True) for a in actors]
    for t in threads:
        t.start()
    try:
        out = learner.run()
    finally:
        learner.stop_actors()
        for t in threads:
            t.join(30)
        learner.close()
    return learner, out


def test_reuse_heavy_async_run_ends_its_learning_rate_schedule_exactly_at_the_budget(tmp_path):
    config = load_config(ASYNC_CFG, ["num_actors=1", "num_envs=4", "rollout_len=16", "ppo.num_minibatches=2",
                                     "ppo.num_epochs=2", "total_env_steps=3000", "runtime.max_reuse=4",
                                     "staleness.max_staleness=null", "runtime.heartbeat_timeout_s=60"],
                         run_dir=str(tmp_path / "run"))
    learner, out = _run_in_process(config)
    n = config.steps_per_update
    n_updates = 3000 // n  # 46 fresh batches
    grad_steps = config.ppo.num_epochs * config.ppo.num_minibatches
    assert learner.fresh_updates == n_updates
    assert learner.balance.reused_batches > 0  # reuse passes did take gradient steps
    assert out["updates"] == n_updates + learner.balance.reused_batches
    # the last gradient step of the last fresh batch, at progress 1 - 1 / (n_updates * K):
    # with the schedule planned over update counts it would have reached 0 long before
    lr = float(learning_rate(learner.state.opt_state))
    assert lr == pytest.approx(config.ppo.lr / (n_updates * grad_steps), rel=1e-4)
    assert int(learner.state.fresh_steps) == n_updates * n


@pytest.mark.parametrize("num_actors", [1, 4])
def test_async_dqn_actors_explore_on_one_global_schedule(tmp_path, num_actors):
    config = load_config(DQN, ["mode=async", f"num_actors={num_actors}", *SMALL_DQN, "total_env_steps=16000",
                               "log_every=20", "target_return=null", "checkpoint.final=false",
                               "dqn.eps_fraction=0.5", "eval_episodes=0"],
                         run_dir=str(tmp_path / "run"))
    result = tianjax.train(config, progress=False, verbose=False)
    s, records = result.summary, [r for r in result.metrics if "epsilon" in r]
    assert len(records) >= 10
    eps = epsilon_schedule(config.dqn.eps_start, config.dqn.eps_end, 0.5 * config.total_env_steps)
    per_traj = config.num_envs * config.rollout_len
    # in flight: every actor's credits, one held back and one being acted, and as much again
    # for delivery (the learner admits what has queued before it publishes, and under load
    # an actor hears of the new count a rollout late). Actors on their own clocks (the old
    # behaviour) lag by (N - 1) / N of the count, a restarted one by all of it.
    lag_bound = 2 * num_actors * (config.runtime.credits_per_actor + 2) * per_traj
    assert lag_bound < 0.3 * config.total_env_steps
    # (the first record is left out of the lag bound: an actor's first rollout includes its
    # compilation, during which the others go on producing)
    for i, r in enumerate(records):
        assert i == 0 or r["actor_steps_lag_max"] <= lag_bound, r
        assert r["epsilon"] == pytest.approx(float(eps(r["actor_env_steps"])), abs=1e-6)
        # the epsilon the actors used is the one schedule's at the global count, within the lag
        slope = (config.dqn.eps_start - config.dqn.eps_end) / (0.5 * config.total_env_steps)
        assert abs(r["epsilon"] - float(eps(r["env_steps"]))) <= slope * lag_bound + 1e-6, r
    assert records[-1]["epsilon"] == pytest.approx(config.dqn.eps_end)
    assert abs(s["replay_ratio"] / s["replay_ratio_target"] - 1) <= 0.1, s


@pytest.mark.slow
def test_a_replacement_actor_resumes_the_global_exploration_schedule(tmp_path, procs):
    import signal

    from .conftest import actor_processes, read_summary, records, wait_for

    run_dir = tmp_path / "run"
    overrides = ["mode=async", "num_actors=2", *SMALL_DQN, "total_env_steps=40000", "log_every=20",
                 "target_return=null", "eval_episodes=0", "dqn.eps_fraction=0.8"]
    launcher = procs.start(["-m", "tianjax.cli", "train", DQN, f"run_dir={run_dir}", *overrides, "--no-progress"],
                           name="launcher")
    actors = wait_for(lambda: len(actor_processes(launcher.pid)) == 2 and actor_processes(launcher.pid),
                      120, what="2 actors")
    wait_for(lambda: any(r.get("env_steps", 0) >= 12000 for r in records(run_dir)) or launcher.poll() is not None,
             180, what="12k env steps")
    assert launcher.poll() is None, procs.stderr(launcher)
    killed_at = max(r["env_steps"] for r in records(run_dir))
    actors[0].send_signal(signal.SIGKILL)
    assert procs.wait(launcher, 240) == 0, procs.stderr(launcher)
    s = read_summary(run_dir)
    assert s["actor_restarts"] == 1, s
    per_traj = 4 * 16
    # as in the test above for 2 actors, and as much again: while the replacement takes its
    # first parameters and acts, the other actor goes on alone
    lag_bound = 4 * 2 * (2 + 2) * per_traj
    assert lag_bound < killed_at / 4
    after = [r for r in records(run_dir) if r["env_steps"] > killed_at]
    assert len(after) >= 5
    # a replacement acting on its own clock would act at 0 with epsilon 1: a lag of the
    # whole count (over 12k steps), and an epsilon far above the schedule's
    for r in after:
        assert r["actor_steps_lag_max"] <= lag_bound, r
