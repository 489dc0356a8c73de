"""Torso choice (network.torso), known shapes, uint8 scaling, channel layout."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tianjax
from tianjax.algos import make_algorithm
from tianjax.config import ConfigError, NetworkConfig, load_config
from tianjax.core.types import ActionSpec
from tianjax.networks import ActorCritic, QNetwork, as_float, resolve_torso

DISCRETE = ActionSpec(discrete=True, num_actions=3)


@pytest.mark.parametrize(
    "shape, dtype, torso",
    [
        ((4,), np.float32, "mlp"),  # CartPole
        ((10, 10, 4), np.bool_, "minatar_cnn"),  # Breakout-MinAtar
        ((10, 10, 6), np.float32, "minatar_cnn"),  # SpaceInvaders-MinAtar
        ((10, 10, 4), np.uint8, "minatar_cnn"),  # a small map stays small whatever its dtype
        ((4, 84, 84), np.uint8, "nature_cnn"),  # envpool Atari, channels first
        ((84, 84, 4), np.uint8, "nature_cnn"),
        ((36, 36, 1), np.uint8, "nature_cnn"),  # the smallest frame the Nature convolutions take
        ((35, 40, 3), np.uint8, "minatar_cnn"),
        ((4, 84, 84), np.float32, "impala_cnn"),  # a float image is no [0, 255] frame
        ((84, 84, 3), np.float64, "impala_cnn"),
        ((36, 36, 1), np.int32, "impala_cnn"),
        ((84, 84, 4), None, "nature_cnn"),  # dtype not given: assumed frames
        ((3, 5), np.uint8, "mlp"),  # flattened
    ],
)
def test_auto_picks_a_torso_from_shape_and_dtype(shape, dtype, torso):
    assert resolve_torso("auto", shape, dtype) == torso


def test_make_algorithm_resolves_auto_with_the_env_dtype():
    """A float 84x84 image gets the IMPALA torso, uint8 frames the Nature one; learner and
    actors build the same tree because both pass the env's dtype."""
    config = load_config("configs/ppo_cartpole.yaml", ["network.torso=auto"])
    for dtype, block in ((np.float32, "ImpalaCNN_0"), (np.uint8, "NatureCNN_0")):
        algo = make_algorithm(config, (4, 84, 84), DISCRETE, obs_dtype=dtype)
        params = jax.eval_shape(algo.init, jax.random.key(0)).params
        torso = params["params"]["Torso_0"]
        assert list(k for k in torso if k.endswith("CNN_0")) == [block]
    # a concrete torso is kept whatever the dtype
    config = load_config("configs/ppo_cartpole.yaml", ["network.torso=nature_cnn"])
    algo = make_algorithm(config, (4, 84, 84), DISCRETE, obs_dtype=np.float32)
    assert "NatureCNN_0" in jax.eval_shape(algo.init, jax.random.key(0)).params["params"]["Torso_0"]


@pytest.mark.parametrize(
    "torso, shape, words",
    [
        ("nature_cnn", (10, 10, 4), "at least 36x36"),
        ("minatar_cnn", (4,), "needs image observations"),
        ("impala_cnn", (3, 5), "needs image observations"),
        ("auto", (10, 0, 4), "empty axis"),
    ],
)
def test_a_torso_that_cannot_take_the_shape_is_one_line_naming_the_key(torso, shape, words):
    with pytest.raises(ConfigError) as e:
        ActorCritic(NetworkConfig(torso=torso), shape, DISCRETE)
    msg = str(e.value)
    assert msg.startswith("config key 'network.torso':") and words in msg and "\n" not in msg
    with pytest.raises(ConfigError, match="'network.torso'"):
        QNetwork(NetworkConfig(torso=torso), shape, 3)


def test_unknown_torso_is_refused_by_the_config():
    with pytest.raises(ConfigError, match="'network.torso'"):
        load_config(None, ["network.torso=resnet"])


def _shapes(params):
    return {
        "/".join(str(getattr(k, "key", k)) for k in path): tuple(v.shape)
        for path, v in jax.tree_util.tree_flatten_with_path(params)[0]
    }


def _init(net, shape, dtype=jnp.float32):
    return net.init(jax.random.key(0), jnp.zeros((1,) + shape, dtype))


def _abstract(net, shape, dtype=jnp.float32):
    """The parameter tree's shapes without running the init (no compile, no FLOPs)."""
    return jax.eval_shape(net.init, jax.random.key(0), jax.ShapeDtypeStruct((1,) + shape, dtype))


