"""tianjax.core.shuffle: the rounds it takes, that it permutes, and that it is uniform."""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tianjax.core import shuffle


@pytest.mark.parametrize(
    "n, bits, rounds",
    [
        (0, 1, 0),
        (1, 1, 0),
        (2, 1, 1),  # 1 index bit, 31 random: 2^31 >= 2^3
        (3, 2, 1),
        (512, 9, 2),  # 23 random bits: 2^23 < 512^3 = 2^27 <= 2^46
        (513, 10, 2),
        (8192, 13, 3),  # 19 random bits: 2^38 < 2^39 <= 2^57
        (65536, 16, 3),  # 16: 2^48 = 2^48
        (65537, 17, 4),  # 15: 2^45 < 3 * log2(65537) ~ 48.00007 bits
    ],
)
def test_index_bits_and_rounds_by_hand(n, bits, rounds):
    assert shuffle.index_bits(n) == bits
    assert shuffle.num_rounds(n) == rounds


@pytest.mark.parametrize("n", [0, 1, 2, 7, 512, 8192, 10_000])
def test_it_is_a_permutation_with_and_without_jit(n):
    key = jax.random.key(3)
    eager = np.asarray(shuffle.permutation(key, n))
    jitted = np.asarray(jax.jit(shuffle.permutation, static_argnums=1)(key, n))
    assert eager.dtype == np.int32 and eager.shape == (n,)
    np.testing.assert_array_equal(np.sort(eager), np.arange(n))
    np.testing.assert_array_equal(eager, jitted)


def test_different_keys_give_different_permutations():
    a = np.asarray(shuffle.permutation(jax.random.key(0), 512))
    b = np.asarray(shuffle.permutation(jax.random.key(1), 512))
    assert not np.array_equal(a, b)
    assert not np.array_equal(a, np.arange(512))


def test_all_orders_of_four_are_equally_likely():
    """24 orders, 120,000 draws: each count is Binomial(120000, 1/24), mean 5,000, sd 69.8;
    a chi-square over 23 degrees of freedom is below 49.7 with probability 0.999."""
    draws = 120_000
    perms = np.asarray(
        jax.jit(jax.vmap(lambda k: shuffle.permutation(k, 4)))(
            jax.random.split(jax.random.key(7), draws)
        )
    )
    counts = collections.Counter(map(tuple, perms))
    assert len(counts) == 24
    expected = draws / 24
    chi2 = sum((c - expected) ** 2 / expected for c in counts.values())
    assert chi2 < 49.7, (chi2, counts)


def test_every_position_is_equally_likely_at_minibatch_size():
    """Where sample 0 lands among 512, over 20,480 draws: 40 per position on average; a
    chi-square of the 16 blocks of 32 positions (1,280 each) stays below 37.7 (p = 0.999)."""
    draws = 20_480
    perms = np.asarray(
        jax.jit(jax.vmap(lambda k: shuffle.permutation(k, 512)))(
            jax.random.split(jax.random.key(11), draws)
        )
    )
    where = np.argmax(perms == 0, axis=1)
    blocks = np.bincount(where // 32, minlength=16)
    expected = draws / 16
    chi2 = float(np.sum((blocks - expected) ** 2 / expected))
    assert chi2 < 37.7, blocks


def test_vmapped_equals_one_by_one():
    keys = jax.random.split(jax.random.key(5), 3)
    batched = np.asarray(jax.vmap(lambda k: shuffle.permutation(k, 100))(keys))
    for i in range(3):
        np.testing.assert_array_equal(batched[i], np.asarray(shuffle.permutation(keys[i], 100)))


def test_one_round_orders_by_the_high_bits_and_breaks_ties_by_position(monkeypatch):
    """5 samples: 3 index bits, one round. With the drawn words fixed by hand (their low bits
    are cleared, so any value there is ignored), the order is that of the high bits, and the
    tied pairs (0, 2) and (1, 4) keep their positions' order."""
    assert shuffle.num_rounds(5) == 1
    drawn = (np.array([7, 3, 7, 1, 3], np.uint32) << np.uint32(3)) | np.array(
        [5, 1, 7, 0, 6], np.uint32
    )
    monkeypatch.setattr(jax.random, "bits", lambda key, shape, dtype: jnp.asarray(drawn))
    np.testing.assert_array_equal(
        np.asarray(shuffle.permutation(jax.random.key(0), 5)), [3, 1, 4, 0, 2]
    )


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="n must be"):
        shuffle.permutation(jax.random.key(0), -1)
    with pytest.raises(ValueError, match="n must be"):
        shuffle.permutation(jax.random.key(0), 2**31)
