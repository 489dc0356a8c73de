"""Uniform random permutations for minibatches, by one integer sort per round.

PPO's epochs cut a shuffled batch into minibatches. `jax.random.permutation` shuffles by
sorting (random key, position) pairs; XLA:CPU sorts a pair of arrays through a comparator
it calls per comparison, which at 8,192 samples took about 40% of a fused PPO update
(experiments/benchmarks, fused training). A sort of one unsigned integer array takes XLA:CPU's
direct comparison, about five times faster, so each round here packs both into one word:

    word_i = (u_i with its low b bits cleared) | i,     u_i ~ U{0, ..., 2^32 - 1},
    b = bits of the largest index, n - 1

and sorts the words: the high 32 - b random bits order the samples, the low b bits say
which sample each word is and break ties by position. A round is a uniformly random
permutation unless two samples draw the same high bits (a tie), which keeps their order.
Rounds compose: the result after r rounds is

    perm = sigma_1[sigma_2[... sigma_r]],   sigma_k = argsort of round k's words

and a pair keeps its initial order with probability 1/2 + q^r / 2, q = 2^-(32 - b) (it must
tie in every round to be biased). The rounds are JAX's own bound for its permutation with
32-bit keys, here with 32 - b random bits: the fewest r with

    (2^(32 - b))^r >= n^3,   i.e. every pair of the n(n - 1)/2 ties in all rounds with
                             probability at most about 1 / (2n).

So 512 samples take 2 rounds (23 random bits each) and 8,192 take 3 (19 bits), against
JAX's 1 and 2 rounds of the slower sort. The distribution is that of jax.random.permutation
up to that bound; the stream of permutations for a given key is not the same.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def index_bits(n: int) -> int:
    """Bits that hold every index 0 .. n - 1 (at least 1)."""
    return max(1, (int(n) - 1).bit_length())


def num_rounds(n: int) -> int:
    """Sorting rounds for n samples: the fewest r with (2^(32 - b))^r >= n^3."""
    n = int(n)
    if n <= 1:
        return 0
    free = 32 - index_bits(n)
    return max(1, math.ceil(3 * math.log2(n) / free))


def permutation(key: jax.Array, n: int) -> jax.Array:
    """A uniformly random permutation of 0 .. n - 1, int32 [n] (n static, n < 2^31)."""
    n = int(n)
    if not 0 <= n < 2**31:
        raise ValueError(f"permutation: n must be in [0, 2^31), got {n}")
    rounds = num_rounds(n)
    if rounds == 0:
        return jnp.arange(n, dtype=jnp.int32)
    b = index_bits(n)
    low = jnp.uint32((1 << b) - 1)
    position = jnp.arange(n, dtype=jnp.uint32)
    perm = None
    for k in jax.random.split(key, rounds):
        words = (jax.random.bits(k, (n,), jnp.uint32) & ~low) | position
        order = (jnp.sort(words) & low).astype(jnp.int32)  # sigma_k
        perm = order if perm is None else jnp.take(perm, order)
    return perm


__all__ = ["index_bits", "num_rounds", "permutation"]
