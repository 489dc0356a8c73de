"""IPPO (de Witt et al., 2020) with parameter sharing; MAPPO's centralised value (Yu et al., 2022).

Every agent runs the same actor-critic. Agent i of env b at step t is one PPO sample: its
own observation o^i_t (plus a one-hot agent id where `marl.agent_id`), its action, its
reward r^i_t, and its own GAE advantage over its own column of the trajectory. So a
multi-agent batch [T, B, N] is learned as a single-agent batch [T, B * N] of agent
columns, and the objective is PPO's, unchanged (tianjax.algos.ppo):

    L(theta) = mean_{t, b, i}  w_{t,b} * PPO_clip(pi_theta(a^i_t | x^i_t), A^i_t)  + value, entropy terms

with x^i_t = [o^i_t, onehot(i)] for the policy and, with `marl.centralised_value`,
[s_t, onehot(i)] (the global state) for the critic. The staleness weight w of a sample
applies to each of its agents. Unavailable actions (SMAX masks) get a logit of -1e9, so
they are never sampled and carry no probability in the ratio or the entropy.

With one agent and no agent id this is single-agent PPO on the same data, exactly (tested).
"""

from __future__ import annotations

from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from tianjax.algos.policy import ActorCriticPolicy, sampling_policy
from tianjax.algos.ppo import loss as ppo
from tianjax.config import Config, ConfigError, NetworkConfig
from tianjax.core.algorithm import Algorithm
from tianjax.core.buffer_kind import ON_POLICY
from tianjax.core.types import ActionSpec, MAObs, Trajectory
from tianjax.networks import MLP, ActorCritic, ortho_init

MASKED_LOGIT = -1e9


class AgentObs(NamedTuple):
    """One agent's input: leaves [..., ...] with any leading batch shape."""

    obs: jax.Array  # [..., D] the agent's own observation
    state: jax.Array  # [..., S] the global state (read by a centralised critic only)
    avail: jax.Array  # [..., A] available actions
    agent_id: jax.Array  # [..., N] one-hot


def agent_view(obs: MAObs) -> AgentObs:
    """MAObs with leading shape [...] (agents on the axis after it) -> AgentObs [..., N]."""
    n = obs.obs.shape[-2]
    lead = obs.obs.shape[:-2]
    state = jnp.broadcast_to(obs.state[..., None, :], lead + (n, obs.state.shape[-1]))
    agent_id = jnp.broadcast_to(jnp.eye(n, dtype=jnp.float32), lead + (n, n))
    return AgentObs(obs.obs, state, obs.avail, agent_id)


def agent_columns(traj: Trajectory) -> Trajectory:
    """A multi-agent trajectory [T, B] (agent axis N inside) -> single-agent [T, B * N].

    Column b * N + i is agent i of env b; env-level fields (done, version, trunc_t) repeat
    per agent.
    """
    T, B, N = traj.reward.shape

    def per_agent(x):  # [T, B, N, ...] -> [T, B * N, ...]
        return x.reshape((T, B * N) + x.shape[3:])

    def per_env(x):  # [T, B] -> [T, B * N]
        return jnp.repeat(x, N, axis=1)

    def per_env_obs(o):  # MAObs [B] -> AgentObs [B * N]
        return jax.tree.map(lambda x: x.reshape((B * N,) + x.shape[2:]), agent_view(o))

    return Trajectory(
        obs=jax.tree.map(per_agent, agent_view(traj.obs)),
        action=per_agent(traj.action),
        reward=per_agent(traj.reward),
        done=per_env(traj.done),
        bootstrap_value=per_agent(traj.bootstrap_value),
        behaviour_log_prob=per_agent(traj.behaviour_log_prob),
        behaviour_value=per_agent(traj.behaviour_value),
        version=per_env(traj.version),
        last_obs=per_env_obs(traj.last_obs),
        trunc_obs=per_env_obs(traj.trunc_obs),
        trunc_t=jnp.repeat(traj.trunc_t, N, axis=0),
    )


