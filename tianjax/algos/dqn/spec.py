"""The spec of Double DQN with replay: tianjax.algos.dqn.loss."""

from __future__ import annotations

from tianjax.algos.dqn.config import DQNConfig
from tianjax.algos.spec import AlgorithmSpec
from tianjax.core.buffer_kind import TRANSITIONS

SPEC = AlgorithmSpec(
    "dqn",
    "tianjax.algos.dqn.loss:make",
    config=DQNConfig,
    check="tianjax.algos.dqn.loss:check_config",
    buffer=TRANSITIONS,
    replay_shape_keys=("dqn.buffer_size", "dqn.frame_once"),
    target_networks=("q",),
)


__all__ = ["SPEC"]
