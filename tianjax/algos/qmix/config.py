"""The `qmix` section of a config: QMIX's hyperparameters (tianjax.algos.qmix.loss)."""

from __future__ import annotations

from dataclasses import dataclass

from tianjax.config import ReplaySection, check_key


@dataclass(frozen=True)
class QMIXConfig(ReplaySection):
    """QMIX: recurrent agents, a monotonic mixer, replay of [rollout_len] sequences."""

    lr: float = 5e-4
    gamma: float = 0.99
    td_lambda: float = 0.0  # lambda of the targets' TD(lambda) within a sequence (0: one-step)
    buffer_size: int = 5_000  # sequences (one per env per rollout) kept in the replay buffer
    batch_size: int = 32  # sequences per gradient step
    learning_starts: int = 10_000  # env steps before the first update
    updates_per_rollout: int = 1  # gradient steps after each [T, B] rollout
    burn_in: int = 0  # first steps of a sequence that only warm the hidden state (R2D2)
    target_update_every: int = 200  # updates between target-network syncs
    target_tau: float = 1.0  # 1.0 = hard copy, < 1 = Polyak averaging
    hidden_dim: int = 64  # GRU width of the agent network
    mixer_embed: int = 32  # mixing-network width
    hyper_hidden: int = 64  # hypernetwork hidden width
    eps_start: float = 1.0
    eps_end: float = 0.05
    eps_fraction: float = 0.1  # fraction of total_env_steps over which epsilon decays
    max_grad_norm: float = 10.0

    def __post_init__(self):
        check_key(self.lr > 0, "qmix.lr", f"must be > 0, got {self.lr}")
        check_key(0 < self.gamma <= 1, "qmix.gamma", f"must be in (0, 1], got {self.gamma}")
        check_key(
            0 <= self.td_lambda <= 1, "qmix.td_lambda", f"must be in [0, 1], got {self.td_lambda}"
        )
        self._check_replay_settings("qmix")
        check_key(self.burn_in >= 0, "qmix.burn_in", "must be >= 0")
        check_key(self.target_update_every >= 1, "qmix.target_update_every", "must be >= 1")
        check_key(
            0 < self.target_tau <= 1, "qmix.target_tau", f"must be in (0, 1], got {self.target_tau}"
        )
        for k in ("hidden_dim", "mixer_embed", "hyper_hidden"):
            check_key(getattr(self, k) >= 1, f"qmix.{k}", "must be >= 1")
        check_key(
            0 <= self.eps_end <= self.eps_start <= 1,
            "qmix.eps_end",
            "needs 0 <= qmix.eps_end <= qmix.eps_start <= 1",
        )
        check_key(0 < self.eps_fraction <= 1, "qmix.eps_fraction", "must be in (0, 1]")
        check_key(self.max_grad_norm > 0, "qmix.max_grad_norm", "must be > 0")


__all__ = ["QMIXConfig"]