def test_known_parameter_shapes_per_torso():
    cfg = NetworkConfig(torso="auto", hidden=(128,))
    # MinAtar: 3x3x4 -> 16 channels, SAME padding keeps 10x10: 10*10*16 = 1600 features
    s = _shapes(_abstract(ActorCritic(cfg, (10, 10, 4), DISCRETE), (10, 10, 4)))
    assert s["params/Torso_0/MinAtarCNN_0/Conv_0/kernel"] == (3, 3, 4, 16)
    assert s["params/Torso_0/MLP_0/Dense_0/kernel"] == (1600, 128)
    assert s["params/Dense_0/kernel"] == (128, 1) and s["params/Dense_1/kernel"] == (128, 3)
    assert not any(k.startswith("params/Torso_1") for k in s)  # one torso shared by both heads
    # Nature: 84 -> 20 -> 9 -> 7, 7*7*64 = 3136 features
    s = _shapes(
        _abstract(QNetwork(NetworkConfig(hidden=(512,)), (4, 84, 84), 6), (4, 84, 84), jnp.uint8)
    )
    assert s["params/Torso_0/NatureCNN_0/Conv_0/kernel"] == (8, 8, 4, 32)
    assert s["params/Torso_0/MLP_0/Dense_0/kernel"] == (3136, 512)
    assert s["params/Dense_0/kernel"] == (512, 6)
    # IMPALA: three max-pools 3x3/2 SAME: 84 -> 42 -> 21 -> 11, 11*11*32 = 3872 features
    s = _shapes(
        _abstract(
            QNetwork(NetworkConfig(torso="impala_cnn", hidden=(256,)), (84, 84, 4), 6), (84, 84, 4)
        )
    )
    assert s["params/Torso_0/MLP_0/Dense_0/kernel"] == (3872, 256)
    assert sum(k.endswith("kernel") and "ImpalaCNN" in k for k in s) == 3 * 5
    # MLP: separate policy and value towers, as before
    s = _shapes(_abstract(ActorCritic(NetworkConfig(hidden=(64, 64)), (4,), DISCRETE), (4,)))
    assert s["params/Torso_0/MLP_0/Dense_0/kernel"] == (4, 64)
    assert s["params/Torso_1/MLP_0/Dense_1/kernel"] == (64, 64)
    # mlp on a map flattens it
    s = _shapes(
        _abstract(QNetwork(NetworkConfig(torso="mlp", hidden=(32,)), (10, 10, 4), 3), (10, 10, 4))
    )
    assert s["params/Torso_0/MLP_0/Dense_0/kernel"] == (400, 32)


def test_only_uint8_is_scaled():
    np.testing.assert_allclose(
        as_float(jnp.array([0, 51, 255], jnp.uint8)), [0.0, 0.2, 1.0], rtol=1e-6
    )
    np.testing.assert_array_equal(as_float(jnp.array([0.0, 1.0, 3.0])), [0.0, 1.0, 3.0])
    np.testing.assert_array_equal(as_float(jnp.array([False, True])), [0.0, 1.0])
    np.testing.assert_array_equal(as_float(jnp.array([7], jnp.int32)), [7.0])
    # the whole network: uint8 frames give what the same frames as float/255 give
    net = QNetwork(NetworkConfig(), (4, 36, 36), 6)
    params = _init(net, (4, 36, 36), jnp.uint8)
    frames = jax.random.randint(jax.random.key(1), (2, 4, 36, 36), 0, 256).astype(jnp.uint8)
    np.testing.assert_allclose(
        net.apply(params, frames),
        net.apply(params, frames.astype(jnp.float32) / 255),
        rtol=1e-5,
        atol=1e-6,
    )
    # while {0, 1} MinAtar maps (float32 or bool) are not divided by 255
    net = QNetwork(NetworkConfig(), (10, 10, 4), 3)
    params = _init(net, (10, 10, 4))
    maps = jax.random.bernoulli(jax.random.key(2), 0.3, (2, 10, 10, 4))
    q_bool, q_float = net.apply(params, maps), net.apply(params, maps.astype(jnp.float32))
    np.testing.assert_allclose(q_bool, q_float, rtol=1e-6)
    assert not np.allclose(q_float, net.apply(params, maps.astype(jnp.float32) / 255))


