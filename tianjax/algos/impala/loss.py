"""IMPALA (Espeholt et al., "IMPALA: Scalable Distributed Deep-RL with Importance Weighted
Actor-Learner Architectures", 2018): an actor-critic trained on V-trace targets.

V-trace is IMPALA's own off-policy correction: with rho_s = pi(a_s | x_s) / mu(a_s | x_s),
the value targets use the truncated ratios min(rho_bar, rho_s) and traces
c_s = min(c_bar, rho_s), and the policy gradient uses min(pg_rho_bar, rho_s) times the
V-trace advantage r_s + gamma * v_{s+1} - V(x_s). The behaviour policy mu is whatever
version produced the samples, so the same loss serves fused mode (mu = the params of the
previous update, tau = 0) and async mode (mu many versions old).

Staleness enters only as per-sample loss weights w_i = w(tau_i) from the staleness schedule
(tau_i = learner version - behaviour version, see tianjax.core.staleness), multiplying the
policy, value and entropy terms of every step. Unlike PPO, they are not multiplied by a
truncated ratio min(rho_bar, pi / mu): V-trace's clipping already is the importance
correction, and applying it twice would square it. With tau = 0 the weights are exactly 1
and the loss is the plain IMPALA loss.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tianjax.algos.common import check_schedule_by_age, sample_weights
from tianjax.algos.policy import actor_critic
from tianjax.config import Config, check_key
from tianjax.core import distributions as D
from tianjax.core import returns
from tianjax.core.algorithm import Algorithm
from tianjax.core.buffer_kind import ON_POLICY
from tianjax.core.staleness import diagnostics, staleness
from tianjax.core.types import ActionSpec, Trajectory
from tianjax.core.update import (
    LearnerState,
    gradient_step,
    guarded,
    init_state,
    learning_rate,
    lr_schedule,
    make_optimizer,
    step_progress,
)

# V-trace over the time axis of [T, B] inputs (lambda = 1, as in the paper).
_vtrace_tb = jax.vmap(returns.vtrace, in_axes=(1, 1, 1, 1, 1, None, None, None, None), out_axes=1)


def make_loss(
    apply_fn,
    *,
    gamma: float,
    rho_bar: float,
    c_bar: float,
    pg_rho_bar: float,
    vf_coef: float,
    ent_coef: float,
):
    """loss_fn(params, traj: Trajectory [T, B], weight [T, B]) -> (loss, metrics)."""

    def loss_fn(params, traj: Trajectory, weight: jax.Array):
        sg = jax.lax.stop_gradient
        dist, values = apply_fn(params, traj.obs)  # [T, B, ...], [T, B]
        _, last_value = apply_fn(params, traj.last_obs)  # [B]
        _, trunc_value = apply_fn(params, traj.trunc_obs)  # [B]
        log_pi = D.log_prob(dist, traj.action)  # [T, B]
        log_rho = sg(log_pi) - traj.behaviour_log_prob
        rho = jnp.exp(log_rho)
        # the time-limit bootstrap with the critic being trained, as every other value here
        at_cut = jnp.arange(traj.reward.shape[0])[:, None] == traj.trunc_t[None, :]
        boot = jnp.where(at_cut, sg(trunc_value)[None, :], traj.bootstrap_value)
        r_t = traj.reward + gamma * boot
        discount_t = gamma * (1.0 - traj.done.astype(jnp.float32))
        v_tm1 = sg(values)
        v_t = jnp.concatenate([v_tm1[1:], sg(last_value)[None]], axis=0)
        vt = _vtrace_tb(v_tm1, v_t, r_t, discount_t, rho, 1.0, rho_bar, c_bar, pg_rho_bar)
        vs = sg(vt.errors + v_tm1)  # the V-trace value targets

        w = sg(weight)
        policy_loss = -jnp.mean(w * vt.pg_advantage * log_pi)
        value_loss = 0.5 * jnp.mean(w * jnp.square(vs - values))
        entropy = jnp.mean(w * D.entropy(dist))
        loss = policy_loss + vf_coef * value_loss - ent_coef * entropy
        metrics = {
            "policy_loss": policy_loss,
            "value_loss": value_loss,
            "entropy": entropy,
            "rho_mean": jnp.mean(rho),
            "rho_max": jnp.max(rho),
            "rho_clip_frac": jnp.mean((rho > rho_bar).astype(jnp.float32)),
            "approx_kl": jnp.mean((rho - 1.0) - log_rho),
            "pg_advantage_mean": jnp.mean(vt.pg_advantage),
            "vs_mean": jnp.mean(vs),
            "value_mean": jnp.mean(v_tm1),
        }
        return loss, metrics

    return loss_fn


def split_batch(traj: Trajectory, weight: jax.Array, num_chunks: int):
    """Splits a [T, B] trajectory (and its [T, B] weights) into `num_chunks` contiguous
    chunks along B: fields become [num_chunks, T, B / num_chunks, ...] (last_obs
    [num_chunks, B / num_chunks, ...]). Whole trajectories stay together, as V-trace needs."""
    T, B = traj.reward.shape
    mb = B // num_chunks

    def tb(x):
        x = x.reshape((T, num_chunks, mb) + x.shape[2:])
        return jnp.swapaxes(x, 0, 1)

    per_env = ("last_obs", "trunc_obs", "trunc_t")
    fields = {k: tb(v) for k, v in traj._asdict().items() if k not in per_env}
    fields.update(
        {
            k: getattr(traj, k).reshape((num_chunks, mb) + getattr(traj, k).shape[1:])
            for k in per_env
        }
    )
    return Trajectory(**fields), tb(weight)


def check_config(config: Config) -> None:
    """The impala section against the run: the minibatches split the batch's width."""
    check_schedule_by_age(config)
    width = config.batch_trajectories * config.num_envs
    check_key(
        width % config.impala.num_minibatches == 0,
        "impala.num_minibatches",
        f"must divide the batch width (trajectories x num_envs) = {width}, got "
        f"{config.impala.num_minibatches}",
    )


