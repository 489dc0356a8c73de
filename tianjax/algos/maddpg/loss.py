"""MADDPG (Lowe et al., 2017): deterministic actors, centralised critics, for continuous actions.

Agent i has its own actor mu_i(o^i) (deterministic; Gaussian noise of std `noise_std` added
when acting, clipped to the action bounds) and its own critic Q_i(s, a^1, ..., a^N) over the
global state s (all observations; tianjax.envs.marl) and every agent's action. With a
target copy (mu', Q') of each, for replayed transitions (s, o, a, r, s', o', terminated):

    y_i         = r_i + gamma * (1 - terminated) * Q'_i(s', mu'_1(o'^1), ..., mu'_N(o'^N))   (no gradient)
    critic loss = mean_b  w_b * sum_i (Q_i(s, a) - y_i)^2
    actor loss  = -mean_b w_b * sum_i Q_i(s, a^1, ..., mu_i(o^i), ..., a^N)     (critics held fixed)

Terminated transitions do not bootstrap; truncated ones bootstrap from the final
observation. After every gradient step the targets move by Polyak averaging,
target <- target_tau * online + (1 - target_tau) * target. Staleness enters as the per-sample weight w_b
of the transition's behaviour version (1 when fresh), as for DQN: the targets do not depend
on the behaviour policy, so no importance ratio is needed.
"""

from __future__ import annotations

from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from tianjax.algos.common import check_replay, polyak_target, replay_step, sample_weights
from tianjax.config import Config, ConfigError
from tianjax.core.algorithm import ActOutput, Algorithm
from tianjax.core.buffer_kind import TRANSITIONS
from tianjax.core.types import ActionSpec, MAObs, Transition
from tianjax.core.update import LearnerState, guarded, init_state, make_optimizer
from tianjax.networks import MLP
from tianjax.networks.dense import Dense


class MADDPGParams(NamedTuple):
    actor: dict  # leaves [N, ...]: one actor per agent
    critic: dict  # leaves [N, ...]: one critic per agent


class Actor(nn.Module):
    """mu(o) in [low, high]^D."""

    hidden: tuple[int, ...]
    activation: str
    low: np.ndarray
    high: np.ndarray

    @nn.compact
    def __call__(self, obs):
        h = MLP(self.hidden, self.activation)(obs.astype(jnp.float32))
        x = nn.sigmoid(Dense(len(self.low))(h))
        return self.low + (self.high - self.low) * x


class Critic(nn.Module):
    """Q(s, a^1..a^N) -> [...]: the global state and every agent's action ([..., N, D])."""

    hidden: tuple[int, ...]
    activation: str

    @nn.compact
    def __call__(self, state, actions):
        x = jnp.concatenate([state, actions.reshape(actions.shape[:-2] + (-1,))], axis=-1)
        return Dense(1)(MLP(self.hidden, self.activation)(x))[..., 0]


def make_networks(config: Config, n: int, spec: ActionSpec):
    """(actor_apply(actor_params [N], obs [..., N, D]) -> actions [..., N, A],
    critic_apply(critic_params [N], state [..., S], actions [..., N, A]) -> Q [..., N],
    actor module, critic module)."""
    net = config.network
    actor = Actor(
        tuple(net.hidden),
        net.activation,
        np.asarray(spec.low, np.float32),
        np.asarray(spec.high, np.float32),
    )
    critic = Critic(tuple(net.hidden), net.activation)

    def actor_apply(params, obs):  # agent i's actor on agent i's observation
        return jax.vmap(actor.apply, in_axes=(0, -2), out_axes=-2)(params, obs)

    def critic_apply(params, state, actions):  # every critic sees everything
        return jax.vmap(critic.apply, in_axes=(0, None, None), out_axes=-1)(params, state, actions)

    return actor_apply, critic_apply, actor, critic


