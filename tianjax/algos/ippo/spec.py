"""The spec of IPPO / MAPPO (PPO's loss over agent columns, PPO's section): tianjax.algos.ippo.loss."""

from __future__ import annotations

from tianjax.algos.ppo.config import PPOConfig
from tianjax.algos.ppo.spec import SPEC as PPO
from tianjax.algos.spec import AlgorithmSpec
from tianjax.core.buffer_kind import ON_POLICY

SPEC = AlgorithmSpec(
    "ippo",
    "tianjax.algos.ippo.loss:make",
    config=PPOConfig,
    check="tianjax.algos.ppo.loss:check_config",
    buffer=ON_POLICY,
    section="ppo",
    multi_agent=True,
    shape_keys=("marl.agent_id", "marl.centralised_value"),
    sweepable=PPO.sweepable,
    describe=PPO.describe,
)


__all__ = ["SPEC"]
