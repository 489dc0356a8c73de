"""tianjax.networks.dense: flax's Dense with a weight gradient XLA:CPU runs as a plain product."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tianjax.networks.dense import Dense, dot_general, matmul


def test_gradients_by_hand():
    """L = sum(C * (x W)) for x [2, 2], W [2, 3]: dL/dW = x^T C and dL/dx = C W^T, written out."""
    x = jnp.array([[1.0, 2.0], [3.0, 4.0]])
    w = jnp.array([[1.0, 0.0, 2.0], [0.0, 1.0, -1.0]])
    c = jnp.array([[1.0, 0.0, 1.0], [0.0, 2.0, 1.0]])
    dx, dw = jax.grad(lambda x, w: jnp.sum(c * matmul(x, w)), argnums=(0, 1))(x, w)
    # dW[i, j] = sum_m x[m, i] c[m, j]
    np.testing.assert_allclose(
        dw,
        [
            [1 * 1 + 3 * 0, 1 * 0 + 3 * 2, 1 * 1 + 3 * 1],
            [2 * 1 + 4 * 0, 2 * 0 + 4 * 2, 2 * 1 + 4 * 1],
        ],
    )
    # dx[m, i] = sum_j c[m, j] w[i, j]
    np.testing.assert_allclose(
        dx,
        [
            [1 * 1 + 0 * 0 + 1 * 2, 1 * 0 + 0 * 1 + 1 * -1],
            [0 * 1 + 2 * 0 + 1 * 2, 0 * 0 + 2 * 1 + 1 * -1],
        ],
    )


@pytest.mark.parametrize("shape", [(6, 5), (4, 3, 5), (1, 5)])
@pytest.mark.parametrize("jit", [False, True])
def test_same_parameters_values_and_gradients_as_flax_dense(shape, jit):
    x = jnp.asarray(np.random.default_rng(0).standard_normal(shape), jnp.float32)
    ours, theirs = Dense(7), nn.Dense(7)
    params = ours.init(jax.random.key(1), x)
    assert jax.tree.structure(params) == jax.tree.structure(theirs.init(jax.random.key(1), x))
    jax.tree.map(np.testing.assert_array_equal, params, theirs.init(jax.random.key(1), x))

    def loss(module):
        return lambda p, x: jnp.sum(jnp.tanh(module.apply(p, x)) ** 2)

    grad = (
        (lambda f: jax.jit(jax.grad(f, argnums=(0, 1))))
        if jit
        else (lambda f: jax.grad(f, argnums=(0, 1)))
    )
    np.testing.assert_allclose(ours.apply(params, x), theirs.apply(params, x), rtol=1e-6, atol=1e-6)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
        grad(loss(ours))(params, x),
        grad(loss(theirs))(params, x),
    )


def test_vmapped_gradient_equals_each_one():
    """A sweep vmaps the update over hyperparameters: the parameters carry a batch axis."""
    x = jnp.asarray(np.random.default_rng(2).standard_normal((8, 4)), jnp.float32)
    params = Dense(3).init(jax.random.key(0), x)
    stacked = jax.tree.map(lambda p: jnp.stack([p, 2 * p, -p]), params)
    f = lambda p: jnp.sum(jnp.sin(Dense(3).apply(p, x)))  # noqa: E731
    batched = jax.vmap(jax.grad(f))(stacked)
    for i, scale in enumerate((1.0, 2.0, -1.0)):
        one = jax.grad(lambda p: jnp.sum(jnp.sin(nn.Dense(3).apply(p, x))))(
            jax.tree.map(lambda p: scale * p, params)
        )
        jax.tree.map(
            lambda a, b: np.testing.assert_allclose(a[i], b, rtol=1e-5, atol=1e-6), batched, one
        )


def test_other_products_go_to_lax():
    """Anything but Dense's own product (here a batched one, and one with a precision) is
    lax.dot_general's, unchanged."""
    a = jnp.asarray(np.random.default_rng(3).standard_normal((2, 3, 4)), jnp.float32)
    b = jnp.asarray(np.random.default_rng(4).standard_normal((2, 4, 5)), jnp.float32)
    dims = (((2,), (1,)), ((0,), (0,)))
    np.testing.assert_array_equal(dot_general(a, b, dims), jax.lax.dot_general(a, b, dims))
    w = b[0]
    hi = jax.lax.Precision.HIGHEST
    np.testing.assert_array_equal(
        dot_general(a, w, (((2,), (0,)), ((), ())), precision=hi),
        jax.lax.dot_general(a, w, (((2,), (0,)), ((), ())), precision=hi),
    )


def test_dense_takes_its_weight_gradient_from_matmul():
    """Dense's own product is routed to `matmul`: its backward pass lays x^T out behind an
    optimization barrier, which flax's Dense's never does."""
    x = jnp.ones((8, 4), jnp.float32)
    params = Dense(3).init(jax.random.key(0), x)

    def backward(module):
        return str(jax.make_jaxpr(jax.grad(lambda p: jnp.sum(module.apply(p, x))))(params))

    assert "optimization_barrier" in backward(Dense(3))
    assert "optimization_barrier" not in backward(nn.Dense(3))
