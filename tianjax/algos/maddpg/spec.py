"""The spec of MADDPG (deterministic actors, centralised critics): tianjax.algos.maddpg.loss."""

from __future__ import annotations

from tianjax.algos.maddpg.config import MADDPGConfig
from tianjax.algos.spec import AlgorithmSpec
from tianjax.core.buffer_kind import TRANSITIONS

SPEC = AlgorithmSpec(
    "maddpg",
    "tianjax.algos.maddpg.loss:make",
    config=MADDPGConfig,
    check="tianjax.algos.maddpg.loss:check_config",
    buffer=TRANSITIONS,
    multi_agent=True,
    replay_shape_keys=("maddpg.buffer_size",),
    target_networks=("actor", "critic"),
    renamed_keys={"maddpg.tau": "maddpg.target_tau"},
)


__all__ = ["SPEC"]
