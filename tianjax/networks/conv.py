"""A 2-D convolution whose gradients are matrix products, for the CNN torsos.

On XLA:CPU the gradient convolutions JAX derives for a convolution (the weight gradient,
a convolution whose "kernel" is the activations, and the input gradient, a transposed
convolution) run 10 to 100 times slower inside a loop (`lax.scan`, `while`) than at top
level, and a fused PPO update is a loop of minibatch gradients inside a loop of updates:
on Breakout-MinAtar that made an update ~10x slower than the same gradients outside a
loop. The forward convolution has no such cliff. So the gradients are written here as
what they are, with the convolution y = x * w over patches:

    P[n, i, j, :] = the (di, dj, c) patch of x under output (i, j)  (kh*kw*C values,
                    gathered by slicing: no arithmetic)
    y[n, i, j, o] = sum_k P[n, i, j, k] W[k, o]          W = w as a (kh*kw*C, O) matrix
    dL/dW         = P^T g  (one matrix product over all n, i, j)
    dL/dx         = g convolved with w flipped in space and transposed in channels,
                    itself a forward convolution (stride 1; padding k - 1 for VALID,
                    (k - 1) / 2 for SAME with an odd kernel)

A strided or even-kernel SAME convolution takes JAX's own input gradient. The values and
gradients equal `lax.conv_general_dilated`'s (tests/networks/test_networks.py), and the parameters
are `flax.linen.Conv`'s (names, shapes, initial values), so checkpoints are unchanged.
"""

from __future__ import annotations

from functools import partial
from typing import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

_DIMS = ("NHWC", "HWIO", "NHWC")


def _forward(x, w, strides, padding):
    return lax.conv_general_dilated(x, w, strides, padding, dimension_numbers=_DIMS)


@partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def conv2d(x, w, strides: tuple[int, int] = (1, 1), padding: str = "SAME"):
    """x [N, H, W, C], w [kh, kw, C, O] -> [N, H', W', O]; padding "SAME" or "VALID"."""
    return _forward(x, w, strides, padding)


def _conv2d_fwd(x, w, strides, padding):
    return _forward(x, w, strides, padding), (x, w)


def _patches(x, kh: int, kw: int, strides, padding):
    """[N, H, W, C] -> [N, H', W', kh * kw * C], ordered (di, dj, c) like w's rows: the
    shifted, strided slices of the padded input (data movement, no arithmetic)."""
    (pt, pb), (pl, pr) = lax.padtype_to_pads(x.shape[1:3], (kh, kw), strides, padding)
    x = jnp.pad(x, ((0, 0), (pt, pb), (pl, pr), (0, 0)))
    sh, sw = strides
    ho, wo = (x.shape[1] - kh) // sh + 1, (x.shape[2] - kw) // sw + 1
    cols = [
        x[:, i : i + (ho - 1) * sh + 1 : sh, j : j + (wo - 1) * sw + 1 : sw, :]
        for i in range(kh)
        for j in range(kw)
    ]
    return jnp.stack(cols, axis=3).reshape(x.shape[0], ho, wo, kh * kw * x.shape[3])


def _conv2d_bwd(strides, padding, res, g):
    x, w = res
    kh, kw, c, o = w.shape
    patches = _patches(x, kh, kw, strides, padding)
    dw = jnp.einsum("nhwk,nhwo->ko", patches, g, precision=lax.Precision.HIGHEST).reshape(
        kh, kw, c, o
    )
    if tuple(strides) == (1, 1) and (padding == "VALID" or (kh % 2 and kw % 2)):
        if padding == "VALID":
            pad = ((kh - 1, kh - 1), (kw - 1, kw - 1))
        else:
            pad = (((kh - 1) // 2,) * 2, ((kw - 1) // 2,) * 2)
        flipped = w[::-1, ::-1].transpose(0, 1, 3, 2)  # [kh, kw, O, C]
        dx = lax.conv_general_dilated(g, flipped, (1, 1), pad, dimension_numbers=_DIMS)
    else:
        dx = jax.vjp(lambda x_: _forward(x_, w, strides, padding), x)[1](g)[0]
    return dx, dw.astype(w.dtype)


conv2d.defvjp(_conv2d_fwd, _conv2d_bwd)


class Conv(nn.Module):
    """`flax.linen.Conv` for [..., H, W, C] inputs (same parameters), over `conv2d`."""

    features: int
    kernel_size: Sequence[int]
    strides: Sequence[int] = (1, 1)
    padding: str = "SAME"
    kernel_init: Callable = nn.initializers.lecun_normal()
    bias_init: Callable = nn.initializers.zeros

    @nn.compact
    def __call__(self, x):
        kh, kw = self.kernel_size
        kernel = self.param(
            "kernel", self.kernel_init, (kh, kw, x.shape[-1], self.features), jnp.float32
        )
        bias = self.param("bias", self.bias_init, (self.features,), jnp.float32)
        lead = x.shape[:-3]
        y = conv2d(x.reshape((-1,) + x.shape[-3:]), kernel, tuple(self.strides), self.padding)
        y = y + bias
        return y.reshape(lead + y.shape[1:])


__all__ = ["Conv", "conv2d"]
