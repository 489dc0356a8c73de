"""The `impala` section of a config: IMPALA's hyperparameters (tianjax.algos.impala.loss)."""

from __future__ import annotations

from dataclasses import dataclass

from tianjax.config import check_key


@dataclass(frozen=True)
class IMPALAConfig:
    lr: float = 6e-4
    anneal_lr: bool = True
    num_minibatches: int = 1  # split of the [T, B] batch along B per update
    gamma: float = 0.99
    rho_bar: float = 1.0  # V-trace truncation of the importance ratio in the targets
    c_bar: float = 1.0  # V-trace truncation of the trace coefficients
    pg_rho_bar: float = 1.0  # truncation of the ratio in the policy-gradient advantage
    vf_coef: float = 0.5
    ent_coef: float = 0.01
    max_grad_norm: float = 40.0

    def __post_init__(self):
        check_key(self.lr > 0, "impala.lr", f"must be > 0, got {self.lr}")
        check_key(
            self.num_minibatches >= 1,
            "impala.num_minibatches",
            f"must be >= 1, got {self.num_minibatches}",
        )
        check_key(0 < self.gamma <= 1, "impala.gamma", f"must be in (0, 1], got {self.gamma}")
        for k in ("rho_bar", "c_bar", "pg_rho_bar"):
            check_key(getattr(self, k) > 0, f"impala.{k}", f"must be > 0, got {getattr(self, k)}")


__all__ = ["IMPALAConfig"]
