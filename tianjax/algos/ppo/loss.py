"""PPO (Schulman et al., 2017) in its decoupled form (Hilton et al., 2021, "Batch
size-invariance for policy optimization"), so that stale samples are corrected once.

Three policies meet in an async update: mu, the behaviour policy that acted (any number of
versions old); pi_0, the learner's policy when the batch is taken (the proximal policy);
and pi_theta, the policy being optimised. The objective over a batch of N samples is

    L(theta) = (1/N) sum_i w_i * [ -min(r_i A_i, clip(r_i, 1 - eps, 1 + eps) A_i)
                                   + c_v * 1/2 max((V_theta(s_i) - G_i)^2,
                                                   (V_0(s_i) + clip(V_theta(s_i) - V_0(s_i), -eps, eps) - G_i)^2)
                                   - c_e * H(pi_theta(.|s_i)) ]

    r_i = pi_theta(a_i|s_i) / pi_0(a_i|s_i)                   (trust region around pi_0)
    w_i = normalise( w(tau_i) * min(rho_bar, pi_0(a_i|s_i) / mu(a_i|s_i)) )    (no gradient)
    A_i = normalise_w( GAE_i ), computed once per batch, before any minibatch or mask:
          GAE over the trajectory with the learner's current critic V_0 throughout
          (V_0(s_t), V_0(s_T) and V_0 of the final observation where a time limit cut an
          episode), then (GAE - mean_w GAE) / std_w GAE over the whole [T, B] batch with the
          weights w_i; with `ppo.truncated_traces`, GAE_s = delta_s + gamma lambda c_{s+1}
          GAE_{s+1} with c = min(1, pi_0/mu), so that mu's later actions count only as far
          as pi_0 would take them (returns.traced_gae; A_s itself is reweighted once, by w_s),
    G_i = GAE_i (before normalisation) + V_0(s_i)

The batch stores A_i already normalised, and the loss uses it as stored: a minibatch does
not renormalise over its own samples, so what the behaviour mask below is decided on and
what the loss multiplies are the same numbers.

The bias of the defaults (set in config/runtime.py StalenessConfig and config/algos.py
PPOConfig). `staleness.rho_bar = 1`: the weight min(1, pi_0/mu) cuts the ratio where pi_0
favours an action more than mu did, so such a sample counts as if pi_0 = mu; the corrected
gradient is that of a policy between mu and pi_0, biased towards mu the more the two differ
(V-trace's argument), in exchange for weights bounded by 1. `staleness.normalise` on: the
weights are rescaled to mean 1 (self-normalised importance sampling), consistent but biased
by O(1/N) on a finite batch, and the step no longer shrinks with the mass the truncation
removed. GAE is not off-policy corrected (`ppo.truncated_traces` off): A_s sums the TD errors
of mu's later actions at full weight, so a stale trajectory's advantage estimates what mu's
continuation is worth under V_0, not pi_0's; the bias grows with tau and vanishes when
mu = pi_0 (fused and sync modes).

Why this form. The gradient of the clipped term at theta = theta_0 is
-(1/N) sum_i w_i A_i grad log pi_theta(a_i|s_i): the importance correction from mu to pi_0
enters exactly once, through w_i. Taking the ratio against mu instead (the textbook form)
makes the first step's ratio pi_0/mu, which the weight multiplies in again (rho^2), and
centres the clip on mu, so a sample whose mu is far from pi_0 is clipped, i.e. gets zero
gradient, from the first step. The proximal policy pi_0 is what the trust region is about;
mu only decides how much each sample counts.

With `ppo.behaviour_clip`, a sample whose pi_0 has already moved past the clip range from
mu in the direction of its advantage is dropped:

    w_i <- w_i * (1 - m_i),   m_i = [A_i > 0 and pi_0/mu > 1 + eps] or [A_i < 0 and pi_0/mu < 1 - eps]

(A_i the stored, batch-normalised advantage; the weights are not renormalised after the
mask, and neither are the advantages, so the step shrinks with the share dropped). These
are exactly the samples the textbook clip, centred on mu, gives no gradient at the first
step. At high staleness mu's advantages keep pointing where the learner has already gone:
the updates between mu and pi_0 acted on samples of the same era, and without a reference
to mu each stale batch pushes further (measured in experiments/studies/staleness_weighting).
The trust region of the epochs stays around pi_0; where mu = pi_0 no sample is dropped.

Equivalence: with tau = 0 and mu = pi_0 (fused mode) every w_i = 1, pi_0 = mu and V_0 = the
behaviour critic, so the loss is plain PPO's; `correct_staleness=False` builds exactly
that, with the behaviour log-probs and values standing in for pi_0 and V_0 (no second
forward pass).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from tianjax.algos.common import sample_weights
from tianjax.algos.policy import ActorCriticPolicy, actor_critic
from tianjax.config import Config, check_key
from tianjax.core import distributions as D
from tianjax.core import shuffle
from tianjax.core import staleness as S
from tianjax.core.algorithm import Algorithm
from tianjax.core.buffer_kind import ON_POLICY
from tianjax.core.returns import gae, traced_gae
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


class PPOBatch(NamedTuple):
    """Flat samples [N, ...] for one minibatch step."""

    obs: jax.Array
    action: jax.Array
    prox_log_prob: jax.Array  # [N] log pi_0(a|s): the proximal policy of the clip
    prox_value: jax.Array  # [N] V_0(s): the centre of the value clip
    advantage: jax.Array  # [N] GAE with V_0, normalised once over the whole batch with the weights
    target: jax.Array  # [N] value target G = advantage + V_0
    weight: jax.Array  # [N] w(tau) * min(rho_bar, pi_0 / mu), normalised (1 when fresh)


def weighted_normalise(x: jax.Array, w: jax.Array, eps: float = 1e-8) -> jax.Array:
    """(x - mean_w x) / (std_w x + eps), with the weighted mean and (biased) std; samples of
    weight 0 do not count. Equals the plain normalisation when every weight is equal."""
    total = jnp.maximum(jnp.sum(w), 1e-12)
    mean = jnp.sum(w * x) / total
    var = jnp.sum(w * jnp.square(x - mean)) / total
    return (x - mean) / (jnp.sqrt(var) + eps)


def make_loss(apply_fn, *, clip_eps: float, clip_value: bool, vf_coef: float, ent_coef: float):
    """loss_fn(params, batch: PPOBatch) -> (loss, metrics)."""

    def loss_fn(params, batch: PPOBatch):
        dist, value = apply_fn(params, batch.obs)
        log_prob = D.log_prob(dist, batch.action)
        w = jax.lax.stop_gradient(batch.weight)
        adv = batch.advantage  # normalised once over the batch by make_batch, never per minibatch
        log_ratio = log_prob - batch.prox_log_prob
        ratio = jnp.exp(log_ratio)
        pg = -jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - clip_eps, 1 + clip_eps) * adv)
        policy_loss = jnp.mean(w * pg)
        v_err = jnp.square(value - batch.target)
        if clip_value:
            v_clipped = batch.prox_value + jnp.clip(value - batch.prox_value, -clip_eps, clip_eps)
            v_err = jnp.maximum(v_err, jnp.square(v_clipped - batch.target))
        value_loss = 0.5 * jnp.mean(w * v_err)
        entropy = jnp.mean(w * D.entropy(dist))
        loss = policy_loss + vf_coef * value_loss - ent_coef * entropy
        sg = jax.lax.stop_gradient
        metrics = {
            "policy_loss": policy_loss,
            "value_loss": value_loss,
            "entropy": entropy,
            "approx_kl": sg(jnp.mean((ratio - 1) - log_ratio)),  # KL(pi_0 || pi_theta) estimate
            "clip_frac": sg(jnp.mean((jnp.abs(ratio - 1) > clip_eps).astype(jnp.float32))),
        }
        return loss, metrics

    return loss_fn


def advantages(
    traj: Trajectory,
    values: jax.Array,
    last_value: jax.Array,
    bootstrap_value: jax.Array,
    gamma: float,
    lambda_: float,
    traces: jax.Array | None = None,
):
    """GAE over a [T, B] trajectory with one critic's values: V(s_t) `values` [T, B], V(s_T)
    `last_value` [B], and V(final obs) where truncated `bootstrap_value` [T, B] (0 elsewhere).
    `traces` [T, B]: per-step trace coefficients c_t (returns.traced_gae), or None for 1.
    Returns (advantage [T, B], target [T, B])."""
    v_tm1 = values
    v_t = jnp.concatenate([v_tm1[1:], last_value[None]], axis=0)
    r_t = traj.reward + gamma * bootstrap_value
    discount_t = gamma * (1.0 - traj.done.astype(jnp.float32))
    if traces is None:
        adv = jax.vmap(gae, in_axes=(1, 1, None, 1, 1), out_axes=1)(
            r_t, discount_t, lambda_, v_tm1, v_t
        )
    else:
        # the coefficient of the step after each one (the last bootstraps from V(s_T))
        c_next = jnp.concatenate([traces[1:], jnp.ones_like(traces[:1])], axis=0)
        adv = jax.vmap(traced_gae, in_axes=(1, 1, None, 1, 1, 1), out_axes=1)(
            r_t, discount_t, lambda_, v_tm1, v_t, c_next
        )
    return adv, adv + v_tm1


def already_moved(
    adv: jax.Array, log_pi0: jax.Array, log_mu: jax.Array, clip_eps: float
) -> jax.Array:
    """1.0 where pi_0 has already moved past the clip range from mu in the direction of the
    sample's (batch-normalised, as stored) advantage: A > 0 and pi_0/mu > 1 + eps, or A < 0
    and pi_0/mu < 1 - eps; else 0.0. These are the samples the textbook clip (centred on mu)
    gives no gradient at the first step: the learner has acted on what they say."""
    r0 = jnp.exp(log_pi0 - log_mu)
    return (((adv > 0) & (r0 > 1 + clip_eps)) | ((adv < 0) & (r0 < 1 - clip_eps))).astype(
        jnp.float32
    )


def make_batch(
    apply_fn, config: Config, state: LearnerState, traj: Trajectory, *, correct_staleness: bool
) -> PPOBatch:
    """The [T, B] PPOBatch of one update, taken at the learner's params pi_0 = state.params.

    Corrected: pi_0 and V_0 are recomputed for every sample (one forward pass over the
    batch), the truncation bootstraps with V_0 of the stored final observations, and the
    weights are w(tau) * min(rho_bar, pi_0 / mu), normalised over the kept samples.
    In both, the advantages are normalised once here, over the whole batch with its weights
    (before the behaviour mask), and stored so: the loss uses them as they are.
    Plain: the behaviour log-probs and values stand in for pi_0 and V_0 (fused mode, where
    they are the same numbers) and every weight is 1.
    """
    cfg = config.ppo
    T, B = traj.reward.shape
    w, mask = sample_weights(correct_staleness, state.version, traj.version, config.staleness)
    if correct_staleness:
        dist0, v0 = apply_fn(state.params, traj.obs)
        log_pi0 = D.log_prob(dist0, traj.action)
        _, last_v0 = apply_fn(state.params, traj.last_obs)
        _, trunc_v0 = apply_fn(state.params, traj.trunc_obs)  # [B]
        at_cut = jnp.arange(T)[:, None] == traj.trunc_t[None, :]
        boot = jnp.where(at_cut, trunc_v0[None, :], traj.bootstrap_value)
        rho = S.truncated_ratio(log_pi0, traj.behaviour_log_prob, config.staleness.rho_bar)
        traces = (
            S.truncated_ratio(log_pi0, traj.behaviour_log_prob, 1.0)
            if cfg.truncated_traces
            else None
        )
        w = S.normalise(w * rho, mask) if config.staleness.normalise else w * rho
    else:
        log_pi0, v0, boot = traj.behaviour_log_prob, traj.behaviour_value, traj.bootstrap_value
        last_v0 = apply_fn(state.params, traj.last_obs)[1]
        traces = None
    sg = jax.lax.stop_gradient
    adv, target = advantages(traj, v0, last_v0, boot, cfg.gamma, cfg.gae_lambda, traces)
    # once, over the whole batch, before the mask: the mask below and the loss see the same
    # advantages, and dropping samples changes neither the others' weights nor their advantages
    adv = weighted_normalise(adv, w)
    if correct_staleness and cfg.behaviour_clip:
        # the samples left keep their weights, so the step shrinks with the share the learner
        # has already acted on, as the textbook one does
        w = w * (1.0 - already_moved(adv, log_pi0, traj.behaviour_log_prob, cfg.clip_eps))
    return PPOBatch(traj.obs, traj.action, sg(log_pi0), sg(v0), sg(adv), sg(target), sg(w))


def check_config(config: Config) -> None:
    """The ppo section against the run (ppo and ippo): the minibatches split the batch."""
    batch = config.steps_per_update
    check_key(
        batch % config.ppo.num_minibatches == 0,
        "ppo.num_minibatches",
        f"must divide the batch (trajectories x num_envs x rollout_len) = {batch}, got "
        f"{config.ppo.num_minibatches} (a minibatch cannot be larger than the batch "
        "and all minibatches have one size)",
    )


def make(
    config: Config,
    obs_shape: tuple[int, ...],
    action_spec: ActionSpec,
    *,
    correct_staleness: bool = True,
    policy: ActorCriticPolicy | None = None,
    samples_per_step: int = 1,
) -> Algorithm:
    """PPO for `config`. `correct_staleness=False` (fused mode, where tau is always 0 and
    mu = pi_0) skips computing weights that would all be 1. `policy` replaces the default
    MLP actor-critic, and `samples_per_step` is how many samples (columns of the batch) one
    env step gives, for progress in env steps (IPPO: its shared per-agent policy, N agents)."""
    cfg = config.ppo
    policy = policy or actor_critic(config, obs_shape, action_spec)
    apply_fn, value = policy.apply, policy.value
    num_updates = max(config.total_env_steps // config.steps_per_update, 1)
    optimizer = make_optimizer(cfg.lr, cfg.max_grad_norm, cfg.lr_base_width)
    lr_at = lr_schedule(cfg.lr, cfg.anneal_lr, num_updates * config.steps_per_update)
    loss_fn = make_loss(
        apply_fn,
        clip_eps=cfg.clip_eps,
        clip_value=cfg.clip_value,
        vf_coef=cfg.vf_coef,
        ent_coef=cfg.ent_coef,
    )
    num_grad = cfg.num_epochs * cfg.num_minibatches

    def init(key):
        k_net, k_state = jax.random.split(key)
        return init_state(policy.init_params(k_net), optimizer, k_state)

    def prepare(state: LearnerState, traj: Trajectory) -> PPOBatch:
        return make_batch(apply_fn, config, state, traj, correct_staleness=correct_staleness)

    def learn(state: LearnerState, batch: PPOBatch, fresh=True):
        """The epochs over a prepared [T, B] batch; `fresh` False for a reuse pass, which
        makes no progress on the schedules and keeps the batch's proximal policy pi_0 (a
        reuse pass is more epochs over the same batch, inside the same trust region)."""
        T, B = batch.advantage.shape
        n = T * B
        flat = jax.tree.map(lambda x: x.reshape((n,) + x.shape[2:]), batch)
        mb = n // cfg.num_minibatches
        steps = n // samples_per_step  # env steps in the batch
        lrs = lr_at(step_progress(state.fresh_steps, fresh, steps, num_grad)).reshape(
            cfg.num_epochs, cfg.num_minibatches
        )

        def epoch(carry, xs):
            key, epoch_lrs = xs
            with jax.named_scope("shuffle"):
                perm = shuffle.permutation(
                    key, n
                )  # uniform, as jax.random.permutation, and cheaper on CPU
                shuffled = jax.tree.map(
                    lambda x: jnp.take(x, perm, axis=0).reshape(
                        (cfg.num_minibatches, mb) + x.shape[1:]
                    ),
                    flat,
                )

            def minibatch(c, xs):
                mbatch, lr = xs
                p, o, m = gradient_step(loss_fn, optimizer, *c, mbatch, lr=lr)
                return (p, o), m

            return jax.lax.scan(minibatch, carry, (shuffled, epoch_lrs))

        key, sub = jax.random.split(state.key)
        (params, opt_state), metrics = jax.lax.scan(
            epoch, (state.params, state.opt_state), (jax.random.split(sub, cfg.num_epochs), lrs)
        )
        metrics = jax.tree.map(jnp.mean, metrics)
        metrics["weight_min"] = jnp.min(batch.weight)
        metrics["weight_max"] = jnp.max(batch.weight)
        metrics["lr"] = learning_rate(opt_state)
        fresh_steps = state.fresh_steps + jnp.asarray(fresh, jnp.int32) * steps
        new_state = state._replace(
            params=params,
            opt_state=opt_state,
            key=key,
            version=state.version + 1,
            fresh_steps=fresh_steps,
        )
        return new_state, metrics

    def update(state: LearnerState, traj: Trajectory, fresh=True):
        """One update on a [T, B] trajectory batch taken at state.params (pi_0)."""
        with jax.named_scope("advantages"):
            batch = prepare(state, traj)
        return learn(state, batch, fresh)

    return Algorithm(
        "ppo",
        ON_POLICY,
        init,
        policy.act,
        value,
        policy.greedy,
        guarded(update),
        loss_fn,
        policy.network,
        prepare=prepare,
        learn=guarded(learn),
    )


__all__ = [
    "PPOBatch",
    "advantages",
    "already_moved",
    "check_config",
    "make",
    "make_batch",
    "make_loss",
    "weighted_normalise",
]
