"""The spec of QMIX (recurrent agents, a monotonic mixer, replay of sequences): tianjax.algos.qmix.loss."""

from __future__ import annotations

from tianjax.algos.qmix.config import QMIXConfig
from tianjax.algos.spec import AlgorithmSpec
from tianjax.core.buffer_kind import SEQUENCES

SPEC = AlgorithmSpec(
    "qmix",
    "tianjax.algos.qmix.loss:make",
    config=QMIXConfig,
    check="tianjax.algos.qmix.loss:check_config",
    buffer=SEQUENCES,
    multi_agent=True,
    shape_keys=("qmix.hidden_dim", "qmix.mixer_embed", "qmix.hyper_hidden"),
    replay_shape_keys=("qmix.buffer_size",),
    target_networks=("agent", "mixer"),
)


__all__ = ["SPEC"]
