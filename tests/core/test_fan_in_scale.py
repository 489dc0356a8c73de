"""ppo.lr_base_width: a wider dense layer's Adam step scaled by base_width / fan_in."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tianjax
from tianjax.algos import make_algorithm
from tianjax.core.fused_loop import make_fused
from tianjax.core.update import fan_in_scale, make_optimizer, with_learning_rate
from tianjax.envs.gymnax_env import make_gymnax


@pytest.mark.parametrize(
    "shape, base, factor",
    [
        ((256, 64), 64, 0.25),  # a hidden layer fed by 256 units
        ((256, 2), 64, 0.25),  # a head on a 256-wide torso
        ((100, 7), 50, 0.5),
        ((64, 64), 64, 1.0),  # as wide as the base: unchanged
        ((4, 256), 64, 1.0),  # the input layer of a 4-d observation
        ((256,), 64, 1.0),  # a bias
        ((3, 3, 4, 32), 8, 1.0),  # a convolution kernel
        ((256, 64), None, 1.0),
    ],
)
def test_factor_by_hand(shape, base, factor):
    assert fan_in_scale(shape, base) == factor


def test_the_first_step_of_a_wide_kernel_is_a_quarter():
    """Adam's first step is lr * g / (|g| + eps) per weight; scaled, a 256-input kernel moves
    a quarter of that, a 64-input one and a bias exactly as far."""
    params = {"wide": jnp.ones((256, 3)), "narrow": jnp.ones((64, 3)), "bias": jnp.ones((3,))}
    grads = jax.tree.map(lambda p: jnp.linspace(-1.0, 2.0, p.size).reshape(p.shape), params)
    plain, scaled = make_optimizer(1e-2, 1e9), make_optimizer(1e-2, 1e9, base_width=64)
    u_plain, _ = plain.update(grads, plain.init(params), params)
    u_scaled, state = scaled.update(grads, scaled.init(params), params)
    np.testing.assert_allclose(u_scaled["wide"], 0.25 * u_plain["wide"], rtol=1e-6)
    np.testing.assert_array_equal(u_scaled["narrow"], u_plain["narrow"])
    np.testing.assert_array_equal(u_scaled["bias"], u_plain["bias"])
    # by hand for one weight: g = -1 (the first), step = -lr * g / (|g| + 1e-5) scaled by 1/4
    # (float32's rounding of Adam's bias corrections is within 1e-4 of it)
    np.testing.assert_allclose(u_scaled["wide"][0, 0], 0.25 * 1e-2 * 1.0 / (1.0 + 1e-5), rtol=1e-4)
    # the learning rate stays a hyperparameter the update sets
    assert float(with_learning_rate(state, 5e-3).hyperparams["learning_rate"]) == pytest.approx(
        5e-3
    )


def _trained_params(overrides):
    config = tianjax.load_config(
        "configs/ppo_cartpole.yaml",
        ["num_envs=4", "rollout_len=16", "total_env_steps=128", *overrides],
    )
    env = make_gymnax(config.env)
    algo = make_algorithm(config, env.obs_shape, env.action_spec, correct_staleness=False)
    init, run = make_fused(config, env, algo)
    state, _ = jax.jit(run, static_argnums=1)(init(jax.random.key(0)), 2)
    return state.learner.params


def test_no_layer_wider_than_the_base_trains_exactly_as_without():
    """[64, 64] on CartPole: every kernel's fan-in is 4 or 64, so base 64 changes nothing."""
    jax.tree.map(
        np.testing.assert_array_equal,
        _trained_params([]),
        _trained_params(["ppo.lr_base_width=64"]),
    )


def test_a_wider_network_trains_differently():
    wide = ["network.hidden=[128,128]"]
    a, b = _trained_params(wide), _trained_params(wide + ["ppo.lr_base_width=64"])
    assert not all(np.allclose(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_a_bad_base_names_the_key():
    with pytest.raises(tianjax.ConfigError, match="ppo.lr_base_width"):
        tianjax.load_config("configs/ppo_cartpole.yaml", ["ppo.lr_base_width=0"])
    with pytest.raises(tianjax.ConfigError, match="ppo.lr_base_width"):
        tianjax.load_config("configs/ppo_cartpole.yaml", ["ppo.lr_base_width=1.5"])
