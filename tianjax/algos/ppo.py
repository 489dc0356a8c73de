"""PPO (Schulman et al., 2017), clipped, with the ratio taken against the behaviour policy.

The behaviour policy mu is whatever version produced the samples, so the same loss serves
the fused mode (mu = the previous params, tau = 0) and async mode (mu many versions old).
Staleness enters as per-sample weights w_i = w(tau_i) * min(rho_bar, pi_0 / mu), pi_0 the
learner's policy when the batch arrives (see tianjax.staleness); with tau = 0 the weights
are exactly 1 and the loss is the plain PPO loss.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from tianjax import distributions as D
from tianjax import staleness as S
from tianjax.algos.base import Algorithm
from tianjax.algos.policy import ActorCriticPolicy, actor_critic
from tianjax.config import Config
from tianjax.learner import LearnerState, gradient_step, guarded, init_state, make_optimizer
from tianjax.networks import ActionSpec
from tianjax.returns import gae
from tianjax.types import Trajectory


class PPOBatch(NamedTuple):
    """Flat samples [N, ...] for one minibatch step."""

    obs: jax.Array
    action: jax.Array
    behaviour_log_prob: jax.Array  # [N]
    behaviour_value: jax.Array  # [N]
    advantage: jax.Array  # [N]
    target: jax.Array  # [N] value target (advantage + behaviour value)
    weight: jax.Array  # [N] staleness weight (1 when fresh)


def make_loss(apply_fn, *, clip_eps: float, clip_value: bool, vf_coef: float, ent_coef: float):
    """loss_fn(params, batch: PPOBatch) -> (loss, metrics)."""

    def loss_fn(params, batch: PPOBatch):
        dist, value = apply_fn(params, batch.obs)
        log_prob = D.log_prob(dist, batch.action)
        w = batch.weight
        adv = batch.advantage
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        ratio = jnp.exp(log_prob - batch.behaviour_log_prob)
        pg = -jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - clip_eps, 1 + clip_eps) * adv)
        policy_loss = jnp.mean(w * pg)
        v_err = jnp.square(value - batch.target)
        if clip_value:
            v_clipped = batch.behaviour_value + jnp.clip(value - batch.behaviour_value, -clip_eps, clip_eps)
            v_err = jnp.maximum(v_err, jnp.square(v_clipped - batch.target))
        value_loss = 0.5 * jnp.mean(w * v_err)
        entropy = jnp.mean(w * D.entropy(dist))
        loss = policy_loss + vf_coef * value_loss - ent_coef * entropy
        sg = jax.lax.stop_gradient
        metrics = {
            "policy_loss": policy_loss,
            "value_loss": value_loss,
            "entropy": entropy,
            "approx_kl": sg(jnp.mean((ratio - 1) - (log_prob - batch.behaviour_log_prob))),
            "clip_frac": sg(jnp.mean((jnp.abs(ratio - 1) > clip_eps).astype(jnp.float32))),
        }
        return loss, metrics

    return loss_fn


def advantages(traj: Trajectory, last_value: jax.Array, gamma: float, lambda_: float):
    """GAE over a [T, B] trajectory; returns (advantage [T, B], target [T, B])."""
    v_tm1 = traj.behaviour_value
    v_t = jnp.concatenate([v_tm1[1:], last_value[None]], axis=0)
    r_t = traj.reward + gamma * traj.bootstrap_value
    discount_t = gamma * (1.0 - traj.done.astype(jnp.float32))
    adv = jax.vmap(gae, in_axes=(1, 1, None, 1, 1), out_axes=1)(r_t, discount_t, lambda_, v_tm1, v_t)
    return adv, adv + v_tm1


def make(config: Config, obs_shape: tuple[int, ...], action_spec: ActionSpec, *,
         correct_staleness: bool = True, policy: ActorCriticPolicy | None = None) -> Algorithm:
    """PPO for `config`. `correct_staleness=False` (fused mode, where tau is always 0)
    skips computing weights that would all be 1. `policy` replaces the default MLP
    actor-critic (IPPO passes its shared per-agent one)."""
    cfg = config.ppo
    policy = policy or actor_critic(config, obs_shape, action_spec)
    apply_fn, value = policy.apply, policy.value
    num_updates = max(config.total_env_steps // config.steps_per_update, 1)
    optimizer = make_optimizer(cfg.lr, cfg.max_grad_norm,
                               num_updates * cfg.num_epochs * cfg.num_minibatches, cfg.anneal_lr)
    loss_fn = make_loss(apply_fn, clip_eps=cfg.clip_eps, clip_value=cfg.clip_value,
                        vf_coef=cfg.vf_coef, ent_coef=cfg.ent_coef)

    def init(key):
        k_net, k_state = jax.random.split(key)
        return init_state(policy.init_params(k_net), optimizer, k_state)

    def update(state: LearnerState, traj: Trajectory):
        last_value = value(state.params, traj.last_obs)
        adv, target = advantages(traj, last_value, cfg.gamma, cfg.gae_lambda)
        T, B = traj.reward.shape
        n = T * B
        if correct_staleness:
            w, mask = S.staleness_weights(state.version, traj.version, config.staleness)
            dist, _ = apply_fn(state.params, traj.obs)
            rho = S.truncated_ratio(D.log_prob(dist, traj.action), traj.behaviour_log_prob,
                                    config.staleness.rho_bar)
            w = S.normalise(w * rho, mask) if config.staleness.normalise else w * rho
        else:
            w = jnp.ones((T, B), jnp.float32)
        flat = PPOBatch(traj.obs, traj.action, traj.behaviour_log_prob, traj.behaviour_value,
                        adv, target, w)
        flat = jax.tree.map(lambda x: x.reshape((n,) + x.shape[2:]), flat)
        mb = n // cfg.num_minibatches

        def epoch(carry, key):
            params, opt_state = carry
            perm = jax.random.permutation(key, n)
            shuffled = jax.tree.map(
                lambda x: jnp.take(x, perm, axis=0).reshape((cfg.num_minibatches, mb) + x.shape[1:]), flat)

            def minibatch(c, batch):
                p, o, m = gradient_step(loss_fn, optimizer, *c, batch)
                return (p, o), m

            return jax.lax.scan(minibatch, (params, opt_state), shuffled)

        key, sub = jax.random.split(state.key)
        (params, opt_state), metrics = jax.lax.scan(
            epoch, (state.params, state.opt_state),
            jax.random.split(sub, cfg.num_epochs))
        metrics = jax.tree.map(jnp.mean, metrics)
        metrics["weight_min"] = jnp.min(w)
        metrics["weight_max"] = jnp.max(w)
        new_state = state._replace(params=params, opt_state=opt_state, key=key,
                                   version=state.version + 1)
        return new_state, metrics

    return Algorithm("ppo", "onpolicy", init, policy.act, value, policy.greedy, guarded(update), loss_fn,
                     policy.network)

