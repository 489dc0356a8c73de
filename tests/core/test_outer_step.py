"""The outer step of learner groups (tianjax/core/outer_step.py) on values computed by hand,
its reductions (one group is one learner; fresh deltas average to the groups' mean), and
its nesterov form against optax's SGD with Nesterov momentum on the outer gradient."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tianjax.config import GroupsConfig
from tianjax.core import outer_step as outer


def _step(state, deltas, tau, **cfg):
    groups = GroupsConfig(**{k: v for k, v in cfg.items() if k not in ("outer",)})
    return outer.outer_step(
        state,
        deltas,
        np.asarray(tau),
        outer=cfg.get("outer", "mean"),
        lr=groups.outer_lr,
        momentum=groups.outer_momentum,
        schedule=groups,
    )


def test_mean_of_two_fresh_deltas_by_hand():
    state = outer.init({"w": np.array([1.0, 2.0], np.float32)})
    deltas = [{"w": np.array([2.0, 0.0], np.float32)}, {"w": np.array([0.0, 4.0], np.float32)}]
    new, w = _step(state, deltas, [0, 0])
    np.testing.assert_array_equal(w, [0.5, 0.5])
    np.testing.assert_array_equal(new.average["w"], [2.0, 4.0])  # (1+2+1, 2+2+4) / 2
    assert int(new.round) == 1
    np.testing.assert_array_equal(new.momentum["w"], [0.0, 0.0])


def test_a_stale_delta_weighs_as_its_schedule_says():
    state = outer.init({"w": np.array([1.0, 2.0], np.float32)}, round=3)
    deltas = [{"w": np.array([2.0, 0.0], np.float32)}, {"w": np.array([0.0, 4.0], np.float32)}]
    # polynomial, power 1: w(0) = 1, w(1) = 1/2, normalised: 2/3 and 1/3
    new, w = _step(state, deltas, [0, 1], schedule="polynomial", power=1.0)
    np.testing.assert_allclose(w, [2 / 3, 1 / 3], rtol=1e-6)
    np.testing.assert_allclose(new.average["w"], [1 + 4 / 3, 2 + 4 / 3], rtol=1e-6)
    assert int(new.round) == 4
    # cutoff at 0 rounds: the stale one is dropped, the fresh one has the round to itself
    new, w = _step(state, deltas, [0, 1], schedule="cutoff", max_staleness=0)
    np.testing.assert_array_equal(w, [1.0, 0.0])
    np.testing.assert_array_equal(new.average["w"], [3.0, 2.0])
    # every delta dropped: no round
    new, w = _step(state, deltas, [2, 1], schedule="cutoff", max_staleness=0)
    np.testing.assert_array_equal(w, [0.0, 0.0])
    assert int(new.round) == 3
    np.testing.assert_array_equal(new.average["w"], [1.0, 2.0])


def test_nesterov_by_hand():
    state = outer.init({"w": np.array([1.0, -1.0], np.float32)})
    deltas = [{"w": np.array([1.0, 2.0], np.float32)}]
    new, _ = _step(state, deltas, [0], outer="nesterov", outer_lr=0.5, outer_momentum=0.5)
    # m1 = u = [1, 2]; average += 0.5 * (0.5 * m1 + u) = 0.75 u
    np.testing.assert_allclose(new.momentum["w"], [1.0, 2.0])
    np.testing.assert_allclose(new.average["w"], [1.75, 0.5])
    new, _ = _step(new, deltas, [0], outer="nesterov", outer_lr=0.5, outer_momentum=0.5)
    # m2 = 0.5 m1 + u = [1.5, 3]; average += 0.5 * (0.5 m2 + u) = [0.875, 1.75]
    np.testing.assert_allclose(new.momentum["w"], [1.5, 3.0])
    np.testing.assert_allclose(new.average["w"], [2.625, 2.25])


@pytest.mark.parametrize("jit", [False, True])
def test_nesterov_is_optax_sgd_with_nesterov_momentum_on_the_outer_gradient(jit):
    rng = np.random.default_rng(0)
    params = {"a": rng.normal(size=(3, 2)).astype(np.float32), "b": np.zeros(2, np.float32)}
    lr, mu = 0.7, 0.9
    sgd = optax.sgd(lr, momentum=mu, nesterov=True)
    ref, opt = params, sgd.init(params)
    state = outer.init(params)
    cfg = GroupsConfig(outer="nesterov", outer_lr=lr, outer_momentum=mu)

    def step(state, deltas):
        return outer.outer_step(
            state,
            deltas,
            np.zeros(len(deltas), np.int32),
            outer="nesterov",
            lr=lr,
            momentum=mu,
            schedule=cfg,
        )[0]

    step = jax.jit(step) if jit else step
    for _ in range(4):
        deltas = [jax.tree.map(lambda x: rng.normal(size=x.shape).astype(np.float32), params)]
        deltas.append(jax.tree.map(lambda x: rng.normal(size=x.shape).astype(np.float32), params))
        u = jax.tree.map(lambda x, y: 0.5 * x + 0.5 * y, *deltas)
        updates, opt = sgd.update(jax.tree.map(jnp.negative, u), opt)
        ref = optax.apply_updates(ref, updates)
        state = step(state, deltas)
        jax.tree.map(
            lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6),
            state.average,
            ref,
        )


def test_fresh_deltas_average_to_the_groups_mean():
    rng = np.random.default_rng(1)
    base = {"w": rng.normal(size=(4, 3)).astype(np.float32)}
    groups = [jax.tree.map(lambda x: x + rng.normal(size=x.shape).astype(np.float32), base)]
    groups += [jax.tree.map(lambda x: x + rng.normal(size=x.shape).astype(np.float32), base)]
    groups += [jax.tree.map(lambda x: x + rng.normal(size=x.shape).astype(np.float32), base)]
    state = outer.init(base)
    new, _ = _step(state, [outer.delta(g, base) for g in groups], [0, 0, 0])
    mean = np.mean([g["w"] for g in groups], axis=0)
    np.testing.assert_allclose(new.average["w"], mean, rtol=1e-5, atol=1e-6)
    # equal groups: the average is their parameters
    new, _ = _step(state, [outer.delta(groups[0], base)] * 3, [0, 0, 0])
    np.testing.assert_allclose(new.average["w"], groups[0]["w"], rtol=1e-6, atol=1e-6)


def test_merge_keeps_the_progress_since_the_reference_point():
    average = {"w": np.array([10.0, 20.0], np.float32)}
    params = {"w": np.array([3.0, 5.0], np.float32)}
    sent = {"w": np.array([2.0, 2.0], np.float32)}
    np.testing.assert_array_equal(outer.merge(average, params, sent)["w"], [11.0, 23.0])
    np.testing.assert_array_equal(outer.delta(params, sent)["w"], [1.0, 3.0])
    # merged right after sending: exactly the average
    np.testing.assert_array_equal(outer.merge(average, params, params)["w"], average["w"])


def test_one_group_that_sends_every_update_trains_as_one_learner_bit_for_bit():
    """Updates of dyadic sizes on dyadic parameters (every add and subtract exact): the
    group's parameters after each send, round and merge are the single learner's bit for
    bit, and the average is them."""
    rng = np.random.default_rng(2)
    theta0 = {"w": rng.integers(-64, 64, size=(5,)).astype(np.float32) / 8}
    cfg = GroupsConfig()
    state = outer.init(theta0)
    single, group, reference = theta0, theta0, theta0
    for _ in range(6):
        step = {"w": rng.integers(-8, 8, size=(5,)).astype(np.float32) / 16}
        single = jax.tree.map(lambda p, s: p + s, single, step)
        group = jax.tree.map(lambda p, s: jnp.asarray(p) + s, group, step)
        sent = group
        state, _ = outer.outer_step(
            state,
            [outer.delta(group, reference)],
            np.zeros(1, np.int32),
            outer="mean",
            lr=cfg.outer_lr,
            momentum=cfg.outer_momentum,
            schedule=cfg,
        )
        group = outer.merge(state.average, group, sent)
        reference = state.average
        np.testing.assert_array_equal(np.asarray(group["w"]), single["w"])
        np.testing.assert_array_equal(np.asarray(state.average["w"]), single["w"])
    assert int(state.round) == 6


def test_shapes_are_checked():
    state = outer.init({"w": np.zeros(2, np.float32)})
    with pytest.raises(AssertionError):
        _step(state, [{"w": np.zeros(3, np.float32)}], [0])
    with pytest.raises(AssertionError):
        outer.round_weights(np.zeros((1, 1), np.int32), GroupsConfig())
    with pytest.raises(ValueError, match="outer"):
        outer.outer_step(
            state,
            [{"w": np.zeros(2, np.float32)}],
            np.zeros(1, np.int32),
            outer="adam",
            lr=1.0,
            momentum=0.0,
            schedule=dataclasses.replace(GroupsConfig()),
        )
