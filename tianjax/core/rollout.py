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

from tianjax.algos.base import Algorithm
from tianjax.core.episodes import Episodes, team_reward, track_episodes, truncation_bootstrap
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


def make_rollout(env: Env, algo: Algorithm, num_envs: int, rollout_len: int):
    """Returns (init(key) -> RolloutState, rollout(params, version, state, env_steps))."""
    onpolicy = algo.buffer == "onpolicy"
    recurrent = algo.init_carry is not None
    step_env = jax.vmap(env.step)

    def init(key) -> RolloutState:
        key, sub = jax.random.split(key)
        obs, env_state = jax.vmap(env.reset)(jax.random.split(sub, num_envs))
        zeros = jnp.zeros((num_envs,), jnp.float32)
        carry = algo.init_carry(num_envs) if recurrent else None
        return RolloutState(env_state, obs, key, EpisodeStats(zeros, zeros.astype(jnp.int32)), carry)

    def rollout(params, version, state: RolloutState, env_steps=0):
        def step(s: RolloutState, t):
            key, k_act, k_env = jax.random.split(s.key, 3)
            if recurrent:
                out = algo.act(params, s.obs, k_act, env_steps + t * num_envs, s.carry)
            else:
                out = algo.act(params, s.obs, k_act, env_steps + t * num_envs)
            nxt = step_env(jax.random.split(k_env, num_envs), s.env_state,
                           clip_action(out.action, env.action_spec))
            done = nxt.terminated | nxt.truncated
            carry = None
            if recurrent:  # a new episode starts from a fresh recurrent state
                fresh = algo.init_carry(num_envs)
                carry = jax.tree.map(lambda f, c: jnp.where(done.reshape(done.shape + (1,) * (c.ndim - 1)), f, c),
                                     fresh, out.carry)
            stats, ep_ret, ep_len = track_episodes(s.stats, team_reward(nxt.reward, 1), done)
            # envs that report no wins keep the three-field Episodes the runtime's messages carry
            episodes = Episodes(done, ep_ret, ep_len, None if nxt.won is None else nxt.won & done)
            v = jnp.full((num_envs,), version, jnp.int32)
            if onpolicy:
                # The truncation bootstrap is evaluated after the scan, batched over [T, B].
                cut = nxt.truncated & ~nxt.terminated
                rec = (s.obs, out.action, nxt.reward, done, (cut, nxt.final_obs), out.log_prob,
                       out.value, v)
            elif algo.buffer == "sequences":
                rec = Sequences(s.obs, out.action, nxt.reward, nxt.final_obs, nxt.terminated, done, None, v)
            else:
                rec = Transition(s.obs, out.action, nxt.reward, nxt.final_obs, nxt.terminated, v)
            return RolloutState(nxt.state, nxt.obs, key, stats, carry), (rec, episodes)

        carry0 = state.carry
        state, (rec, episodes) = jax.lax.scan(step, state, jnp.arange(rollout_len))
        if algo.buffer == "sequences":  # one replay item per env: [B, T, ...] and its start carry
            rec = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), rec)._replace(carry=carry0)
            return state, rec, episodes
        if not onpolicy:
            return state, rec, episodes
        obs, action, reward, done, (cut, final_obs), log_prob, value, v = rec
        # NOTE: one [T * B] forward is far cheaper than T small ones inside the scan.
        values = algo.value(params, final_obs)  # [T, B] or, multi-agent, [T, B, N]
        boot, trunc_obs, trunc_t = truncation_bootstrap(values, cut, final_obs)
        batch = Trajectory(obs, action, reward, done, boot, log_prob, value, v, state.obs, trunc_obs, trunc_t)
        return state, batch, episodes

    return init, rollout


__all__ = ["Episodes", "RolloutState", "clip_action", "make_rollout", "team_reward"]
