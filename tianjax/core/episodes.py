"""Episode bookkeeping and the truncation bootstrap of a rollout, written once for both
kinds of env: JAX envs step inside a lax.scan (tianjax.core.rollout, with `xp=jax.numpy`) and
host envs step in a Python loop (tianjax.runtime.actor.sources.HostSource, with `xp=numpy`).

Episodes. Each env carries its running return and length (EpisodeStats, [B]); a step adds
its reward and 1, reports the totals where the episode ended (Episodes, one [B] row per
step) and resets them there.

Truncation bootstraps, termination does not (Pardo et al. 2018, "Time Limits in
Reinforcement Learning"). Where an episode is cut by a time limit at step t (truncated
and not terminated), the behaviour critic's value of the final observation becomes

    bootstrap_value[t] = V(final_obs[t])   where cut[t], else 0,

and each env's last cut in the rollout is kept as (trunc_obs, trunc_t) so that a learner can
bootstrap with its own critic instead (see tianjax.core.types.Trajectory). JAX envs evaluate V
over all [T, B] final observations in one forward; host envs evaluate it only where
something was cut (`values_where_cut`), since most rollouts cut nothing.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from tianjax.core.types import EpisodeStats


class Episodes(NamedTuple):
    """Finished episodes of a rollout, as [T, B] masks and values."""

    done: jax.Array  # [T, B] bool, an episode ended at this step
    returns: jax.Array  # [T, B] its undiscounted return (valid where done)
    lengths: jax.Array  # [T, B] its length (valid where done)
    won: jax.Array | None = None  # [T, B] bool, it ended in a win (envs that report wins)


def team_reward(reward, batch_ndim: int, xp=jnp):
    """The episode-return increment of one step: the reward itself for one agent, the mean
    over the agent axis for [..., N] multi-agent rewards (JaxMARL's convention; SMAX gives
    every agent the same team reward)."""
    return reward if reward.ndim == batch_ndim else xp.mean(reward, axis=-1)


def track_episodes(stats: EpisodeStats, reward, done, xp=jnp):
    """One step of every env's running episode: `reward` [B] and `done` [B] (the episode
    ended with this step). Returns (the stats to carry on, zero where an episode ended;
    each env's return [B] and length [B] so far, this step included: an ended episode's
    totals where `done`)."""
    returns = stats.episode_return + reward
    lengths = stats.episode_length + 1
    carried = EpisodeStats(xp.where(done, 0.0, returns), xp.where(done, 0, lengths))
    return carried, returns, lengths


def last_truncation(cut, final_obs, xp=jnp):
    """(trunc_obs [B, ...], trunc_t [B]): each env's last truncation in a rollout, from the
    mask cut [T, B] and the final observations final_obs [T, B, ...] (zeros and -1 if none)."""
    T = cut.shape[0]
    trunc_t = xp.max(xp.where(cut, xp.arange(T, dtype=xp.int32)[:, None], -1), axis=0)

    def pick(x):  # every leaf of a structured observation (multi-agent: MAObs) alike
        index = xp.maximum(trunc_t, 0).reshape((1, -1) + (1,) * (x.ndim - 2))
        picked = xp.take_along_axis(x, index, axis=0)[0]
        keep = (trunc_t >= 0).reshape((-1,) + (1,) * (x.ndim - 2))
        return xp.where(keep, picked, xp.zeros_like(picked))

    return jax.tree.map(pick, final_obs), trunc_t


def truncation_bootstrap(values, cut, final_obs, xp=jnp):
    """(bootstrap_value, trunc_obs [B, ...], trunc_t [B]) of a rollout: `values` is
    V(final_obs) [T, B] (multi-agent [T, B, N]; read only where cut), `cut` [T, B] the
    steps where a time limit ended the episode, `final_obs` [T, B, ...] the final
    observations (read only where cut)."""
    boot = xp.where(cut.reshape(cut.shape + (1,) * (values.ndim - cut.ndim)), values, 0.0)
    trunc_obs, trunc_t = last_truncation(cut, final_obs, xp)
    return boot, trunc_obs, trunc_t


def values_where_cut(
    value: Callable, cut: np.ndarray, final_obs: np.ndarray, width: int
) -> np.ndarray:
    """V(final_obs) [T, B] evaluated only where cut (0 elsewhere; no call at all when
    nothing was cut), `width` observations per call: the cut ones in step order, padded so
    that `value` is compiled for one shape only."""
    values = np.zeros(cut.shape, np.float32)
    if not cut.any():
        return values
    final = final_obs[cut]
    n = len(final)
    padded = np.zeros((-(-n // width) * width,) + final.shape[1:], final.dtype)
    padded[:n] = final
    values[cut] = np.concatenate(
        [np.asarray(value(c)) for c in np.split(padded, len(padded) // width)]
    )[:n]
    return values


__all__ = [
    "Episodes",
    "last_truncation",
    "team_reward",
    "track_episodes",
    "truncation_bootstrap",
    "values_where_cut",
]