def test_channels_first_frames_equal_channels_last():
    """[C, H, W] frames (envpool) are moved to [H, W, C]: the same params give the same output."""
    chw = QNetwork(NetworkConfig(), (4, 84, 84), 6)
    hwc = QNetwork(NetworkConfig(), (84, 84, 4), 6)
    params = _init(chw, (4, 84, 84))
    assert _shapes(params) == _shapes(_abstract(hwc, (84, 84, 4)))
    x = jax.random.uniform(jax.random.key(3), (2, 4, 84, 84))
    np.testing.assert_allclose(
        chw.apply(params, x), hwc.apply(params, jnp.moveaxis(x, 1, -1)), rtol=1e-5, atol=1e-5
    )


def test_make_algorithm_refuses_a_torso_that_does_not_fit_minatar():
    config = load_config(
        "configs/ppo_cartpole.yaml", ["env=Breakout-MinAtar", "network.torso=nature_cnn"]
    )
    with pytest.raises(
        ConfigError, match="'network.torso': nature_cnn needs frames of at least 36x36"
    ):
        make_algorithm(config, (10, 10, 4), DISCRETE)


def test_dqn_on_minatar_trains_and_checkpoints(tmp_path):
    """Was: the Nature torso left a zero-size layer on 10x10 maps, and orbax refused to save it."""
    result = tianjax.train(
        "configs/dqn_cartpole.yaml",
        [
            "env=Breakout-MinAtar",
            "total_env_steps=2048",
            "dqn.learning_starts=512",
            "target_return=null",
            "eval.episodes=0",
            "log_every=1",
        ],
        run_dir=str(tmp_path / "run"),
        verbose=False,
        progress=False,
    )
    sizes = [x.size for x in jax.tree.leaves(result.params)]
    assert min(sizes) > 0 and result.summary["updates"] > 0
    assert (tmp_path / "run" / "checkpoints").is_dir()


@pytest.mark.parametrize(
    "kernel,strides,padding,cin,cout",
    [
        (3, (1, 1), "SAME", 4, 16),  # MinAtar torso, IMPALA blocks
        (3, (1, 1), "VALID", 3, 5),
        (8, (4, 4), "VALID", 4, 32),  # Nature CNN layers 1 and 2 (JAX's own input gradient)
        (4, (2, 2), "VALID", 32, 64),
        (2, (1, 1), "SAME", 3, 4),  # even kernel, SAME: uneven padding
    ],
)
def test_conv2d_values_and_gradients_equal_lax(kernel, strides, padding, cin, cout):
    from jax import lax

    from tianjax.networks.conv import conv2d

    def ref(x, w):
        return lax.conv_general_dilated(
            x, w, strides, padding, dimension_numbers=("NHWC", "HWIO", "NHWC")
        )

    rng = np.random.default_rng(kernel + cin)
    x = jnp.asarray(rng.normal(size=(3, 13, 11, cin)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(kernel, kernel, cin, cout)), jnp.float32)
    ours = lambda x, w: conv2d(x, w, strides, padding)
    np.testing.assert_array_equal(ours(x, w), ref(x, w))
    loss = lambda f: lambda x, w: jnp.sum(jnp.sin(f(x, w)))
    gx, gw = jax.grad(loss(ours), argnums=(0, 1))(x, w)
    rx, rw = jax.grad(loss(ref), argnums=(0, 1))(x, w)
    np.testing.assert_allclose(gx, rx, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gw, rw, rtol=1e-5, atol=1e-4)
    # and inside a scan (the fused update's shape) the gradient is the same
    gs = jax.lax.scan(
        lambda c, xi: (c + jax.grad(loss(ours), argnums=1)(xi[None], w), None), jnp.zeros_like(w), x
    )[0]
    rs = sum(jax.grad(loss(ref), argnums=1)(x[i : i + 1], w) for i in range(3))
    np.testing.assert_allclose(gs, rs, rtol=1e-5, atol=1e-4)


def test_conv_module_has_flax_convs_parameters_and_values():
    import flax.linen as nn

    from tianjax.networks.conv import Conv

    x = jnp.ones((2, 3, 20, 20, 4))  # two leading batch axes, as in a [T, B] batch
    for kw in (
        dict(features=16, kernel_size=(3, 3)),
        dict(features=8, kernel_size=(8, 8), strides=(4, 4), padding="VALID"),
    ):
        ours, theirs = Conv(**kw), nn.Conv(**kw)
        p, q = ours.init(jax.random.key(1), x), theirs.init(jax.random.key(1), x)
        assert jax.tree.structure(p) == jax.tree.structure(q)
        jax.tree.map(np.testing.assert_array_equal, p, q)
        p = jax.tree.map(lambda a: a + 0.1, p)
        np.testing.assert_allclose(ours.apply(p, x), theirs.apply(p, x), rtol=1e-6, atol=1e-6)
