"""The episode bookkeeping and truncation bootstrap shared by JAX and host rollouts
(tianjax/core/episodes.py): known values, the same under numpy and jax.numpy."""

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tianjax.core.episodes import track_episodes, truncation_bootstrap, values_where_cut
from tianjax.core.types import EpisodeStats

# two envs, three steps: env 0 ends after step 1, env 1 after steps 0 and 2
REWARD = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], np.float32)
DONE = np.array([[False, True], [True, False], [False, True]])


def _on(xp, fn):
    """`fn` with the array module `xp` (jax.numpy: jitted, as inside a rollout)."""
    return partial(fn, xp=np) if xp is np else jax.jit(partial(fn, xp=jnp))


@pytest.mark.parametrize("xp", [np, jnp])
def test_episodes_report_their_totals_and_restart(xp):
    step = _on(xp, track_episodes)
    stats = EpisodeStats(np.zeros(2, np.float32), np.zeros(2, np.int32))
    rets, lens = [], []
    for t in range(3):
        stats, ret, length = step(stats, REWARD[t], DONE[t])
        rets.append(np.asarray(ret))
        lens.append(np.asarray(length))
    np.testing.assert_array_equal(np.stack(rets)[DONE], [2.0, 4.0, 10.0])  # in step order
    np.testing.assert_array_equal(np.stack(lens)[DONE], [1, 2, 2])
    np.testing.assert_array_equal(stats.episode_return, [5.0, 0.0])
    np.testing.assert_array_equal(stats.episode_length, [1, 0])


@pytest.mark.parametrize("xp", [np, jnp])
def test_truncation_bootstraps_where_cut_and_keeps_each_envs_last_cut(xp):
    cut = np.array([[True, False], [False, False], [True, False]])  # env 0 cut twice, env 1 never
    final_obs = np.arange(12, dtype=np.float32).reshape(3, 2, 2)
    values = np.full((3, 2), 7.0, np.float32)
    boot, trunc_obs, trunc_t = _on(xp, truncation_bootstrap)(values, cut, final_obs)
    np.testing.assert_array_equal(boot, np.where(cut, 7.0, 0.0))
    np.testing.assert_array_equal(trunc_t, [2, -1])
    np.testing.assert_array_equal(trunc_obs, [final_obs[2, 0], [0.0, 0.0]])


def test_host_values_are_evaluated_only_where_cut_in_fixed_width_calls():
    cut = np.array([[True, False], [False, True], [True, False]])
    final_obs = np.arange(12, dtype=np.float32).reshape(3, 2, 2)
    shapes = []

    def value(obs):
        shapes.append(obs.shape)
        return obs.sum(axis=-1)

    values = values_where_cut(value, cut, final_obs, width=2)
    np.testing.assert_array_equal(values, np.where(cut, final_obs.sum(-1), 0.0))
    assert shapes == [(2, 2), (2, 2)]  # three cut observations, padded to two calls of two
    assert (
        values_where_cut(value, np.zeros_like(cut), final_obs, width=2).sum() == 0
        and len(shapes) == 2
    )


def test_cut_values_are_the_critic_of_the_final_obs_where_cut():
    """The rollout evaluates V only at each env's last cut when no env was cut twice, and
    every final observation otherwise: where cut, both equal V(final_obs)."""
    from tianjax.core.rollout import cut_values

    def value(params, obs):  # a stand-in critic: the first feature times a weight
        return obs[..., 0] * params

    final_obs = jnp.arange(4 * 3 * 2, dtype=jnp.float32).reshape(4, 3, 2)  # [T=4, B=3, 2]
    once = jnp.array([[0, 1, 0], [0, 0, 0], [1, 0, 0], [0, 0, 0]], bool)
    twice = once.at[3, 0].set(True)  # env 0 cut at steps 2 and 3
    for cut in (once, twice):
        for jit in (False, True):
            fn = jax.jit(cut_values, static_argnums=0) if jit else cut_values
            got = np.asarray(fn(value, 2.0, cut, final_obs))
            want = np.where(np.asarray(cut), 2.0 * np.asarray(final_obs[..., 0]), 0.0)
            np.testing.assert_allclose(np.where(np.asarray(cut), got, 0.0), want)
    # nothing cut: nothing is read
    assert np.asarray(cut_values(value, 2.0, jnp.zeros((4, 3), bool), final_obs)).shape == (4, 3)
