"""Action distributions as pure functions of the policy head's output.

Discrete policies output logits [..., A]; continuous ones output a Gaussian
(mean [..., D], log_std [..., D]) whose log-probability sums over action dimensions.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

Array = jax.Array


class Gaussian(NamedTuple):
    mean: Array  # [..., D]
    log_std: Array  # [..., D]


def sample(key: Array, dist: Array | Gaussian) -> Array:
    if isinstance(dist, Gaussian):
        return dist.mean + jnp.exp(dist.log_std) * jax.random.normal(key, dist.mean.shape)
    return jax.random.categorical(key, dist)


def mode(dist: Array | Gaussian) -> Array:
    if isinstance(dist, Gaussian):
        return dist.mean
    return jnp.argmax(dist, axis=-1)


def log_prob(dist: Array | Gaussian, action: Array) -> Array:
    if isinstance(dist, Gaussian):
        z = (action - dist.mean) * jnp.exp(-dist.log_std)
        return jnp.sum(-0.5 * z * z - dist.log_std - 0.5 * math.log(2 * math.pi), axis=-1)
    logp = jax.nn.log_softmax(dist, axis=-1)
    return jnp.take_along_axis(logp, action[..., None].astype(jnp.int32), axis=-1)[..., 0]


def entropy(dist: Array | Gaussian) -> Array:
    if isinstance(dist, Gaussian):
        return jnp.sum(dist.log_std + 0.5 * (1.0 + math.log(2 * math.pi)), axis=-1)
    logp = jax.nn.log_softmax(dist, axis=-1)
    return -jnp.sum(jnp.exp(logp) * logp, axis=-1)


__all__ = ["Gaussian", "entropy", "log_prob", "mode", "sample"]