def make_loss(actor_apply, critic_apply, *, gamma: float):
    """loss_fn(params, target_params, batch: Transition of MAObs, weight [B]) -> (loss, metrics)."""

    def loss_fn(params: MADDPGParams, target_params: MADDPGParams, batch: Transition, weight):
        sg = jax.lax.stop_gradient
        obs, next_obs = batch.obs, batch.next_obs
        next_actions = actor_apply(target_params.actor, next_obs.obs)  # [B, N, A]
        q_next = critic_apply(target_params.critic, next_obs.state, next_actions)  # [B, N]
        not_done = 1.0 - batch.terminated.astype(jnp.float32)[..., None]
        y = sg(batch.reward + gamma * not_done * q_next)
        q = critic_apply(params.critic, obs.state, batch.action)
        critic_loss = jnp.mean(weight * jnp.sum(jnp.square(q - y), axis=-1))
        # actor i replaces only its own action; the critics are held fixed for this term
        mu = actor_apply(params.actor, obs.obs)  # [B, N, A]
        n = mu.shape[-2]
        own = jnp.eye(n, dtype=bool)[:, :, None]  # [i, j, 1]: j == i
        joint = jnp.where(own, mu[:, None], batch.action[:, None])  # [B, i, N, A]
        q_pi = jax.vmap(
            lambda c, a_i, i: critic_apply(c, obs.state, a_i)[..., i],
            in_axes=(None, 1, 0),
            out_axes=-1,
        )(sg(params.critic), joint, jnp.arange(n))
        actor_loss = -jnp.mean(weight * jnp.sum(q_pi, axis=-1))
        metrics = {
            "critic_loss": critic_loss,
            "actor_loss": actor_loss,
            "q_mean": sg(jnp.mean(q)),
            "target_mean": sg(jnp.mean(y)),
        }
        return critic_loss + actor_loss, metrics

    return loss_fn


def check_config(config: Config) -> None:
    """The maddpg section against the run: a buffer that holds a rollout."""
    check_replay(config)


def make(
    config: Config, obs_shape, action_spec: ActionSpec, *, correct_staleness: bool = True
) -> Algorithm:
    """MADDPG for a multi-agent env with continuous actions (`obs_shape` an MAObs of shapes)."""
    try:
        (n, d), (s,), _ = (tuple(x) for x in obs_shape)
    except (TypeError, ValueError):
        raise ConfigError(
            f"config key 'env_backend': maddpg needs a multi-agent env (jaxmarl), got "
            f"observations of shape {tuple(obs_shape)}"
        ) from None
    if action_spec.discrete:
        raise ConfigError(
            "config key 'env': maddpg needs continuous actions (e.g. "
            "MPE_simple_spread_v3_continuous); for discrete ones use ippo or qmix"
        )
    cfg = config.maddpg
    actor_apply, critic_apply, actor, critic = make_networks(config, n, action_spec)
    a = action_spec.shape[0]
    optimizer = make_optimizer(cfg.lr, cfg.max_grad_norm)
    update_target = polyak_target(cfg.target_tau)
    loss_fn = make_loss(actor_apply, critic_apply, gamma=cfg.gamma)
    low, high = jnp.asarray(action_spec.low), jnp.asarray(action_spec.high)

    def init(key):
        k_a, k_c, k_state = jax.random.split(key, 3)
        actors = jax.vmap(lambda k: actor.init(k, jnp.zeros((1, d))))(jax.random.split(k_a, n))
        critics = jax.vmap(lambda k: critic.init(k, jnp.zeros((1, s)), jnp.zeros((1, n, a))))(
            jax.random.split(k_c, n)
        )
        return init_state(MADDPGParams(actors, critics), optimizer, k_state, with_target=True)

    def greedy(params, obs: MAObs):
        return actor_apply(params.actor, obs.obs)

    def act(params, obs: MAObs, key, env_steps=0):
        mu = greedy(params, obs)
        action = jnp.clip(mu + cfg.noise_std * jax.random.normal(key, mu.shape), low, high)
        zeros = jnp.zeros(mu.shape[:-1], jnp.float32)
        return ActOutput(action, zeros, zeros)

    def value(params, obs: MAObs):
        return jnp.zeros(obs.obs.shape[:-1], jnp.float32)

    def update(state: LearnerState, batch: Transition, fresh=True):
        """One gradient step on replayed transitions (`fresh` unused, as for DQN)."""
        w, _ = sample_weights(correct_staleness, state.version, batch.version, config.staleness)
        return replay_step(loss_fn, optimizer, state, batch, w, update_target)

    return Algorithm(
        "maddpg", TRANSITIONS, init, act, value, greedy, guarded(update), loss_fn, (actor, critic)
    )


__all__ = ["Actor", "Critic", "MADDPGParams", "make", "make_loss", "make_networks"]
