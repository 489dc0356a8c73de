"""Flax networks: a torso chosen by config (`torsos`, with `conv`), the actor-critic and Q
heads on top of it (`heads`), or the user's own module (`custom`), which a factory builds
for an `ActionSpec`. Params are plain pytrees."""

from tianjax.core.types import ActionSpec
from tianjax.networks.custom import custom_network, use_network
from tianjax.networks.heads import ActorCritic, QNetwork
from tianjax.networks.torsos import (
    MLP,
    TORSOS,
    ImpalaCNN,
    MinAtarCNN,
    NatureCNN,
    Torso,
    as_float,
    ortho_init,
    resolve_network,
    resolve_torso,
)

__all__ = [
    "MLP",
    "TORSOS",
    "ActionSpec",
    "ActorCritic",
    "ImpalaCNN",
    "MinAtarCNN",
    "NatureCNN",
    "QNetwork",
    "Torso",
    "as_float",
    "custom_network",
    "ortho_init",
    "resolve_network",
    "resolve_torso",
    "use_network",
]
