"""Staleness weights: pure functions from versions to per-sample loss weights.

TianJi (He et al., arXiv 2502.20190) relaxes assignment dependencies, so a sample made by
policy version v may be learned from at learner version v + tau. TianJi bounds tau by
balancing production and consumption; tianjax also corrects for it inside the loss:

    tau_i   = max(0, learner_version - behaviour_version_i)
    w_i     = schedule(tau_i) * [tau_i <= max_staleness]      (no mask when max_staleness is None)
    rho_i   = min(rho_bar, pi_0(a_i | s_i) / mu(a_i | s_i))     (truncated importance ratio)

where mu is the behaviour policy and pi_0 the learner's policy when the batch is taken:
rho is a constant of the update (no gradient), and a decoupled loss (tianjax.algos.ppo.loss)
multiplies it in once, as part of the sample weight w_i * rho_i.

Normalisation (on by default): the weights of a batch are rescaled to mean 1 over the kept
samples, w_i <- w_i * n_kept / sum_j w_j, so staleness only redistributes credit between
the samples of a batch, and an all-fresh batch is weighted exactly 1 (so every corrected
loss equals its plain form when tau = 0).

What a weight cannot do: shrink the step. The optimizer is Adam, whose step m / sqrt(v) is
unchanged when every gradient is scaled by the same c > 0 (both moments scale with it; up
to Adam's eps): a batch weighted by a constant c, as every batch is under a forced lag,
moves the parameters as far as with weights 1, normalised or not. So the discount of a
batch that is stale as a whole goes on the step: with `scale_lr`, the update's learning
rate is multiplied by

    s = mean_{i kept} w_i        (the unnormalised schedule weights, before the importance ratio)

(`lr_scale`), e.g. (1 + K)^-power when every sample is K updates old. This is the step
size rule of asynchronous SGD with delayed gradients, where a gradient tau updates old
stays stable only for a step about 1 / tau times smaller (staleness-aware async SGD,
Zhang et al., 2016, divides the rate by tau); the polynomial schedule is a milder form.
It is off by default: in the forced-lag study (experiments/studies/staleness_robustness)
it never helped and cost at large lags, where the lag slowed learning rather than
destabilised it (docs/ideas.md).

The divergence schedule (`divergence`, PPO) weighs a version by how far its policy is from
pi_0 rather than by its age, as a bias-variance trade-off. A batch's gradient sums the
samples of several behaviour versions v; those of version v estimate the gradient at pi_0
with a bias b_v (the truncated ratio, states drawn from mu's distribution, advantages of
mu's continuation: each vanishes at mu = pi_0 and grows with their divergence; by Pinsker
|b_v|^2 <= beta^2 D_v for a divergence D_v) and a variance sigma^2 / n_v that the bounded
weights keep about the same for every version. The scale c_v of version v's contribution
that minimises E|c_v g_v - g|^2 for a true gradient g is, with n_v large,

    c_v = |g|^2 / (|g|^2 + |b_v|^2) = 1 / (1 + D_v / D*),        D* = |g|^2 / beta^2

and the divergence is measured on the batch itself, from the log-ratios it already has:

    D_v = mean_{i of version v} (log pi_0(a_i|s_i) - log mu(a_i|s_i))^2      (~ 2 KL(mu || pi_0))
    w_i = 1 / (1 + D_{v_i} / eps^2)

D* (which needs |g| and beta, unknown) is set to eps^2, the squared log-ratio at the edge of
PPO's clip range: a version whose actions sit on average at the trust region's edge
counts half. Unlike (1 + tau)^-a it does not discount old samples of a policy that has not
moved (late in a run, with an annealed learning rate), and it discounts more where the
policy moved fast. Normalised (the default), it only moves credit between the versions of
a mixed batch; a batch whose versions all moved far takes a smaller step only with
`scale_lr` (c_v applied as derived: `normalise: false` alone is divided out by Adam).

Diagnostics (`diagnostics`, in every update's metrics): tau's min, mean and max over the
batch; the effective sample size of the weights as a share of the batch,

    ess = (sum_i w_i)^2 / (N sum_i w_i^2)        (1: all equal; 1/N: one sample carries all)

the share of samples cut by PPO's behaviour clip, and the share dropped as too stale
(tau > max_staleness).
"""

from __future__ import annotations

from typing import Protocol

import jax
import jax.numpy as jnp
import numpy as np

from tianjax.config import StalenessConfig

Array = jax.Array


