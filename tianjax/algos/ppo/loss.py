"""PPO (Schulman et al., 2017) with its staleness corrections, so that samples made by a
behaviour policy many versions old are learned from with a trust region that holds.

Three policies meet in an async update: mu, the behaviour policy that acted (tau versions
old); pi_0, the learner's policy when the batch is taken; and pi_theta, the policy being
optimised. Every objective below is, over a minibatch of N samples,

    L(theta) = (1/N) sum_i w_i * [ pg_i(theta)
                                   + c_v * 1/2 max((V_theta(s_i) - G_i)^2,
                                                   (V_p(s_i) + clip(V_theta(s_i) - V_p(s_i), -eps, eps) - G_i)^2)
                                   - c_e * H(pi_theta(.|s_i)) ]

with the weight w_i (no gradient) on all three terms, entropy included, and A_i, G_i the
advantages and value targets of make_batch. What differs is pg_i, the trust region's
anchor and w_i (`ppo.correction`; `staleness.correct: false` is the textbook loss):

- textbook (`staleness.correct: false`; PPO as written, with mu standing for pi_0):
      pg_i = -min(r_i A_i, clip(r_i, 1 - eps, 1 + eps) A_i),   r_i = pi_theta / mu
      w_i = 1;  GAE with the behaviour critic V_mu, V_p = V_mu.
- decoupled (Hilton et al., 2021; AReaL's loss, Fu et al., arXiv 2505.24298, with its behaviour
  importance weight truncated instead of filtered):
      pg_i as textbook with r_i = pi_theta / pi_0 (the trust region around pi_0),
      w_i = normalise( w(tau_i) * min(rho_bar, pi_0/mu)_i * [tau_i <= max_staleness] )
  with `staleness.schedule: constant` (w(tau) = 1) this is AReaL's decoupled PPO; GAE with
  the learner's critic V_0, V_p = V_0. With `ppo.behaviour_clip` (decoupled only), also
      w_i <- w_i * (1 - m_i),  m_i = [A_i > 0 and pi_0/mu > 1 + eps_b] or [A_i < 0 and pi_0/mu < 1 - eps_b]
  with eps_b = `ppo.behaviour_clip_eps` (null: eps, and these are the samples the textbook
  clip, centred on mu, stops at the first step; not renormalised, so the gradient shrinks
  with the share cut). It is on by default
  (`behaviour_clip: null`): tianjax's correction is decoupled with the behaviour clip.
- a3po (A-3PO, arXiv 2512.06547: the proximal policy interpolated by version instead of
  computed): with alpha_i = tau_i / (tau_i + 1), i.e. (v_prox - v_mu) / (v_theta - v_mu)
  for v_prox = V the learner's version and v_theta = V + 1,
      log pi_prox,i = log mu_i + alpha_i * (sg(log pi_theta,i) - log mu_i)
      pg_i as textbook with r_i = pi_theta / pi_prox,i,
      w_i = normalise( w(tau_i) * [kept] ) * min(rho_bar, pi_prox,i / mu_i)
  (the importance factor is computed in the loss at each gradient step, from sg(pi_theta),
  as A-3PO does; at tau = 0, pi_prox = mu = pi_0). GAE with V_0, V_p = V_0.
- m2po (M2PO, Zheng et al., arXiv 2510.01161: a second-moment trust region, no ratio clip):
      pg_i = -M_i r_i A_i,   r_i = pi_theta / mu,
      M_i in {0, 1}: the largest (log r_j)^2 of the minibatch are masked, one at a time,
      until the mean of (log r)^2 over the samples kept is at most tau_M2 (`ppo.m2_threshold`,
      0.04 as in the paper); computed with sg(pi_theta) at every gradient step;
      w_i = normalise( w(tau_i) * [kept] ) (no importance weight: the ratio is against mu).
  GAE with V_0, V_p = V_0; the mean is over all N samples, masked ones included (the
  paper's 1 / sum |o_i|).

A_i = normalise_w(GAE_i), computed once per batch, before any minibatch or mask: GAE over
the trajectory with the critic named above (V(s_t), V(s_T) and V of the final observation
where a time limit cut an episode), then (GAE - mean_w GAE) / std_w GAE over the whole
[T, B] batch with the weights w_i (before the behaviour clip); G_i = GAE_i + V(s_i). With
`ppo.truncated_traces`, GAE_s = delta_s + gamma lambda c_{s+1} GAE_{s+1} with
c = min(1, pi_0/mu), so that mu's later actions count only as far as pi_0 would take them
(returns.traced_gae). The batch stores A_i normalised, and the loss uses it as stored: a
minibatch does not renormalise over its own samples, so what the behaviour mask is decided
on and what the loss multiplies are the same numbers.

The bias of the decoupled defaults. `staleness.rho_bar = 1`: the weight min(1, pi_0/mu) cuts
the ratio where pi_0 favours an action more than mu did, so such a sample counts as if
pi_0 = mu; the corrected gradient is that of a policy between mu and pi_0, biased towards mu
the more the two differ (V-trace's argument), in exchange for weights bounded by 1.
`staleness.normalise` on: the weights are rescaled to mean 1 over the kept samples
(self-normalised importance sampling), consistent but biased by O(1/N) on a finite batch.
GAE is not off-policy corrected (`ppo.truncated_traces` off): a stale trajectory's advantage
estimates what mu's continuation is worth under V_0, not pi_0's.

The step (`staleness.scale_lr`, decoupled, a3po and m2po). Adam divides out a constant
factor on the loss, so the weights above cannot make a batch that is stale as a whole take
a smaller step; with scale_lr each gradient step of the update uses the learning rate

    lr_t * s,    s = mean over the kept samples of w(tau_i) unnormalised (before min(rho_bar, .))

(tianjax.core.staleness.lr_scale; s = 1 when tau = 0, so the equivalence below holds).

Why decoupled. Its policy gradient at theta = theta_0 is -(1/N) sum_i w_i A_i grad log
pi_theta(a_i|s_i): the importance correction from mu to pi_0 enters exactly once, through
w_i. Taking the ratio against mu instead (the textbook form) centres the clip on mu, so a
sample whose mu is far from pi_0 is clipped, i.e. gets zero gradient, from the first step.

Equivalence: with tau = 0 and mu = pi_0 (fused mode without a forced lag) every w_i = 1,
pi_0 = pi_prox = mu and V_0 = the behaviour critic, so each corrected loss but m2po is plain
PPO's (m2po has no ratio clip, only its mask); `correct_staleness=False` builds the
textbook loss, with the behaviour log-probs and values standing in for pi_0 and V_0 (no
second forward pass).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import chex
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
    """Flat samples [N, ...] for one minibatch step (the prepared batch: [T, B, ...])."""

    obs: jax.Array
    action: jax.Array
    # [N] the log-prob the ratio is taken against: log pi_0 (decoupled), log mu (textbook,
    # m2po) or log mu that a3po's loss interpolates towards pi_theta
    prox_log_prob: jax.Array
    prox_value: jax.Array  # [N] V_p(s): the centre of the value clip
    advantage: jax.Array  # [N] GAE, normalised once over the whole batch with the weights
    target: jax.Array  # [N] value target G = GAE + V_p
    weight: jax.Array  # [N] w_i of the module docstring (1 when fresh)
    tau: jax.Array | None = None  # [N] staleness (float32): a3po's alpha, and the diagnostics
    kept: jax.Array | None = None  # [N] 1 where tau <= max_staleness (diagnostics)
    cut: jax.Array | None = None  # [N] 1 where the behaviour clip cut the sample (diagnostics)
    # [N] w(tau) before normalisation and the importance weight (staleness.scale_lr)
    schedule_weight: jax.Array | None = None


CORRECTIONS = ("decoupled", "a3po", "m2po")


def second_moment_mask(log_ratio: jax.Array, threshold: float) -> jax.Array:
    """M2PO's mask over [N] log-ratios log(pi_theta / mu): 1.0 for the samples kept, 0.0 for
    the largest (log r)^2 masked one at a time until the mean of (log r)^2 over those kept
    is at most `threshold`. Sorted ascending, the kept set is the k smallest, k the largest
    count whose prefix mean is within the threshold (prefix means of a sorted sequence only
    grow, so k is the number of them within it). No gradient."""
    chex.assert_rank(log_ratio, 1)
    m2 = jax.lax.stop_gradient(jnp.square(log_ratio))
    n = m2.shape[0]
    order = jnp.argsort(m2)
    prefix_mean = jnp.cumsum(m2[order]) / jnp.arange(1, n + 1, dtype=m2.dtype)
    k = jnp.sum(prefix_mean <= threshold)
    rank = jnp.zeros((n,), jnp.int32).at[order].set(jnp.arange(n, dtype=jnp.int32))
    return (rank < k).astype(jnp.float32)


def a3po_log_prox(log_theta: jax.Array, log_mu: jax.Array, tau: jax.Array) -> jax.Array:
    """A-3PO's proximal log-prob: log mu + alpha (sg(log pi_theta) - log mu), with
    alpha = tau / (tau + 1) (0 for fresh samples: pi_prox = mu = pi_0)."""
    alpha = tau / (tau + 1.0)
    return log_mu + alpha * (jax.lax.stop_gradient(log_theta) - log_mu)


def weighted_normalise(x: jax.Array, w: jax.Array, eps: float = 1e-8) -> jax.Array:
    """(x - mean_w x) / (std_w x + eps), with the weighted mean and (biased) std; samples of
    weight 0 do not count. Equals the plain normalisation when every weight is equal."""
    total = jnp.maximum(jnp.sum(w), 1e-12)
    mean = jnp.sum(w * x) / total
    var = jnp.sum(w * jnp.square(x - mean)) / total
    return (x - mean) / (jnp.sqrt(var) + eps)


def make_loss(
    apply_fn,
    *,
    clip_eps: float,
    clip_value: bool,
    vf_coef: float,
    ent_coef: float,
    correction: str = "decoupled",
    rho_bar: float = 1.0,
    m2_threshold: float = 0.04,
):
    """loss_fn(params, batch: PPOBatch) -> (loss, metrics): the objective of the module
    docstring for `correction` (decoupled's form serves textbook too: its batch carries mu
    and V_mu in place of pi_0 and V_0, and weights 1)."""
    if correction not in CORRECTIONS:
        raise ValueError(f"unknown PPO correction {correction!r} (known: {CORRECTIONS})")
    sg = jax.lax.stop_gradient

    def loss_fn(params, batch: PPOBatch):
        dist, value = apply_fn(params, batch.obs)
        log_prob = D.log_prob(dist, batch.action)
        w = sg(batch.weight)
        adv = batch.advantage  # normalised once over the batch by make_batch, never per minibatch
        extra = {}
        if correction == "a3po":
            log_prox = a3po_log_prox(log_prob, batch.prox_log_prob, batch.tau)
            w = w * sg(jnp.minimum(rho_bar, jnp.exp(log_prox - batch.prox_log_prob)))
        else:
            log_prox = batch.prox_log_prob
        log_ratio = log_prob - log_prox
        ratio = jnp.exp(log_ratio)
        if correction == "m2po":
            keep = second_moment_mask(log_ratio, m2_threshold)
            pg = -keep * ratio * adv
            extra["m2_masked_frac"] = 1.0 - jnp.mean(keep)
        else:
            pg = -jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - clip_eps, 1 + clip_eps) * adv)
        policy_loss = jnp.mean(w * pg)
        v_err = jnp.square(value - batch.target)
        if clip_value:
            v_clipped = batch.prox_value + jnp.clip(value - batch.prox_value, -clip_eps, clip_eps)
            v_err = jnp.maximum(v_err, jnp.square(v_clipped - batch.target))
        value_loss = 0.5 * jnp.mean(w * v_err)
        entropy = jnp.mean(w * D.entropy(dist))
        loss = policy_loss + vf_coef * value_loss - ent_coef * entropy
        metrics = {
            "policy_loss": policy_loss,
            "value_loss": value_loss,
            "entropy": entropy,
            "approx_kl": sg(jnp.mean((ratio - 1) - log_ratio)),  # KL(prox || pi_theta) estimate
            "clip_frac": sg(jnp.mean((jnp.abs(ratio - 1) > clip_eps).astype(jnp.float32))),
            **{k: sg(v) for k, v in extra.items()},
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

    Corrected (`ppo.correction`): pi_0 and V_0 are recomputed for every sample (one forward
    pass over the batch), the truncation bootstraps with V_0 of the stored final
    observations, and the weights are w(tau) (times min(rho_bar, pi_0 / mu) for decoupled),
    normalised over the kept samples. In both, the advantages are normalised once here,
    over the whole batch with its weights (before the behaviour mask), and stored so: the
    loss uses them as they are.
    Textbook (`correct_staleness=False`): the behaviour log-probs and values stand in for
    pi_0 and V_0 (in fused mode without a lag they are the same numbers), every weight 1.
    """
    cfg = config.ppo
    T, B = traj.reward.shape
    tau = S.staleness(jnp.asarray(state.version, jnp.int32), traj.version).astype(jnp.float32)
    log_mu = traj.behaviour_log_prob
    schedule_w = None  # w(tau) unnormalised, for staleness.scale_lr
    if correct_staleness:
        dist0, v0 = apply_fn(state.params, traj.obs)
        log_pi0 = D.log_prob(dist0, traj.action)
        w, mask = S.staleness_weights(
            state.version, traj.version, config.staleness, log_pi0 - log_mu, cfg.clip_eps
        )
        if config.staleness.scale_lr:
            raw = dataclasses.replace(config.staleness, normalise=False)
            schedule_w, _ = S.staleness_weights(
                state.version, traj.version, raw, log_pi0 - log_mu, cfg.clip_eps
            )
        _, last_v0 = apply_fn(state.params, traj.last_obs)
        _, trunc_v0 = apply_fn(state.params, traj.trunc_obs)  # [B]
        at_cut = jnp.arange(T)[:, None] == traj.trunc_t[None, :]
        boot = jnp.where(at_cut, trunc_v0[None, :], traj.bootstrap_value)
        traces = S.truncated_ratio(log_pi0, log_mu, 1.0) if cfg.truncated_traces else None
        if cfg.correction == "decoupled":
            w = w * S.truncated_ratio(log_pi0, log_mu, config.staleness.rho_bar)
            log_prox = log_pi0
        else:  # a3po interpolates from mu in the loss; m2po's ratio is against mu
            log_prox = log_mu
        w = S.normalise(w, mask) if config.staleness.normalise else w
    else:
        w, mask = sample_weights(False, state.version, traj.version, config.staleness)
        log_prox, v0, boot = log_mu, traj.behaviour_value, traj.bootstrap_value
        last_v0 = apply_fn(state.params, traj.last_obs)[1]
        traces = None
    sg = jax.lax.stop_gradient
    adv, target = advantages(traj, v0, last_v0, boot, cfg.gamma, cfg.gae_lambda, traces)
    # once, over the whole batch, before the mask: the mask below and the loss see the same
    # advantages, and dropping samples changes neither the others' weights nor their advantages
    adv = weighted_normalise(adv, w)
    cut = jnp.zeros_like(w)
    if correct_staleness and cfg.clips_behaviour:
        # the samples left keep their weights, so the gradient shrinks with the share the
        # learner has already acted on, as the textbook one does
        cut = already_moved(adv, log_pi0, log_mu, cfg.behaviour_clip_eps or cfg.clip_eps)
        w = w * (1.0 - cut)
    return PPOBatch(
        traj.obs,
        traj.action,
        sg(log_prox),
        sg(v0),
        sg(adv),
        sg(target),
        sg(w),
        sg(tau),
        sg(mask),
        sg(cut),
        None if schedule_w is None else sg(schedule_w),
    )


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
        # textbook (no correction) is decoupled's form over mu (make_batch)
        correction=cfg.correction if correct_staleness else "decoupled",
        rho_bar=config.staleness.rho_bar,
        m2_threshold=cfg.m2_threshold,
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
        if batch.schedule_weight is not None:  # staleness.scale_lr
            lrs = lrs * S.lr_scale(batch.schedule_weight, batch.kept)

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
        metrics.update(S.diagnostics(batch.tau, batch.weight, batch.kept, batch.cut))
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
    "CORRECTIONS",
    "PPOBatch",
    "a3po_log_prox",
    "advantages",
    "already_moved",
    "check_config",
    "make",
    "make_batch",
    "make_loss",
    "second_moment_mask",
    "weighted_normalise",
]
