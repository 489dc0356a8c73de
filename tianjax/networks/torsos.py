"""Torsos: the feature extractors every built-in network starts with, chosen by config.

The torso is chosen by `network.torso`:

    mlp          flatten the observation, then the `network.hidden` MLP
    minatar_cnn  one 3x3 convolution (16 channels, stride 1; Young & Tian 2019, MinAtar),
                 flatten, then the MLP; for small maps such as MinAtar's 10x10xC
    nature_cnn   the Nature-DQN convolutions (Mnih et al. 2015: 8x8/4, 4x4/2, 3x3/1),
                 flatten, then the MLP; needs frames of at least 36x36
    impala_cnn   the IMPALA residual stacks (Espeholt et al. 2018: 16, 32, 32 channels,
                 each conv 3x3 + max-pool 3x3/2 + two residual blocks), then the MLP
    auto         from the observation's shape and dtype:
                   uint8 frames of at least 36x36 (Atari's)     -> nature_cnn
                   other images of at least 36x36 (float, ...)  -> impala_cnn
                   smaller rank-3 maps (MinAtar's 10x10xC)      -> minatar_cnn
                   anything else                                -> mlp

Why the dtype: the Nature CNN is the torso for pixel frames, uint8 in [0, 255] that enter
it scaled to [0, 1]. A float image (already normalised pixels, depth, feature maps) is not
scaled and has no known range; IMPALA's residual stacks of 3x3 convolutions, which take
any size and keep more of a small image than a stride-4 first layer, are the safer
default there. `auto` decides from the shape and dtype alone (no values), so every process
that builds the network from the same config and env gets the same parameter tree; the
runtime resolves it once per env in `tianjax.algos.make_algorithm(..., obs_dtype=...)`.
Where the dtype is not given (a network built directly), `auto` assumes frames, as for
uint8. A torso that cannot take the shape is one ConfigError naming `network.torso`.
Images are [..., H, W, C] or [..., C, H, W] (channels are the smallest of the first and
last axis, as envpool's Atari frames are [4, 84, 84] and MinAtar's maps [10, 10, C]).

Inputs are cast to float32 inside the network; only uint8 inputs (frames) are scaled by
1/255, so frames travel as uint8 from env to loss and {0, 1} maps keep their values.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from tianjax.config import ConfigError, NetworkConfig
from tianjax.networks.conv import Conv
from tianjax.networks.dense import Dense

_ACTIVATIONS: dict[str, Callable] = {"tanh": nn.tanh, "relu": nn.relu}
TORSOS = ("auto", "mlp", "minatar_cnn", "nature_cnn", "impala_cnn")
NATURE_MIN_SIZE = 36  # the smallest H (and W) the three Nature convolutions leave >= 1 wide


def ortho_init(scale: float):
    """The orthogonal initializer every built-in layer uses (`scale`: its gain)."""
    return nn.initializers.orthogonal(scale)


def as_float(x):
    """float32 inputs; uint8 (frames) scaled to [0, 1], every other dtype keeps its values."""
    x = jnp.asarray(x)
    if x.dtype == jnp.uint8:
        return x.astype(jnp.float32) / 255.0
    return x.astype(jnp.float32)


def image_layout(obs_shape: Sequence[int]) -> tuple[int, int, int, bool]:
    """(H, W, C, channels_first) of a rank-3 observation; channels are the smaller end axis."""
    a, b, c = obs_shape
    if a < c:
        return b, c, a, True
    return a, b, c, False


def resolve_torso(torso: str, obs_shape: Sequence[int], obs_dtype=None) -> str:
    """The concrete torso for `torso` and an observation shape (and dtype: see `auto` in the
    module docstring; None assumes frames), or a ConfigError naming `network.torso` when that
    torso cannot take the shape."""
    obs_shape = tuple(int(d) for d in obs_shape)
    if torso not in TORSOS:
        raise ConfigError(
            f"config key 'network.torso': must be one of {list(TORSOS)}, got {torso!r}"
        )
    if any(d <= 0 for d in obs_shape):
        raise ConfigError(
            f"config key 'network.torso': the observation shape {obs_shape} has an "
            "empty axis; no torso can take it"
        )
    image = len(obs_shape) == 3
    if torso == "auto":
        if not image:
            return "mlp"
        h, w, _, _ = image_layout(obs_shape)
        if min(h, w) < NATURE_MIN_SIZE:
            return "minatar_cnn"
        frames = obs_dtype is None or np.dtype(obs_dtype) == np.uint8
        return "nature_cnn" if frames else "impala_cnn"
    if torso != "mlp" and not image:
        raise ConfigError(
            f"config key 'network.torso': {torso} needs image observations "
            f"[H, W, C] or [C, H, W], got shape {obs_shape}; use mlp or auto"
        )
    if torso == "nature_cnn":
        h, w, _, _ = image_layout(obs_shape)
        if min(h, w) < NATURE_MIN_SIZE:
            raise ConfigError(
                f"config key 'network.torso': nature_cnn needs frames of at least "
                f"{NATURE_MIN_SIZE}x{NATURE_MIN_SIZE}, got {h}x{w} (shape {obs_shape}); "
                "use minatar_cnn, impala_cnn or auto"
            )
    return torso


def resolve_network(cfg: NetworkConfig, obs_shape, obs_dtype=None) -> NetworkConfig:
    """`cfg` with `torso: auto` replaced by the torso for this observation shape and dtype
    (unchanged for a concrete torso, an unknown dtype, or a structured multi-agent shape)."""
    if cfg.torso != "auto" or obs_dtype is None:
        return cfg
    if not isinstance(obs_shape, (tuple, list)) or not all(
        isinstance(d, (int, np.integer)) for d in obs_shape
    ):
        return cfg
    return dataclasses.replace(cfg, torso=resolve_torso("auto", obs_shape, obs_dtype))


class MLP(nn.Module):
    hidden: Sequence[int]
    activation: str = "tanh"

    @nn.compact
    def __call__(self, x):
        act = _ACTIVATIONS[self.activation]
        for width in self.hidden:
            x = act(
                Dense(width, kernel_init=ortho_init(np.sqrt(2)), bias_init=nn.initializers.zeros)(x)
            )
        return x


def _nhwc(x, channels_first: bool):
    return jnp.moveaxis(x, -3, -1) if channels_first else x


def _flatten(x, obs_ndim: int):
    return x.reshape(x.shape[: x.ndim - obs_ndim] + (-1,))


class MinAtarCNN(nn.Module):
    """One 3x3 convolution, 16 channels, stride 1, ReLU (the MinAtar paper's torso)."""

    channels_first: bool = False

    @nn.compact
    def __call__(self, x):
        x = _nhwc(x, self.channels_first)
        x = nn.relu(Conv(16, (3, 3), (1, 1), padding="SAME", kernel_init=ortho_init(np.sqrt(2)))(x))
        return _flatten(x, 3)


class NatureCNN(nn.Module):
    """The Nature-DQN convolutions (32 8x8/4, 64 4x4/2, 64 3x3/1, ReLU, no padding)."""

    channels_first: bool = True

    @nn.compact
    def __call__(self, x):
        x = _nhwc(x, self.channels_first)
        for feat, k, s in ((32, 8, 4), (64, 4, 2), (64, 3, 1)):
            x = nn.relu(
                Conv(feat, (k, k), (s, s), padding="VALID", kernel_init=ortho_init(np.sqrt(2)))(x)
            )
        return _flatten(x, 3)


class ImpalaCNN(nn.Module):
    """IMPALA's residual stacks: per stack conv 3x3, max-pool 3x3/2, two residual blocks."""

    channels_first: bool = False
    channels: Sequence[int] = (16, 32, 32)

    @nn.compact
    def __call__(self, x):
        x = _nhwc(x, self.channels_first)
        for ch in self.channels:
            x = Conv(ch, (3, 3), padding="SAME", kernel_init=ortho_init(np.sqrt(2)))(x)
            x = nn.max_pool(x, (3, 3), strides=(2, 2), padding="SAME")
            for _ in range(2):
                y = Conv(ch, (3, 3), padding="SAME", kernel_init=ortho_init(np.sqrt(2)))(nn.relu(x))
                y = Conv(ch, (3, 3), padding="SAME", kernel_init=ortho_init(np.sqrt(2)))(nn.relu(y))
                x = x + y
        return _flatten(nn.relu(x), 3)


class Torso(nn.Module):
    """float cast (uint8 scaled) -> the chosen feature extractor -> the `network.hidden` MLP."""

    cfg: NetworkConfig
    obs_shape: tuple[int, ...]

    @nn.compact
    def __call__(self, obs):
        x = as_float(obs)
        kind = resolve_torso(self.cfg.torso, self.obs_shape)
        if kind == "mlp":
            if len(self.obs_shape) != 1:
                x = _flatten(x, len(self.obs_shape))
            return MLP(tuple(self.cfg.hidden), self.cfg.activation)(x)
        channels_first = image_layout(self.obs_shape)[3]
        cnn = {"minatar_cnn": MinAtarCNN, "nature_cnn": NatureCNN, "impala_cnn": ImpalaCNN}[kind]
        x = cnn(channels_first=channels_first)(x)
        return MLP(tuple(self.cfg.hidden), "relu")(x)


def _check_torso(module) -> None:
    # Called at construction, outside any trace: a torso that cannot take the observation
    # shape is one ConfigError line, never a shape error deep inside flax.
    resolve_torso(module.cfg.torso, module.obs_shape)


__all__ = [
    "MLP",
    "NATURE_MIN_SIZE",
    "TORSOS",
    "ImpalaCNN",
    "MinAtarCNN",
    "NatureCNN",
    "Torso",
    "as_float",
    "image_layout",
    "ortho_init",
    "resolve_network",
    "resolve_torso",
]
