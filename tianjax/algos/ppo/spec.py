"""The spec of PPO (decoupled, staleness-corrected): tianjax.algos.ppo.loss."""

from __future__ import annotations

from tianjax.algos.ppo.config import PPOConfig
from tianjax.algos.spec import AlgorithmSpec
from tianjax.core.buffer_kind import ON_POLICY


def describe(config) -> list[str]:
    """The dry run's line on how an update splits the batch."""
    section, batch = config.ppo, config.steps_per_update
    return [
        f"  minibatches   {section.num_minibatches} of {batch // section.num_minibatches:,} samples, "
        f"{section.num_epochs} epochs"
    ]


SPEC = AlgorithmSpec(
    "ppo",
    "tianjax.algos.ppo.loss:make",
    config=PPOConfig,
    check="tianjax.algos.ppo.loss:check_config",
    buffer=ON_POLICY,
    sweepable=(
        "ppo.lr",
        "ppo.ent_coef",
        "ppo.vf_coef",
        "ppo.clip_eps",
        "ppo.gamma",
        "ppo.gae_lambda",
        "ppo.max_grad_norm",
    ),
    describe=describe,
)


__all__ = ["SPEC", "describe"]
