"""The `maddpg` section of a config: MADDPG's hyperparameters (tianjax.algos.maddpg.loss)."""

from __future__ import annotations

from dataclasses import dataclass

from tianjax.config import ReplaySection, check_key


@dataclass(frozen=True)
class MADDPGConfig(ReplaySection):
    """MADDPG: deterministic per-agent actors, centralised critics, replay of transitions."""

    lr: float = 1e-3  # Adam, actors and critics
    gamma: float = 0.95
    target_tau: float = 0.01  # Polyak step of the target networks after every update
    noise_std: float = 0.1  # Gaussian exploration noise on the actions (action units)
    buffer_size: int = 100_000  # transitions kept in the replay buffer
    batch_size: int = 1024  # transitions per gradient step
    learning_starts: int = 10_000  # env steps before the first update
    updates_per_rollout: int = 4  # gradient steps after each [T, B] rollout
    max_grad_norm: float = 0.5

    def __post_init__(self):
        check_key(self.lr > 0, "maddpg.lr", f"must be > 0, got {self.lr}")
        check_key(0 < self.gamma <= 1, "maddpg.gamma", f"must be in (0, 1], got {self.gamma}")
        check_key(
            0 < self.target_tau <= 1,
            "maddpg.target_tau",
            f"must be in (0, 1], got {self.target_tau}",
        )
        check_key(self.noise_std >= 0, "maddpg.noise_std", "must be >= 0")
        self._check_replay_settings("maddpg")
        check_key(self.max_grad_norm > 0, "maddpg.max_grad_norm", "must be > 0")


__all__ = ["MADDPGConfig"]
