"""Your own network in place of the built-in actor-critic.

Your own network replaces the built-in actor-critic (ppo, impala, and algorithms that
call `custom_network`): `network.module: "module:Attr"` in the config, or
`tianjax.train(config, network=module)` for a run in this process. It must return what
the algorithm's apply expects (for ppo and impala: (logits [B, A] or Gaussian, value [B])).
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any

import flax.linen as nn

from tianjax.config import ConfigError, NetworkConfig
from tianjax.config.references import resolve_reference
from tianjax.core.types import ActionSpec

# NOTE: a network object given to tianjax.train() lives in this process only (it cannot be
# rebuilt in an actor process from the config); train() sets it here for the run.
_NETWORK: contextvars.ContextVar[Any] = contextvars.ContextVar("tianjax_network", default=None)


@contextlib.contextmanager
def use_network(network):
    """Within the block, `custom_network` returns `network` (a flax module or a factory)."""
    token = _NETWORK.set(network)
    try:
        yield
    finally:
        _NETWORK.reset(token)


def custom_network(network_cfg: NetworkConfig, obs_shape: tuple[int, ...], action: ActionSpec):
    """The user's flax module for these spaces, or None when the built-in one is asked for."""
    obj = _NETWORK.get()
    if obj is None and network_cfg.module:
        obj = resolve_reference(network_cfg.module, "network.module")
    if obj is None:
        return None
    if not isinstance(obj, nn.Module):
        if not callable(obj):
            raise ConfigError(
                f"config key 'network.module': {obj!r} is neither a flax module nor "
                "a factory(obs_shape, action_spec)"
            )
        obj = obj(tuple(obs_shape), action)
    if not isinstance(obj, nn.Module):
        raise ConfigError(
            f"config key 'network.module': the factory returned {type(obj).__name__}, "
            "not a flax module"
        )
    return obj


__all__ = ["custom_network", "use_network"]
