"""Flax networks: MLP actor-critic (discrete or Gaussian), MLP Q-network, Atari CNN.

Parameters are plain pytrees (`module.init(...)["params"]` style dicts); every apply is a
pure function of (params, obs). Image observations ([..., H, W, C] or [..., C, H, W] uint8
frames) go through the Nature-DQN torso, scaled to [0, 1] inside the network so that
frames travel as uint8.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from tianjax.config import NetworkConfig
from tianjax.distributions import Gaussian

_ACTIVATIONS: dict[str, Callable] = {"tanh": nn.tanh, "relu": nn.relu}


class ActionSpec(NamedTuple):
    """What a policy outputs: `num_actions` logits, or a `shape` of continuous values."""

    discrete: bool
    num_actions: int = 0  # discrete
    shape: tuple[int, ...] = ()  # continuous
    low: float | np.ndarray = -1.0
    high: float | np.ndarray = 1.0


def _ortho(scale: float):
    return nn.initializers.orthogonal(scale)


class MLP(nn.Module):
    hidden: Sequence[int]
    activation: str = "tanh"

    @nn.compact
    def __call__(self, x):
        act = _ACTIVATIONS[self.activation]
        for width in self.hidden:
            x = act(nn.Dense(width, kernel_init=_ortho(np.sqrt(2)), bias_init=nn.initializers.zeros)(x))
        return x


class AtariTorso(nn.Module):
    """Nature-DQN convolutions over uint8 frames stacked in channels (NCHW or NHWC)."""

    channels_first: bool = True

    @nn.compact
    def __call__(self, x):
        x = x.astype(jnp.float32) / 255.0
        if self.channels_first:
            x = jnp.moveaxis(x, -3, -1)
        for feat, k, s in ((32, 8, 4), (64, 4, 2), (64, 3, 1)):
            x = nn.relu(nn.Conv(feat, (k, k), (s, s), padding="VALID", kernel_init=_ortho(np.sqrt(2)))(x))
        x = x.reshape(x.shape[:-3] + (-1,))
        return nn.relu(nn.Dense(512, kernel_init=_ortho(np.sqrt(2)))(x))


def _is_image(obs_shape: tuple[int, ...]) -> bool:
    return len(obs_shape) == 3


def _torso(cfg: NetworkConfig, obs_shape) -> nn.Module:
    if _is_image(obs_shape):
        return AtariTorso(channels_first=obs_shape[0] < obs_shape[-1])
    return MLP(tuple(cfg.hidden), cfg.activation)


class ActorCritic(nn.Module):
    """Separate policy and value towers; returns (logits or Gaussian, value [...])."""

    cfg: NetworkConfig
    obs_shape: tuple[int, ...]
    action: ActionSpec

    @nn.compact
    def __call__(self, obs):
        if _is_image(self.obs_shape):
            # One shared convolutional torso for pixels (the towers would double the cost).
            h = _torso(self.cfg, self.obs_shape)(obs)
            pi_h, v_h = h, h
        else:
            obs = obs.astype(jnp.float32)
            pi_h = _torso(self.cfg, self.obs_shape)(obs)
            v_h = _torso(self.cfg, self.obs_shape)(obs)
        value = nn.Dense(1, kernel_init=_ortho(1.0))(v_h)[..., 0]
        if self.action.discrete:
            logits = nn.Dense(self.action.num_actions, kernel_init=_ortho(0.01))(pi_h)
            return logits, value
        dim = int(np.prod(self.action.shape))
        mean = nn.Dense(dim, kernel_init=_ortho(0.01))(pi_h)
        log_std = self.param("log_std", nn.initializers.zeros, (dim,))
        return Gaussian(mean, jnp.broadcast_to(log_std, mean.shape)), value


class QNetwork(nn.Module):
    """Q-values [..., A] for discrete actions."""

    cfg: NetworkConfig
    obs_shape: tuple[int, ...]
    num_actions: int

    @nn.compact
    def __call__(self, obs):
        if not _is_image(self.obs_shape):
            obs = obs.astype(jnp.float32)
        h = _torso(self.cfg, self.obs_shape)(obs)
        return nn.Dense(self.num_actions)(h)
