"""Budgets, schedules and exploration that hold in every mode, with real actor processes.

- A run ends with `total_env_steps` env steps admitted to within one batch per actor, in
  every mode and algorithm, and the actors stop producing there (a budget that is not a
  multiple of the batch included).
- With heavy reuse, the learning rate read back from the optimizer state ends where the
  fresh-step schedule ends, not before.
- Async DQN's actors explore on one global schedule: the epsilon each actor acted with
  (read back from its actions' behaviour probabilities) is the schedule's at the env-step
  count its trajectory reports, and that count lags the learner's by at most what is in
  flight.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tianjax
from tianjax.algos.dqn.loss import epsilon_greedy, epsilon_schedule
from tianjax.config import load_config
from tianjax.core.update import learning_rate
from tianjax.metrics import RunLogger

from .conftest import ASYNC_CFG, REPO, run_in_process

TOTAL = 10_000  # not a multiple of any batch below
PPO_FUSED = str(REPO / "configs" / "ppo_cartpole.yaml")
DQN = str(REPO / "configs" / "dqn_cartpole.yaml")
HOST = str(REPO / "configs" / "ppo_cartpole_envpool.yaml")
IMPALA = str(REPO / "configs" / "impala_cartpole.yaml")
SMALL_PPO = ["num_envs=4", "rollout_len=32"]
SMALL_DQN = [
    "num_envs=4",
    "rollout_len=16",
    "dqn.learning_starts=1000",
    "dqn.buffer_size=5000",
    "dqn.batch_size=32",
    "dqn.updates_per_rollout=2",
    "env_backend=envpool",
]
SMALL_IMPALA = ["env_backend=envpool", "num_envs=4", "rollout_len=32", "impala.num_minibatches=2"]
# one step short of 8 updates of 4 x 4 x 32 steps: the budget admits 7 updates (3584), the
# lowest count the bound allows (4095 - 4 * 128 = 3583, plus one)
EDGE = 8 * 4 * 4 * 32 - 1

# mode-algo-actors: (config, overrides); every budget is TOTAL unless the overrides say. The
# runtime's cases take 1 and 4 actors (impala 2): what 2 would add to the bound, the two ends
# already check, and each case is a run of its own in the suite's time
CASES = {
    "fused-ppo": (PPO_FUSED, SMALL_PPO),
    "fused-dqn": (DQN, ["num_envs=4", "rollout_len=16"]),
    "fused-impala": (IMPALA, ["num_envs=4", "rollout_len=32", "impala.num_minibatches=2"]),
    "host-ppo": (HOST, ["num_envs=8", "rollout_len=32", "ppo.num_minibatches=2"]),
    "sync-ppo-1": (ASYNC_CFG, ["mode=sync", "num_actors=1", *SMALL_PPO, "ppo.num_minibatches=4"]),
    "sync-ppo-4-edge": (
        ASYNC_CFG,
        ["mode=sync", "num_actors=4", *SMALL_PPO, f"total_env_steps={EDGE}"],
    ),
    "sync-impala-2": (IMPALA, ["mode=sync", "num_actors=2", *SMALL_IMPALA]),
    "async-ppo-1": (ASYNC_CFG, ["num_actors=1", *SMALL_PPO, "ppo.num_minibatches=4"]),
    "async-ppo-4": (ASYNC_CFG, ["num_actors=4", *SMALL_PPO]),
    "async-dqn-1": (DQN, ["mode=async", "num_actors=1", *SMALL_DQN]),
    "async-dqn-4": (DQN, ["mode=async", "num_actors=4", *SMALL_DQN, "total_env_steps=5000"]),
    "async-impala-2": (IMPALA, ["mode=async", "num_actors=2", *SMALL_IMPALA]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_mode_ends_within_one_batch_per_actor_of_the_budget(tmp_path, case):
    path, overrides = CASES[case]
    config = load_config(
        path,
        [
            f"total_env_steps={TOTAL}",
            *overrides,
            "eval.episodes=0",
            "target_return=null",
            "checkpoint.final=false",
        ],
        run_dir=str(tmp_path / case),
    )
    total = config.total_env_steps
    assert total % (config.batch_trajectories * config.num_envs * config.rollout_len) != 0
    s = tianjax.train(config, progress=False, verbose=False).summary
    per_actor = config.num_envs * config.rollout_len
    slack = max(config.num_actors, 1) * per_actor
    assert total - slack <= s["env_steps"] <= total, s["env_steps"]
    if "trajectories_received" in s:  # the actors stopped producing at the budget: what
        # arrived is what was admitted, plus what was too stale to admit (given back)
        arrival_drops = s["dropped_samples"] - s["balance"]["expired_samples"]
        assert s["trajectories_received"] * per_actor == s["env_steps"] + arrival_drops, s


def _run_in_process(config, logger=None, instrument=lambda actor: None):
    """A Learner in this process and its actors in threads: the learner's state stays readable.
    `instrument(actor)` is called on each actor before it runs."""
    return run_in_process(config, logger, instrument)


def test_reuse_heavy_async_run_ends_its_learning_rate_schedule_exactly_at_the_budget(tmp_path):
    config = load_config(
        ASYNC_CFG,
        [
            "num_actors=1",
            "num_envs=4",
            "rollout_len=16",
            "ppo.num_minibatches=2",
            "ppo.num_epochs=2",
            "total_env_steps=3000",
            "runtime.max_reuse=4",
            "staleness.max_staleness=null",
            "runtime.heartbeat_timeout_s=60",
        ],
        run_dir=str(tmp_path / "run"),
    )
    learner, out = _run_in_process(config)
    n = config.steps_per_update
    n_updates = 3000 // n  # 46 fresh batches
    grad_steps = config.ppo.num_epochs * config.ppo.num_minibatches
    assert learner.fresh_updates == n_updates
    assert learner.measures.reused_batches > 0  # reuse passes did take gradient steps
    assert out.updates == n_updates + learner.measures.reused_batches
    # the last gradient step of the last fresh batch, at progress 1 - 1 / (n_updates * K):
    # with the schedule planned over update counts it would have reached 0 long before
    lr = float(learning_rate(learner.state.opt_state))
    assert lr == pytest.approx(config.ppo.lr / (n_updates * grad_steps), rel=1e-4)
    assert int(learner.state.fresh_steps) == n_updates * n


def epsilon_applied(log_prob, num_actions: int) -> np.ndarray:
    """The epsilon an epsilon-greedy step was drawn with, from mu(a|s) of the action taken:
    eps / A for a non-greedy action (at most 1 / A), 1 - eps (A - 1) / A for the greedy one
    (at least 1 / A)."""
    p = np.exp(np.asarray(log_prob, np.float64))
    return np.where(
        p < 1.0 / num_actions, num_actions * p, (1.0 - p) * num_actions / (num_actions - 1)
    )


def test_epsilon_applied_is_read_back_from_the_behaviour_probability():
    q = np.array([[0.0, 1.0], [2.0, 1.0], [0.0, 1.0]], np.float32)
    for eps in (1.0, 0.6, 0.05):
        action, log_prob = epsilon_greedy(jax.random.key(3), jnp.asarray(np.repeat(q, 50, 0)), eps)
        assert np.allclose(epsilon_applied(log_prob, 2), eps, atol=1e-6)
        if eps == 0.6:  # both kinds of action were taken
            greedy = np.argmax(np.repeat(q, 50, 0), axis=-1)
            assert 0 < np.mean(np.asarray(action) != greedy) < 1


def _record_acting(calls: list, sends: list):
    """Records, per actor, every policy step (the env-step count it was given, and log mu of
    the actions taken) and the count each trajectory was sent with."""

    def instrument(actor):
        steps, sent = [], []
        calls.append(steps)
        sends.append(sent)
        act, send = actor.source._act, actor._send

        def act_and_record(params, obs, key, env_steps):
            key, (action, log_prob, value) = act(params, obs, key, env_steps)
            steps.append((int(env_steps), np.asarray(log_prob)))
            return key, (action, log_prob, value)

        def send_and_record(rollout, acted_at, body):
            sent.append(int(acted_at))
            return send(rollout, acted_at, body)

        actor.source._act, actor._send = act_and_record, send_and_record

    return instrument


@pytest.mark.parametrize("num_actors", [1, 4])
def test_async_dqn_actors_explore_on_one_global_schedule(tmp_path, num_actors):
    config = load_config(
        DQN,
        [
            "mode=async",
            f"num_actors={num_actors}",
            *SMALL_DQN,
            "total_env_steps=16000",
            "log_every=20",
            "target_return=null",
            "checkpoint.final=false",
            "dqn.eps_fraction=0.5",
            "eval.episodes=0",
            "runtime.heartbeat_timeout_s=60",
        ],
        run_dir=str(tmp_path / "run"),
    )
    logger = RunLogger(config, tensorboard=False)
    calls, sends = [], []
    learner, out = _run_in_process(config, logger, _record_acting(calls, sends))
    records = [r for r in logger.read_records() if "epsilon" in r]
    logger.close()
    assert len(records) >= 10
    eps = epsilon_schedule(config.dqn.eps_start, config.dqn.eps_end, 0.5 * config.total_env_steps)
    T, B = config.rollout_len, config.num_envs
    per_traj = B * T
    # the epsilon each actor acted with, read back from its actions' behaviour probabilities
    # (not from the count it reports): the one schedule's at the count its trajectory was sent
    # with, step by step. An actor on its own clock (the old behaviour) reports a count it did
    # not act at, or acts at 1 / N of the global count.
    applied = {}  # sent count -> epsilon at the first step of that trajectory
    for steps, sent in zip(calls, sends):
        assert len(sent) >= 2 and len(steps) >= len(sent) * T
        for k, acted_at in enumerate(sent):
            for t in range(T):
                env_steps, log_prob = steps[k * T + t]
                assert env_steps == acted_at + t * B, (k, t)
                assert np.allclose(
                    epsilon_applied(log_prob, 2), float(eps(acted_at + t * B)), atol=1e-5
                ), (k, t)
            applied[acted_at] = float(epsilon_applied(steps[k * T][1], 2)[0])
    # in flight: every actor's credits, one held back and one being acted, and as much again
    # for delivery (the learner admits what has queued before it publishes, and under load
    # an actor hears of the new count a rollout late). Actors on their own clocks lag by
    # (N - 1) / N of the count, a restarted one by all of it.
    lag_bound = 2 * num_actors * (config.runtime.credits_per_actor + 2) * per_traj
    assert lag_bound < 0.3 * config.total_env_steps
    slope = (config.dqn.eps_start - config.dqn.eps_end) / (0.5 * config.total_env_steps)
    # (the first record is left out of the lag bound: an actor's first rollout includes its
    # compilation, during which the others go on producing)
    for i, r in enumerate(records):
        assert i == 0 or r["actor_steps_lag_max"] <= lag_bound, r
        # the epsilon logged is one an actor acted with ...
        assert r["epsilon"] == pytest.approx(applied[r["actor_env_steps"]], abs=1e-5), r
        # ... and the one schedule's at the global count, within the lag
        assert abs(r["epsilon"] - float(eps(r["env_steps"]))) <= slope * lag_bound + 1e-6, r
    assert records[-1]["epsilon"] == pytest.approx(config.dqn.eps_end)
    s = out.extra_summary
    assert abs(s["replay_ratio"] / s["replay_ratio_target"] - 1) <= 0.1, s


@pytest.mark.slow
def test_a_replacement_actor_resumes_the_global_exploration_schedule(tmp_path, procs):
    import signal

    from .conftest import actor_processes, read_summary, records, wait_for

    run_dir = tmp_path / "run"
    overrides = [
        "mode=async",
        "num_actors=2",
        *SMALL_DQN,
        "total_env_steps=40000",
        "log_every=20",
        "target_return=null",
        "eval.episodes=0",
        "dqn.eps_fraction=0.8",
    ]
    launcher = procs.start(
        ["-m", "tianjax.cli", "train", DQN, f"run_dir={run_dir}", *overrides, "--no-progress"],
        name="launcher",
    )
    actors = wait_for(
        lambda: len(actor_processes(launcher.pid)) == 2 and actor_processes(launcher.pid),
        120,
        what="2 actors",
    )
    wait_for(
        lambda: (
            any(r.get("env_steps", 0) >= 12000 for r in records(run_dir))
            or launcher.poll() is not None
        ),
        180,
        what="12k env steps",
    )
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


def test_async_dqn_with_frame_once_replay_stores_each_frame_once_and_holds_its_budget(tmp_path):
    from tianjax.core.replay import frames as frame_replay

    config = load_config(
        DQN,
        [
            "mode=async",
            "num_actors=2",
            *SMALL_DQN,
            "total_env_steps=6000",
            "dqn.frame_once=true",
            "target_return=null",
            "checkpoint.final=false",
            "eval.episodes=0",
            "log_every=10",
            "runtime.heartbeat_timeout_s=60",
            "env_options={max_episode_steps: 30}",
        ],  # truncations inside chunks
        run_dir=str(tmp_path / "run"),
    )
    logger = RunLogger(config, tensorboard=False)
    learner, out = _run_in_process(config, logger)
    records = logger.read_records()
    logger.close()
    assert isinstance(learner.replay.rb, frame_replay.FrameReplayState)
    T, B = config.rollout_len, config.num_envs
    assert learner.replay.rb.frames.shape[1:3] == (T + 1, B)  # T + 1 frames per env column, not 2 T
    assert abs(out.env_steps - config.total_env_steps) <= 2 * T * B
    s = out.extra_summary
    assert abs(s["replay_ratio"] / s["replay_ratio_target"] - 1) <= 0.1, s
    # a time limit of 30 falls inside the 16-step chunks: those samples are masked out
    masks = [r["mask_mean"] for r in records if "mask_mean" in r]
    assert masks and 0.9 < min(masks) < 1.0


def test_a_trajectory_lost_on_the_way_has_its_slot_handed_back(tmp_path):
    # actor 0's third trajectory never reaches the learner (a broken connection drops what
    # it had queued): the actor counts it as sent and says so in its heartbeats. Its slot
    # comes back once the actor has stopped, out of slots, for the grace of 10 heartbeat
    # periods, and the run still spends its budget, with the loss counted.
    config = load_config(
        ASYNC_CFG,
        [
            "num_actors=2",
            *SMALL_PPO,
            "total_env_steps=6000",
            "runtime.heartbeat_s=0.2",
            "balance.mode=fixed",
            "runtime.credits_per_actor=1",
        ],
        run_dir=str(tmp_path / "run"),
    )

    def lose_third(actor):
        if actor.actor_id != 0:
            return
        send, calls = actor.traj_out.send, []

        def lossy(tree, version, timeout_ms=1000, body=None):
            calls.append(version)
            return True if len(calls) == 3 else send(tree, version, timeout_ms, body)

        actor.traj_out.send = lossy

    learner, out = _run_in_process(config, instrument=lose_third)
    s = {**out._asdict(), **out.extra_summary}
    per = config.num_envs * config.rollout_len
    batch = config.batch_trajectories * per
    assert s["trajectories_written_off"] == 1, s
    assert s["env_steps"] == 6000 // batch * batch
    # what came is what was admitted: the lost one never arrived
    assert (
        s["trajectories_received"] * per
        == s["env_steps"] + s["dropped_samples"] - s["balance"]["expired_samples"]
    )
