import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tianjax.config import StalenessConfig
from tianjax.core import staleness as S


def test_staleness_is_learner_minus_behaviour_clipped_at_zero():
    tau = S.staleness(10, jnp.array([10, 7, 0, 12]))
    np.testing.assert_array_equal(tau, [0, 3, 10, 0])


TAU = jnp.arange(0, 9)


def test_schedule_shapes_known_values():
    np.testing.assert_allclose(S.constant(TAU), np.ones(9))
    np.testing.assert_allclose(S.polynomial(TAU, 1.0), 1.0 / (1.0 + np.arange(9)), rtol=1e-6)
    np.testing.assert_allclose(S.polynomial(jnp.array([3]), 0.5), [0.5], rtol=1e-6)
    np.testing.assert_allclose(
        S.exponential(jnp.array([0, 4, 8]), 4.0), np.exp([0, -1, -2]), rtol=1e-6
    )
    # hinge: 1 up to tau0 = 3, then (1 + tau - 3)^-1
    np.testing.assert_allclose(
        S.hinge(TAU, 3, 1.0), [1, 1, 1, 1, 1 / 2, 1 / 3, 1 / 4, 1 / 5, 1 / 6], rtol=1e-6
    )
    np.testing.assert_allclose(S.cutoff(TAU, 4), [1, 1, 1, 1, 1, 0, 0, 0, 0])


@pytest.mark.parametrize("schedule", ["polynomial", "exponential", "hinge"])
def test_decaying_schedules_are_monotone_and_start_at_one(schedule):
    w = np.asarray(S.schedule_weights(TAU, StalenessConfig(schedule=schedule)))
    assert w[0] == pytest.approx(1.0)
    assert np.all(np.diff(w) <= 1e-7) and w[-1] < 1.0


@pytest.mark.parametrize("jit", [False, True])
def test_weights_with_zero_staleness_are_exactly_one(jit):
    cfg = StalenessConfig(schedule="exponential", kappa=2.0, max_staleness=3)
    f = jax.jit(S.staleness_weights, static_argnums=2) if jit else S.staleness_weights
    w, mask = f(5, jnp.full((4, 3), 5, jnp.int32), cfg)
    np.testing.assert_array_equal(w, np.ones((4, 3)))
    np.testing.assert_array_equal(mask, np.ones((4, 3)))


def test_max_staleness_drops_and_normalisation_keeps_mean_one():
    cfg = StalenessConfig(schedule="polynomial", power=1.0, max_staleness=2, normalise=True)
    w, mask = S.staleness_weights(4, jnp.array([4, 3, 2, 0]), cfg)  # tau = 0, 1, 2, 4
    np.testing.assert_array_equal(mask, [1, 1, 1, 0])
    raw = np.array([1, 1 / 2, 1 / 3])
    np.testing.assert_allclose(w, np.append(raw * 3 / raw.sum(), 0), rtol=1e-6)
    assert float(jnp.sum(w)) == pytest.approx(3.0)


def test_unnormalised_weights_are_the_schedule():
    cfg = StalenessConfig(schedule="polynomial", power=1.0, normalise=False)
    w, _ = S.staleness_weights(4, jnp.array([4, 3, 2, 0]), cfg)
    np.testing.assert_allclose(w, [1, 1 / 2, 1 / 3, 1 / 5], rtol=1e-6)


def test_all_dropped_batch_gives_zero_weights_not_nan():
    cfg = StalenessConfig(max_staleness=0)
    w, mask = S.staleness_weights(9, jnp.array([1, 2]), cfg)
    np.testing.assert_array_equal(w, [0, 0])
    np.testing.assert_array_equal(mask, [0, 0])


def test_truncated_ratio():
    log_pi = jnp.log(jnp.array([0.5, 0.2, 0.9]))
    log_mu = jnp.log(jnp.array([0.25, 0.4, 0.9]))
    np.testing.assert_allclose(S.truncated_ratio(log_pi, log_mu, 1.0), [1.0, 0.5, 1.0], rtol=1e-6)
    np.testing.assert_allclose(S.truncated_ratio(log_pi, log_mu, 3.0), [2.0, 0.5, 1.0], rtol=1e-6)