class CentralisedActorCritic(nn.Module):
    """MAPPO: the actor reads the agent's input, the critic the global state (+ agent id)."""

    cfg: NetworkConfig
    action: ActionSpec

    @nn.compact
    def __call__(self, actor_in, critic_in):
        pi_h = MLP(tuple(self.cfg.hidden), self.cfg.activation)(actor_in)
        v_h = MLP(tuple(self.cfg.hidden), self.cfg.activation)(critic_in)
        value = nn.Dense(1, kernel_init=ortho_init(1.0))(v_h)[..., 0]
        logits = nn.Dense(self.action.num_actions, kernel_init=ortho_init(0.01))(pi_h)
        return logits, value


def agent_policy(config: Config, shapes: MAObs, action_spec: ActionSpec) -> ActorCriticPolicy:
    """The shared per-agent actor-critic over AgentObs inputs (any leading shape)."""
    (n, d), (s,), (_, a) = shapes
    use_id, central = config.marl.agent_id, config.marl.centralised_value
    if central and not action_spec.discrete:
        raise ConfigError(
            "config key 'marl.centralised_value': supported for discrete actions only"
        )

    def features(x, own: bool):
        parts = [(x.obs if own else x.state).astype(jnp.float32)]
        if use_id:
            parts.append(x.agent_id)
        return parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=-1)

    if central:
        net = CentralisedActorCritic(config.network, action_spec)
        raw = lambda params, x: net.apply(params, features(x, True), features(x, False))  # noqa: E731
    else:
        net = ActorCritic(config.network, (d + n * use_id,), action_spec)
        raw = lambda params, x: net.apply(params, features(x, True))  # noqa: E731

    def apply_fn(params, x: AgentObs):
        dist, value = raw(params, x)
        if action_spec.discrete:
            dist = jnp.where(x.avail, dist, MASKED_LOGIT)
        return dist, value

    def init_params(key):
        example = AgentObs(
            jnp.zeros((1, d)), jnp.zeros((1, s)), jnp.ones((1, a), bool), jnp.zeros((1, n))
        )
        if central:
            return net.init(key, features(example, True), features(example, False))
        return net.init(key, features(example, True))

    return sampling_policy(net, apply_fn, init_params)


def make(
    config: Config, obs_shape, action_spec: ActionSpec, *, correct_staleness: bool = True
) -> Algorithm:
    """IPPO for a multi-agent env whose one-env observation shapes are `obs_shape` (an MAObs
    of shapes, as `MultiAgentEnv.obs_shape`). Acts on MAObs [B] -> actions [B, N]."""
    try:
        shapes = MAObs(*(tuple(x) for x in obs_shape))
        _ = shapes.obs[1], shapes.state[0], shapes.avail[1]
    except (TypeError, IndexError):
        raise ConfigError(
            f"config key 'env_backend': ippo needs a multi-agent env (jaxmarl), got "
            f"observations of shape {tuple(obs_shape)}"
        ) from None
    policy = agent_policy(config, shapes, action_spec)
    single = ppo.make(
        config,
        shapes.obs[1:],
        action_spec,
        correct_staleness=correct_staleness,
        policy=policy,
        samples_per_step=shapes.obs[0],
    )

    def act(params, obs: MAObs, key, env_steps=0):
        return policy.act(params, agent_view(obs), key, env_steps)

    def value(params, obs: MAObs):
        return policy.value(params, agent_view(obs))

    def greedy(params, obs: MAObs):
        return policy.greedy(params, agent_view(obs))

    def update(state, traj: Trajectory, fresh=True):
        return single.update(state, agent_columns(traj), fresh)

    return Algorithm(
        "ippo", ON_POLICY, single.init, act, value, greedy, update, single.loss_fn, policy.network
    )


__all__ = [
    "MASKED_LOGIT",
    "AgentObs",
    "CentralisedActorCritic",
    "agent_columns",
    "agent_policy",
    "agent_view",
    "make",
]
