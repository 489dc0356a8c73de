"""What the built-in algorithms share: the check of a replay section against the run."""

from __future__ import annotations

from tianjax.config import Config
from tianjax.config.checks import _check


def check_replay(config: Config) -> None:
    """The replay section (`config.replay_config`, named after `config.algo`) against the
    run: the buffer holds one rollout, and in mode sync with actors every round of
    trajectories owes the learner a gradient step that starts in the first round."""
    rc, key = config.replay_config, config.algo
    sequences = rc.items == "sequences"
    items = config.num_envs * (1 if sequences else config.rollout_len)
    _check(rc.buffer_size >= items, f"{key}.buffer_size",
           f"must hold at least one rollout ({items} {rc.items}), got {rc.buffer_size}")
    if config.mode == "sync" and config.num_actors >= 1:
        # a sync actor waits for the version after the one it acted with: every round of
        # trajectories (one per actor) must owe the learner a gradient step
        per_round = config.num_actors * config.num_envs * config.rollout_len
        batch = rc.batch_size * (config.rollout_len if sequences else 1)
        _check(config.replay_ratio * per_round >= batch, "runtime.replay_ratio",
               f"mode sync: a round of trajectories ({per_round} env steps) must owe a gradient "
               f"step of {batch} samples, got a replay ratio of {config.replay_ratio:g}")
        latest = int(per_round - batch / config.replay_ratio)
        _check(rc.learning_starts <= latest, f"{key}.learning_starts",
               f"mode sync with actors: learning must start in the first round of trajectories "
               f"(sync actors wait for the next version), so at most {latest}, got {rc.learning_starts}")