class Schedule(Protocol):
    """What schedule_weights reads: the staleness section's keys (groups' too, in rounds)."""

    schedule: str
    power: float
    kappa: float
    tau0: int
    max_staleness: int | None


def staleness(learner_version, behaviour_version):
    """tau = learner version - behaviour version, clipped at 0 (same shape as versions): the
    one definition, for the loss (JAX arrays in, a JAX array out) and for the runtime's
    bookkeeping on the host (ints or numpy arrays in, numpy out, no device op)."""
    if isinstance(learner_version, jax.Array) or isinstance(behaviour_version, jax.Array):
        tau = jnp.asarray(learner_version, jnp.int32) - jnp.asarray(behaviour_version).astype(
            jnp.int32
        )
        return jnp.maximum(tau, 0)
    return np.maximum(
        np.asarray(learner_version, np.int64) - np.asarray(behaviour_version, np.int64), 0
    )


def admissible(tau, max_staleness: int | None):
    """Whether a sample of staleness `tau` may be learned from: tau <= max_staleness, every
    sample when max_staleness is None (tau >= 0 always holds). The one rule, applied where
    a trajectory arrives, when the learner takes it from the pool, and in the loss's mask;
    elementwise on ints, numpy and JAX arrays."""
    if max_staleness is None:
        return tau >= 0
    return tau <= max_staleness


def step_versions_fault(versions, version: int, learner_version: int, time_axis: int = 0):
    """Why a trajectory's per-step behaviour versions cannot be true, or None where they can.

    An actor may take a newer version between two vector steps (runtime.param_refresh:
    step), so a trajectory holds several: each step is stamped with the version that chose
    its action. Honest stamps are non-decreasing along time (an actor only moves forward,
    and one whose learner restarted drops the rollout), their oldest is the trajectory's
    one `version` (the message header's: admission and the pool's order use it, so the
    bounds stay conservative), and none is newer than `learner_version` (no actor holds a
    version the learner has not made). Host-side numpy, no device op: the receiver keeps
    the versions on the host.

    Args:
      versions: int array with a time axis ([T, B] on-policy and host replay, [B, T] for
        Sequences: `time_axis` 1).
      version: the trajectory's one version (its header).
      learner_version: the learner's version now.
    Returns:
      None, or one of "negative", "decreasing", "not_oldest", "ahead".
    """
    v = np.asarray(versions, np.int64)
    if v.size == 0:
        return None if version >= 0 else "negative"
    if v.min() < 0 or version < 0:
        return "negative"
    if v.ndim and (np.diff(v, axis=time_axis) < 0).any():
        return "decreasing"
    if int(v.min()) != int(version):
        return "not_oldest"
    if int(v.max()) > int(learner_version):
        return "ahead"
    return None


def constant(tau: Array) -> Array:
    return jnp.ones_like(tau, jnp.float32)


def polynomial(tau: Array, power: float) -> Array:
    return (1.0 + tau.astype(jnp.float32)) ** (-power)


def exponential(tau: Array, kappa: float) -> Array:
    return jnp.exp(-tau.astype(jnp.float32) / kappa)


def hinge(tau: Array, tau0: int, power: float) -> Array:
    """1 up to tau0, then (1 + tau - tau0)^-power."""
    excess = jnp.maximum(tau.astype(jnp.float32) - tau0, 0.0)
    return (1.0 + excess) ** (-power)


def cutoff(tau: Array, max_staleness: int) -> Array:
    return admissible(tau, max_staleness).astype(jnp.float32)


def schedule_weights(tau: Array, cfg: Schedule) -> Array:
    """The unnormalised schedule w(tau), before the max_staleness mask."""
    if cfg.schedule == "constant":
        return constant(tau)
    if cfg.schedule == "polynomial":
        return polynomial(tau, cfg.power)
    if cfg.schedule == "exponential":
        return exponential(tau, cfg.kappa)
    if cfg.schedule == "hinge":
        return hinge(tau, cfg.tau0, cfg.power)
    if cfg.schedule == "cutoff":
        return cutoff(tau, cfg.max_staleness)
    raise ValueError(f"unknown staleness schedule {cfg.schedule!r}")


