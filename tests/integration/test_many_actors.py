"""16 latency-bound actor processes on one learner (tianjax/LatencyCartPole-v1, asleep most
of the time): the budget holds, many actors take part, every trajectory an actor says it
sent arrived and was counted once, and the credits never let the actors produce past the
budget."""

from __future__ import annotations

import tianjax
from tianjax.config import load_config

from .conftest import REPO

LATENCY_CFG = str(REPO / "configs" / "ppo_latency_async.yaml")
N = 16


def test_sixteen_latency_bound_actors_keep_the_budget_credits_and_counts(tmp_path):
    config = load_config(
        LATENCY_CFG,
        [
            f"num_actors={N}",
            "num_envs=4",
            "rollout_len=16",
            "network.hidden=[16,16]",
            "ppo.num_minibatches=4",
            # fixed 4 ms plus 2% hiccups of 40 ms: the actors' arrivals interleave unevenly
            "env_options.step_ms=4",
            "env_options.sigma=0.5",
            "env_options.hiccup_p=0.02",
            "env_options.hiccup_ms=40",
            "runtime.credits_per_actor=2",
            # 3 batches of 16 trajectories x 64 steps, and a remainder no batch can take
            "total_env_steps=3500",
            "target_return=null",
            "checkpoint.final=false",
            "log_every=1",
        ],
        run_dir=str(tmp_path / "run"),
    )
    per_traj = config.num_envs * config.rollout_len
    budget = config.total_env_steps // config.steps_per_update * config.steps_per_update
    assert budget == 3 * N * per_traj and config.total_env_steps % config.steps_per_update

    s = tianjax.train(config, progress=False, verbose=False).summary

    assert s["num_actors"] == N and s["actor_restarts"] == 0
    assert s["env_steps"] == budget, s[
        "env_steps"
    ]  # no more admitted than the budget, and all of it
    # nothing lost on the way, nothing taken twice: what arrived is what was admitted plus
    # what was refused (too stale, or beyond the budget) plus what the stop left unread,
    # none written off
    arrival_drops = s["dropped_samples"] - s["balance"]["expired_samples"]
    unread = s["trajectories_unread_at_stop"]
    assert s["trajectories_received"] * per_traj == s["env_steps"] + arrival_drops + (
        unread * per_traj
    ), s
    assert s["trajectories_written_off"] == 0 and s["rejected_messages"] == 0
    # the credits stop the actors at the budget: at most one window beyond it in flight
    assert s["trajectories_received"] <= budget // per_traj + N * config.runtime.credits_per_actor
    by_actor = s["trajectories_by_actor"]
    assert set(by_actor) <= {str(a) for a in range(N)}, by_actor
    received = [c["received"] for c in by_actor.values()]
    # async waits for no one: an actor that finishes starting up after the others have spent
    # the budget sends nothing, so many of them must take part, not all
    assert sum(r >= 1 for r in received) >= N // 2, by_actor
    # per-actor counts add up: none counted twice
    unread_by_actor = [c.get("unread_at_stop", 0) for c in by_actor.values()]
    assert sum(received) + sum(unread_by_actor) == s["trajectories_received"], by_actor
    for a, c in by_actor.items():
        # a heartbeat's count may be a beat old, never ahead of what arrived
        assert c.get("sent", 0) <= c["received"] + c.get("unread_at_stop", 0), (a, c)
        assert c.get("env_steps", 0) <= c["received"] * per_traj, (a, c)
