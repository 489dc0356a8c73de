"""The pure actor: one batched act-and-step, and a lax.scan rollout for JAX envs.

`rollout(params, version, state, env_steps)` steps B envs for T steps with the policy
`params` of the given version and returns a [T, B] batch stamped with that version
(a Trajectory for on-policy algorithms, Transitions for replay), plus the episodes that
finished. One jitted call per rollout; Python never sees a single step.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from tianjax.algos.base import Algorithm
from tianjax.envs.jax_env import JaxEnv
from tianjax.types import EpisodeStats, Trajectory, Transition


class RolloutState(NamedTuple):
    env_state: object  # vmapped env state [B]
    obs: jax.Array  # [B, ...]
    key: jax.Array
    stats: EpisodeStats


class Episodes(NamedTuple):
    """Finished episodes of a rollout, as [T, B] masks and values."""

    done: jax.Array  # [T, B] bool, an episode ended at this step
    returns: jax.Array  # [T, B] its undiscounted return (valid where done)
    lengths: jax.Array  # [T, B] its length (valid where done)


def clip_action(action, spec):
    if spec.discrete:
        return action
    return jnp.clip(action, spec.low, spec.high)


def last_truncation(cut: jax.Array, final_obs: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(trunc_obs [B, ...], trunc_t [B]): each env's last truncation in a rollout, from the
    mask cut [T, B] and the final observations final_obs [T, B, ...] (zeros and -1 if none)."""
    T = cut.shape[0]
    trunc_t = jnp.max(jnp.where(cut, jnp.arange(T, dtype=jnp.int32)[:, None], -1), axis=0)
    index = jnp.maximum(trunc_t, 0).reshape((1, -1) + (1,) * (final_obs.ndim - 2))
    picked = jnp.take_along_axis(final_obs, index, axis=0)[0]
    keep = (trunc_t >= 0).reshape((-1,) + (1,) * (final_obs.ndim - 2))
    return jnp.where(keep, picked, jnp.zeros_like(picked)), trunc_t


def make_rollout(env: JaxEnv, algo: Algorithm, num_envs: int, rollout_len: int):
    """Returns (init(key) -> RolloutState, rollout(params, version, state, env_steps))."""
    onpolicy = algo.buffer == "onpolicy"
    step_env = jax.vmap(env.step)

    def init(key) -> RolloutState:
        key, sub = jax.random.split(key)
        obs, env_state = jax.vmap(env.reset)(jax.random.split(sub, num_envs))
        zeros = jnp.zeros((num_envs,), jnp.float32)
        return RolloutState(env_state, obs, key, EpisodeStats(zeros, zeros.astype(jnp.int32)))

    def rollout(params, version, state: RolloutState, env_steps=0):
        def step(s: RolloutState, t):
            key, k_act, k_env = jax.random.split(s.key, 3)
            out = algo.act(params, s.obs, k_act, env_steps + t * num_envs)
            nxt = step_env(jax.random.split(k_env, num_envs), s.env_state,
                           clip_action(out.action, env.action_spec))
            done = nxt.terminated | nxt.truncated
            ep_ret = s.stats.episode_return + nxt.reward
            ep_len = s.stats.episode_length + 1
            stats = EpisodeStats(jnp.where(done, 0.0, ep_ret), jnp.where(done, 0, ep_len))
            episodes = Episodes(done, ep_ret, ep_len)
            v = jnp.full((num_envs,), version, jnp.int32)
            if onpolicy:
                # The truncation bootstrap is evaluated after the scan, batched over [T, B].
                cut = nxt.truncated & ~nxt.terminated
                rec = (s.obs, out.action, nxt.reward, done, (cut, nxt.final_obs), out.log_prob,
                       out.value, v)
            else:
                rec = Transition(s.obs, out.action, nxt.reward, nxt.final_obs, nxt.terminated, v)
            return RolloutState(nxt.state, nxt.obs, key, stats), (rec, episodes)

        state, (rec, episodes) = jax.lax.scan(step, state, jnp.arange(rollout_len))
        if not onpolicy:
            return state, rec, episodes
        obs, action, reward, done, (cut, final_obs), log_prob, value, v = rec
        # NOTE: one [T * B] forward is far cheaper than T small ones inside the scan.
        boot = jnp.where(cut, algo.value(params, final_obs), 0.0)
        trunc_obs, trunc_t = last_truncation(cut, final_obs)
        batch = Trajectory(obs, action, reward, done, boot, log_prob, value, v, state.obs, trunc_obs, trunc_t)
        return state, batch, episodes

    return init, rollout