def test_divergence_weight_is_one_over_one_plus_the_versions_second_moment_over_eps_squared():
    # two versions: tau 0 (log-ratios 0, 0) and tau 3 (log-ratios 0.2, -0.4, and a dropped one)
    tau = jnp.array([0, 0, 3, 3, 3])
    log_ratio = jnp.array([0.0, 0.0, 0.2, -0.4, 5.0])
    mask = jnp.array([1.0, 1.0, 1.0, 1.0, 0.0])
    w = S.divergence(tau, log_ratio, mask, eps=0.2)
    d3 = (0.2**2 + 0.4**2) / 2  # the dropped sample does not count
    np.testing.assert_allclose(w, [1, 1] + [1 / (1 + d3 / 0.04)] * 3, rtol=1e-6)
    # through staleness_weights: the last sample (tau 4) is dropped by max_staleness 3
    cfg = StalenessConfig(schedule="divergence", max_staleness=3, normalise=False)
    w2, kept = S.staleness_weights(5, 5 - jnp.array([0, 0, 3, 3, 4]), cfg, log_ratio, 0.2)
    np.testing.assert_array_equal(kept, mask)
    np.testing.assert_allclose(w2, np.asarray(w) * np.asarray(mask), rtol=1e-6)
    with pytest.raises(ValueError, match="divergence"):
        S.staleness_weights(5, 5 - tau, cfg)


def test_step_versions_fault_known_values():
    """Honest per-step stamps: non-decreasing along time, the oldest in the header, none
    newer than the learner. [T, B] on-policy (time axis 0) and [B, T] sequences (axis 1)."""
    honest = np.array([[3, 3], [3, 3], [4, 4], [5, 5]])  # [T=4, B=2]: two refreshes mid-rollout
    assert S.step_versions_fault(honest, 3, 5) is None
    assert S.step_versions_fault(honest, 3, 9) is None
    assert S.step_versions_fault(honest.T, 3, 5, time_axis=1) is None
    assert S.step_versions_fault(np.full((4, 2), 7), 7, 7) is None  # one version: today's layout
    assert S.step_versions_fault(honest[::-1], 3, 5) == "decreasing"
    assert S.step_versions_fault(honest[::-1].T, 3, 5, time_axis=1) == "decreasing"
    assert S.step_versions_fault(honest, 4, 5) == "not_oldest"  # a header that is not the min
    assert S.step_versions_fault(honest, 2, 5) == "not_oldest"
    assert S.step_versions_fault(honest, 3, 4) == "ahead"  # step 3 used a version not yet made
    assert S.step_versions_fault(honest - 4, -1, 5) == "negative"
    assert S.step_versions_fault(honest, -1, 5) == "negative"


def test_lr_scale_is_the_mean_weight_over_the_kept_samples_and_one_when_none_is():
    w = jnp.array([0.5, 1.0, 0.25, 2.0])
    kept = jnp.array([1.0, 1.0, 1.0, 0.0])  # the last is dropped: its weight does not count
    assert float(S.lr_scale(w, kept)) == pytest.approx((0.5 + 1.0 + 0.25) / 3)
    assert float(S.lr_scale(w, jnp.zeros(4))) == 1.0


def test_diagnostics_known_values_and_a_batch_that_dropped_nothing_is_exactly_zero():
    # 1,536 samples (3 trajectories of 16 x 32): 1/1,536 is inexact in float32, and
    # 1 - mean(kept) came out at -3e-8 under jit
    kept = jnp.ones((3, 16, 32), bool)
    tau = jnp.zeros(kept.shape).at[0, 0, :4].set(jnp.array([1.0, 2.0, 3.0, 6.0]))
    w = jnp.ones(kept.shape)
    d = jax.jit(S.diagnostics)(tau, w, kept, kept.at[1].set(False))
    assert float(d["stale_dropped_frac"]) == 0.0
    assert float(d["tau_min"]) == 0 and float(d["tau_max"]) == 6
    assert float(d["tau_mean"]) == pytest.approx(12 / 1536)
    assert float(d["behaviour_clip_frac"]) == pytest.approx(2 / 3)
    assert float(d["weight_ess"]) == pytest.approx(1.0)
    # a quarter dropped; ess of weights (2, 0, 0, 0) is 4 / (4 * 4) of the batch
    d = S.diagnostics(jnp.zeros(4), jnp.array([2.0, 0, 0, 0]), jnp.array([1, 1, 1, 0], bool), None)
    assert float(d["stale_dropped_frac"]) == 0.25 and float(d["weight_ess"]) == 0.25