def divergence(tau: Array, log_ratio: Array, mask: Array, eps: float, groups: int = 256) -> Array:
    """w_i = 1 / (1 + D_{tau_i} / eps^2), D_tau the mean (log pi_0/mu)^2 over the kept samples
    of staleness tau (one behaviour version per tau in a batch); staleness from `groups` - 1
    up shares one group. Any shape, all alike; no gradient."""
    seg = jnp.clip(tau, 0, groups - 1).reshape(-1).astype(jnp.int32)
    d = jnp.square(jax.lax.stop_gradient(log_ratio)).reshape(-1) * mask.reshape(-1)
    sums = jax.ops.segment_sum(d, seg, num_segments=groups)
    counts = jax.ops.segment_sum(mask.reshape(-1).astype(jnp.float32), seg, num_segments=groups)
    mean = sums / jnp.maximum(counts, 1.0)
    return (1.0 / (1.0 + mean[seg] / (eps * eps))).reshape(tau.shape)


def normalise(weights: Array, mask: Array) -> Array:
    """Rescales `weights` to mean 1 over the samples where `mask` is set (0 elsewhere)."""
    w = weights * mask
    n_kept = jnp.sum(mask)
    total = jnp.sum(w)
    return jnp.where(total > 0, w * n_kept / jnp.maximum(total, 1e-12), w)


def staleness_weights(
    learner_version: Array | int,
    behaviour_version: Array,
    cfg: StalenessConfig,
    log_ratio: Array | None = None,
    eps: float = 0.2,
) -> tuple[Array, Array]:
    """Per-sample weights and keep-mask for a batch of any shape. The divergence schedule
    needs `log_ratio` (log pi_0/mu per sample, the batch's shape) and the clip range `eps`.

    Returns:
      weights: float32, same shape as `behaviour_version`, 0 where dropped.
      mask: float32, 1 where the sample is kept (tau <= max_staleness).
    """
    tau = staleness(jnp.asarray(learner_version, jnp.int32), behaviour_version)
    mask = admissible(tau, cfg.max_staleness).astype(jnp.float32)
    if cfg.schedule == "divergence":
        if log_ratio is None:
            raise ValueError("the divergence schedule needs each sample's log pi_0 / mu")
        w = divergence(tau, log_ratio, mask, eps) * mask
    else:
        w = schedule_weights(tau, cfg) * mask
    if cfg.normalise:
        w = normalise(w, mask)
    return jax.lax.stop_gradient(w), mask


def lr_scale(weights: Array, mask: Array) -> Array:
    """The mean of the unnormalised `weights` over the samples where `mask` is set (1 where
    none is): the factor `staleness.scale_lr` puts on an update's learning rate."""
    n_kept = jnp.sum(mask)
    mean = jnp.sum(weights * mask) / jnp.maximum(n_kept, 1.0)
    return jax.lax.stop_gradient(jnp.where(n_kept > 0, mean, 1.0))


def diagnostics(tau: Array, weight: Array, kept: Array | None, cut: Array | None) -> dict:
    """The staleness diagnostics of one batch (any shape, all alike): tau_min, tau_mean,
    tau_max, weight_ess (a share of the batch, see the module docstring), behaviour_clip_frac
    and stale_dropped_frac. `kept` None: nothing dropped; `cut` None: nothing cut."""
    tau = jnp.asarray(tau, jnp.float32)
    w = jnp.asarray(weight, jnp.float32)
    total, square = jnp.sum(w), jnp.sum(jnp.square(w))
    ess = jnp.where(square > 0, total * total / (w.size * jnp.maximum(square, 1e-30)), 0.0)
    zero = jnp.zeros((), jnp.float32)
    return jax.lax.stop_gradient(
        {
            "tau_min": jnp.min(tau),
            "tau_mean": jnp.mean(tau),
            "tau_max": jnp.max(tau),
            "weight_ess": ess,
            "behaviour_clip_frac": zero if cut is None else jnp.mean(cut.astype(jnp.float32)),
            # the mean of the dropped, not 1 - the mean of the kept: XLA's mean multiplies
            # by 1/n, inexact where n is no power of 2, and a batch that dropped nothing
            # came out at -3e-8
            "stale_dropped_frac": zero
            if kept is None
            else jnp.mean(1.0 - kept.astype(jnp.float32)),
        }
    )


def truncated_ratio(log_pi: Array, log_mu: Array, rho_bar: float) -> Array:
    """rho = min(rho_bar, pi / mu), computed from log-probabilities, without gradient."""
    return jax.lax.stop_gradient(jnp.minimum(rho_bar, jnp.exp(log_pi - log_mu)))


__all__ = [
    "admissible",
    "constant",
    "cutoff",
    "diagnostics",
    "divergence",
    "exponential",
    "hinge",
    "lr_scale",
    "Schedule",
    "normalise",
    "polynomial",
    "schedule_weights",
    "staleness",
    "staleness_weights",
    "step_versions_fault",
    "truncated_ratio",
]
