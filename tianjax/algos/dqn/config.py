"""The `dqn` section of a config: DQN's hyperparameters (tianjax.algos.dqn.loss)."""

from __future__ import annotations

from dataclasses import dataclass

from tianjax.config import ReplaySection, check_key


@dataclass(frozen=True)
class DQNConfig(ReplaySection):
    lr: float = 2.5e-4
    gamma: float = 0.99
    buffer_size: int = 50_000  # transitions kept in the replay buffer
    batch_size: int = 128
    learning_starts: int = 1_000  # env steps before the first update
    updates_per_rollout: int = 4  # gradient steps after each [T, B] rollout
    target_update_every: int = 50  # updates between target-network syncs
    target_tau: float = 1.0  # 1.0 = hard copy, < 1 = Polyak averaging
    double_q: bool = True
    huber_delta: float = 10.0  # 1.0 let Q diverge on CartPole (returns ~100 per episode)
    eps_start: float = 1.0
    eps_end: float = 0.05
    eps_fraction: float = 0.3  # fraction of total_env_steps over which epsilon decays
    max_grad_norm: float = 10.0
    # replay keeps each observation frame once ([T + 1, B] frames per [T, B] rollout) instead
    # of obs and next_obs (tianjax.core.replay.frames; mode fused); a transition cut by a time
    # limit inside a rollout then has weight 0 (its final observation is not kept)
    frame_once: bool = False

    def __post_init__(self):
        check_key(self.lr > 0, "dqn.lr", f"must be > 0, got {self.lr}")
        self._check_replay_settings("dqn")
        check_key(self.target_update_every >= 1, "dqn.target_update_every", "must be >= 1")
        check_key(
            0 < self.target_tau <= 1, "dqn.target_tau", f"must be in (0, 1], got {self.target_tau}"
        )
        check_key(
            0 <= self.eps_end <= self.eps_start <= 1,
            "dqn.eps_end",
            "needs 0 <= dqn.eps_end <= dqn.eps_start <= 1",
        )
        check_key(0 < self.eps_fraction <= 1, "dqn.eps_fraction", "must be in (0, 1]")


__all__ = ["DQNConfig"]
