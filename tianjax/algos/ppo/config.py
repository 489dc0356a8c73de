"""The `ppo` section of a config: PPO's hyperparameters (tianjax.algos.ppo.loss)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tianjax.config import check_key


@dataclass(frozen=True)
class PPOConfig:
    lr: float = 2.5e-4
    anneal_lr: bool = True  # linear decay to 0 over the run
    num_epochs: int = 4
    num_minibatches: int = 4
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_eps: float = 0.2
    clip_value: bool = True
    vf_coef: float = 0.5
    ent_coef: float = 0.01
    max_grad_norm: float = 0.5
    # corrected (async) batches: GAE's trace through each later step is cut by
    # min(1, pi_0/mu) of that step's action (no effect where mu = pi_0). Off, GAE is not
    # off-policy corrected: a stale trajectory's advantage values mu's later actions, a bias
    # that grows with staleness (tianjax/algos/ppo/loss.py). With every sample 16 updates
    # old, SpaceInvaders-MinAtar's learned policy kept 1.07 of its K = 0 return with it and
    # 0.55 without: experiments/studies/staleness_robustness. Off by default, on in the
    # CartPole and MinAtar configs; the async configs have not been measured with it
    truncated_traces: bool = False
    # the staleness correction where staleness.correct is true (false: textbook PPO, ratio and
    # clip against mu): decoupled (clip around pi_0, weight w(tau) min(rho_bar, pi_0/mu);
    # AReaL's with schedule constant), a3po (proximal interpolated between mu and pi_theta by
    # version), m2po (ratio against mu, no clip, second-moment mask); formulas in
    # tianjax/algos/ppo/loss.py
    correction: Literal["decoupled", "a3po", "m2po"] = "decoupled"
    m2_threshold: float = 0.04  # m2po: the most mean (log pi_theta/mu)^2 the kept samples may have
    # corrected batches: a sample whose pi_0 has already moved past the clip range from mu
    # in the direction of its advantage gets weight 0 (the textbook clip at the first step);
    # correction decoupled only; null: on for decoupled. With every sample 16 updates old it
    # kept 1.02 of Pendulum's K = 0 return where decoupled PPO without it fell below a random
    # policy, and 1.00 of Breakout-MinAtar's (0.47 without); it costs SpaceInvaders-MinAtar
    # (0.14 against 0.39): experiments/studies/staleness_robustness. No effect where mu = pi_0
    behaviour_clip: bool | None = None
    # the behaviour clip's range: it cuts where pi_0/mu is beyond 1 +- this (null: clip_eps).
    # Wider keeps more of what the learner has already acted on: at 0.5 with every sample 16
    # updates old SpaceInvaders-MinAtar kept 0.41 of its K = 0 return (0.14 at clip_eps 0.2)
    # and Pendulum 0.79 (1.02): experiments/studies/staleness_robustness. The MinAtar
    # configs set 0.5; in the async runtime on CartPole 0.5 and 0.2 could not be told apart
    # (docs/ideas.md)
    behaviour_clip_eps: float | None = None
    # lr is the rate of a dense layer this many inputs wide; a wider one's Adam step is
    # scaled by lr_base_width / fan_in (tianjax.core.update.scale_by_fan_in); null: lr everywhere
    lr_base_width: int | None = None

    def __post_init__(self):
        check_key(self.lr > 0, "ppo.lr", f"must be > 0, got {self.lr}")
        check_key(
            self.lr_base_width is None
            or (
                isinstance(self.lr_base_width, int)
                and not isinstance(self.lr_base_width, bool)
                and self.lr_base_width >= 1
            ),
            "ppo.lr_base_width",
            f"must be null or an int >= 1, got {self.lr_base_width!r}",
        )
        check_key(self.num_epochs >= 1, "ppo.num_epochs", f"must be >= 1, got {self.num_epochs}")
        check_key(
            self.num_minibatches >= 1,
            "ppo.num_minibatches",
            f"must be >= 1, got {self.num_minibatches}",
        )
        check_key(0 < self.gamma <= 1, "ppo.gamma", f"must be in (0, 1], got {self.gamma}")
        check_key(
            0 <= self.gae_lambda <= 1, "ppo.gae_lambda", f"must be in [0, 1], got {self.gae_lambda}"
        )
        check_key(self.clip_eps > 0, "ppo.clip_eps", f"must be > 0, got {self.clip_eps}")
        check_key(
            self.max_grad_norm > 0, "ppo.max_grad_norm", f"must be > 0, got {self.max_grad_norm}"
        )
        check_key(
            self.m2_threshold > 0, "ppo.m2_threshold", f"must be > 0, got {self.m2_threshold}"
        )
        check_key(
            not self.behaviour_clip or self.correction == "decoupled",
            "ppo.behaviour_clip",
            f"is for ppo.correction decoupled (it compares pi_0 with mu), got correction "
            f"'{self.correction}'",
        )
        eps_b = self.behaviour_clip_eps
        check_key(
            eps_b is None or (eps_b > 0 and self.clips_behaviour),
            "ppo.behaviour_clip_eps",
            f"must be > 0 and is the behaviour clip's range (ppo.behaviour_clip on, correction "
            f"decoupled), got {eps_b} with behaviour_clip {self.behaviour_clip} and "
            f"correction '{self.correction}'"
            + ("" if eps_b is None or eps_b <= 0 else " (set ppo.behaviour_clip_eps=null)"),
        )

    @property
    def clips_behaviour(self) -> bool:
        """Whether corrected batches drop the samples pi_0 has moved past (behaviour_clip;
        null: for the decoupled correction)."""
        if self.behaviour_clip is None:
            return self.correction == "decoupled"
        return self.behaviour_clip


__all__ = ["PPOConfig"]
