"""The pure actor: one batched act-and-step, and a lax.scan rollout for JAX envs.

`rollout(params, version, state, env_steps)` steps B envs for T steps with the policy
`params` of the given version and returns a [T, B] batch stamped with that version
(a Trajectory for on-policy algorithms, Transitions for replay), plus the episodes that
finished. One jitted call per rollout; Python never sees a single step. The episode
bookkeeping and the truncation bootstrap are tianjax.core.episodes', which the host envs'
Python loop (tianjax.runtime.actor.sources) shares.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from tianjax.core.algorithm import Algorithm
from tianjax.core.episodes import (
    Episodes,
    last_truncation,
    team_reward,
    track_episodes,
    truncation_bootstrap,
)
from tianjax.core.types import Env, EpisodeStats, Sequences, Trajectory, Transition


class RolloutState(NamedTuple):
    env_state: object  # vmapped env state [B]
    obs: jax.Array  # [B, ...]
    key: jax.Array
    stats: EpisodeStats
    carry: Any = None  # recurrent policies: their state [B, ...], reset where an episode ended


def clip_action(action, spec):
    if spec.discrete:
        return action
    return jnp.clip(action, spec.low, spec.high)


def cut_values(value, params, cut: jax.Array, final_obs) -> jax.Array:
    """V(final_obs) [T, B] (multi-agent [T, B, N]) where `cut` [T, B] is set, 0 elsewhere
    (where nothing was cut the truncation bootstrap reads none of it).

    A time limit seldom cuts an env twice in one rollout (never when it is at least T
    steps), so the critic is run on each env's last cut observation only, [B] of them,
    instead of all [T, B]: the values of the other final observations are those of the
    next step's observations, which the rollout already has, and the bootstrap does not
    need them. Where some env was cut twice, every final observation is evaluated, in one
    [T * B] forward (far cheaper than T small ones inside the scan). Under vmap the choice
    becomes a select and both run."""
    T = cut.shape[0]
    trunc_obs, trunc_t = last_truncation(cut, final_obs)

    def last_only(_):
        v = value(params, trunc_obs)  # [B] or [B, N]
        at = jnp.arange(T, dtype=jnp.int32)[:, None] == trunc_t[None, :]  # [T, B]
        return jnp.where(at.reshape(at.shape + (1,) * (v.ndim - 1)), v[None], 0.0).astype(v.dtype)

    def every_one(_):
        return value(params, final_obs)

    once = jnp.all(jnp.sum(cut.astype(jnp.int32), axis=0) <= 1)
    return jax.lax.cond(once, last_only, every_one, None)


def make_rollout(env: Env, algo: Algorithm, num_envs: int, rollout_len: int):
    """Returns (init(key) -> RolloutState, rollout(params, version, state, env_steps))."""
    items = algo.buffer.items  # what a step records: trajectories, sequences or transitions
    recurrent = algo.init_carry is not None
    step_env = jax.vmap(env.step)

    def init(key) -> RolloutState:
        key, sub = jax.random.split(key)
        obs, env_state = jax.vmap(env.reset)(jax.random.split(sub, num_envs))
        zeros = jnp.zeros((num_envs,), jnp.float32)
        carry = algo.init_carry(num_envs) if recurrent else None
        return RolloutState(
            env_state, obs, key, EpisodeStats(zeros, zeros.astype(jnp.int32)), carry
        )

    def rollout(params, version, state: RolloutState, env_steps=0):
        def step(s: RolloutState, t):
            key, k_act, k_env = jax.random.split(s.key, 3)
            if recurrent:
                out = algo.act(params, s.obs, k_act, env_steps + t * num_envs, s.carry)
            else:
                out = algo.act(params, s.obs, k_act, env_steps + t * num_envs)
            nxt = step_env(
                jax.random.split(k_env, num_envs),
                s.env_state,
                clip_action(out.action, env.action_spec),
            )
            done = nxt.terminated | nxt.truncated
            carry = None
            if recurrent:  # a new episode starts from a fresh recurrent state
                fresh = algo.init_carry(num_envs)
                carry = jax.tree.map(
                    lambda f, c: jnp.where(done.reshape(done.shape + (1,) * (c.ndim - 1)), f, c),
                    fresh,
                    out.carry,
                )
            stats, ep_ret, ep_len = track_episodes(s.stats, team_reward(nxt.reward, 1), done)
            # envs that report no wins keep the three-field Episodes the runtime's messages carry
            episodes = Episodes(done, ep_ret, ep_len, None if nxt.won is None else nxt.won & done)
            v = jnp.full((num_envs,), version, jnp.int32)
            if items == "trajectories":
                # The truncation bootstrap is evaluated after the scan, batched over [T, B].
                cut = nxt.truncated & ~nxt.terminated
                rec = (
                    s.obs,
                    out.action,
                    nxt.reward,
                    done,
                    (cut, nxt.final_obs),
                    out.log_prob,
                    out.value,
                    v,
                )
            elif items == "sequences":
                rec = Sequences(
                    obs=s.obs,
                    action=out.action,
                    reward=nxt.reward,
                    next_obs=nxt.final_obs,
                    terminated=nxt.terminated,
                    done=done,
                    carry=None,
                    version=v,
                )
            else:
                rec = Transition(
                    obs=s.obs,
                    action=out.action,
                    reward=nxt.reward,
                    next_obs=nxt.final_obs,
                    terminated=nxt.terminated,
                    version=v,
                )
            return RolloutState(nxt.state, nxt.obs, key, stats, carry), (rec, episodes)

        carry0 = state.carry
        state, (rec, episodes) = jax.lax.scan(step, state, jnp.arange(rollout_len))
        if items == "sequences":  # one replay item per env: [B, T, ...] and its start carry
            rec = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), rec)._replace(carry=carry0)
            return state, rec, episodes
        if items == "transitions":
            return state, rec, episodes
        obs, action, reward, done, (cut, final_obs), log_prob, value, v = rec
        values = cut_values(algo.value, params, cut, final_obs)  # [T, B] or, multi-agent, [T, B, N]
        boot, trunc_obs, trunc_t = truncation_bootstrap(values, cut, final_obs)
        batch = Trajectory(
            obs=obs,
            action=action,
            reward=reward,
            done=done,
            bootstrap_value=boot,
            behaviour_log_prob=log_prob,
            behaviour_value=value,
            version=v,
            last_obs=state.obs,
            trunc_obs=trunc_obs,
            trunc_t=trunc_t,
        )
        return state, batch, episodes

    return init, rollout


__all__ = ["Episodes", "RolloutState", "clip_action", "cut_values", "make_rollout", "team_reward"]
