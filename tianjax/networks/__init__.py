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
    "TORSOS",  # the names network.torso takes
    "ActionSpec",
    "ActorCritic",
    "ImpalaCNN",
    "MinAtarCNN",
    "NatureCNN",
    "QNetwork",
    "Torso",
    "as_float",  # inputs as float32, uint8 frames scaled to [0, 1]
    "custom_network",
    "ortho_init",  # the initializer of every built-in layer, for a head of your own
    "resolve_network",
    "resolve_torso",  # `auto` resolved for an observation shape and dtype
    "use_network",
]
