"""The stochastic actor-critic policy that PPO and IMPALA share: how to act with it."""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax.numpy as jnp

from tianjax.config import Config
from tianjax.core import distributions as D
from tianjax.core.algorithm import ActOutput
from tianjax.core.types import ActionSpec
from tianjax.networks import ActorCritic
from tianjax.networks.custom import custom_network


class ActorCriticPolicy(NamedTuple):
    network: Any  # the flax module
    apply: Callable  # apply(params, obs [B, ...]) -> (logits or Gaussian, value [B])
    init_params: Callable  # init_params(key) -> params
    act: Callable  # act(params, obs, key, env_steps) -> ActOutput (sampled)
    value: Callable  # value(params, obs) -> [B]
    greedy: Callable  # greedy(params, obs) -> action [B, ...]


def actor_critic(
    config: Config, obs_shape: tuple[int, ...], action_spec: ActionSpec
) -> ActorCriticPolicy:
    net = custom_network(config.network, tuple(obs_shape), action_spec)
    if net is None:
        net = ActorCritic(config.network, tuple(obs_shape), action_spec)
    apply_fn = net.apply

    def init_params(key):
        return net.init(key, jnp.zeros((1,) + tuple(obs_shape), jnp.float32))

    return sampling_policy(net, apply_fn, init_params)


def sampling_policy(net, apply_fn: Callable, init_params: Callable) -> ActorCriticPolicy:
    """The policy of an actor-critic `apply_fn(params, x) -> (distribution, value)`: act
    samples from the distribution, greedy takes its mode."""

    def act(params, obs, key, env_steps=0):
        dist, value = apply_fn(params, obs)
        action = D.sample(key, dist)
        return ActOutput(action, D.log_prob(dist, action), value)

    def value(params, obs):
        return apply_fn(params, obs)[1]

    def greedy(params, obs):
        return D.mode(apply_fn(params, obs)[0])

    return ActorCriticPolicy(net, apply_fn, init_params, act, value, greedy)


__all__ = ["ActorCriticPolicy", "actor_critic", "sampling_policy"]
