"""Heads: actor-critic (discrete or Gaussian) and Q-network over a torso.

With a CNN torso the policy and value heads share it (two towers would double the cost);
an MLP torso keeps separate policy and value towers.

Parameters are plain pytrees (`module.init(...)["params"]` style dicts); every apply is a
pure function of (params, obs).
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from tianjax.config import NetworkConfig
from tianjax.core.distributions import Gaussian
from tianjax.core.types import ActionSpec
from tianjax.networks.dense import Dense
from tianjax.networks.torsos import Torso, _check_torso, ortho_init, resolve_torso


class ActorCritic(nn.Module):
    """Policy and value heads; returns (logits or Gaussian, value [...])."""

    cfg: NetworkConfig
    obs_shape: tuple[int, ...]
    action: ActionSpec

    def __post_init__(self):
        _check_torso(self)
        super().__post_init__()

    @nn.compact
    def __call__(self, obs):
        if resolve_torso(self.cfg.torso, self.obs_shape) == "mlp":
            pi_h = Torso(self.cfg, self.obs_shape)(obs)
            v_h = Torso(self.cfg, self.obs_shape)(obs)
        else:
            pi_h = v_h = Torso(self.cfg, self.obs_shape)(obs)
        value = Dense(1, kernel_init=ortho_init(1.0))(v_h)[..., 0]
        if self.action.discrete:
            logits = Dense(self.action.num_actions, kernel_init=ortho_init(0.01))(pi_h)
            return logits, value
        dim = int(np.prod(self.action.shape))
        mean = Dense(dim, kernel_init=ortho_init(0.01))(pi_h)
        log_std = self.param("log_std", nn.initializers.zeros, (dim,))
        return Gaussian(mean, jnp.broadcast_to(log_std, mean.shape)), value


class QNetwork(nn.Module):
    """Q-values [..., A] for discrete actions."""

    cfg: NetworkConfig
    obs_shape: tuple[int, ...]
    num_actions: int

    def __post_init__(self):
        _check_torso(self)
        super().__post_init__()

    @nn.compact
    def __call__(self, obs):
        h = Torso(self.cfg, self.obs_shape)(obs)
        return Dense(self.num_actions)(h)


__all__ = ["ActorCritic", "QNetwork"]