def make(
    config: Config,
    obs_shape: tuple[int, ...],
    action_spec: ActionSpec,
    *,
    correct_staleness: bool = True,
) -> Algorithm:
    """IMPALA for `config`. `correct_staleness=False` (fused mode, where tau is always 0)
    skips computing weights that would all be 1."""
    cfg = config.impala
    policy = actor_critic(config, obs_shape, action_spec)
    apply_fn, value = policy.apply, policy.value
    num_updates = max(config.total_env_steps // config.steps_per_update, 1)
    optimizer = make_optimizer(cfg.lr, cfg.max_grad_norm)
    lr_at = lr_schedule(cfg.lr, cfg.anneal_lr, num_updates * config.steps_per_update)
    loss_fn = make_loss(
        apply_fn,
        gamma=cfg.gamma,
        rho_bar=cfg.rho_bar,
        c_bar=cfg.c_bar,
        pg_rho_bar=cfg.pg_rho_bar,
        vf_coef=cfg.vf_coef,
        ent_coef=cfg.ent_coef,
    )

    def init(key):
        k_net, k_state = jax.random.split(key)
        return init_state(policy.init_params(k_net), optimizer, k_state)

    def update(state: LearnerState, traj: Trajectory, fresh=True):
        """One update on a [T, B] batch; `fresh` False for a reuse pass (no progress).
        B may hold several actors' trajectories side by side; chunks split along it."""
        T, B = traj.reward.shape
        # V-trace's clipped ratios are the importance correction: weights are w(tau) only.
        w, kept = sample_weights(correct_staleness, state.version, traj.version, config.staleness)
        tau = staleness(jnp.asarray(state.version, jnp.int32), traj.version)
        chunks = split_batch(traj, w, cfg.num_minibatches)
        lrs = lr_at(step_progress(state.fresh_steps, fresh, T * B, cfg.num_minibatches))

        def minibatch(c, xs):
            (chunk, chunk_w), lr = xs
            p, o, m = gradient_step(loss_fn, optimizer, *c, chunk, chunk_w, lr=lr)
            return (p, o), m

        (params, opt_state), metrics = jax.lax.scan(
            minibatch, (state.params, state.opt_state), (chunks, lrs)
        )
        metrics = jax.tree.map(jnp.mean, metrics)
        metrics["weight_min"] = jnp.min(w)
        metrics["weight_max"] = jnp.max(w)
        metrics.update(diagnostics(tau, w, kept, None))
        metrics["lr"] = learning_rate(opt_state)
        fresh_steps = state.fresh_steps + jnp.asarray(fresh, jnp.int32) * (T * B)
        new_state = state._replace(
            params=params, opt_state=opt_state, version=state.version + 1, fresh_steps=fresh_steps
        )
        return new_state, metrics

    return Algorithm(
        "impala",
        ON_POLICY,
        init,
        policy.act,
        value,
        policy.greedy,
        guarded(update),
        loss_fn,
        policy.network,
    )


__all__ = ["check_config", "make", "make_loss", "split_batch"]
