"""Policy evaluation on JAX envs: N episodes run side by side in one jitted loop.

`play_episodes(env, algo, params, key, episodes)` plays each of `episodes` envs until its
first episode ends (greedy by default, or sampled as an actor acts) and returns an
EvalOutput of [episodes] arrays: the undiscounted returns, the lengths, and, for envs that
report wins (SMAX), whether each was won. It is pure: the fused runner calls it inside its
jitted chunk program, vmapped over seeds; `make_evaluator` jits it on its own.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from tianjax.core.algorithm import Algorithm
from tianjax.core.rollout import clip_action, team_reward
from tianjax.core.types import Env


class EvalOutput(NamedTuple):
    returns: jax.Array  # [episodes] float32, each env's first episode, undiscounted
    lengths: jax.Array  # [episodes] int32, its steps (max_steps where it did not end)
    won: jax.Array  # [episodes] bool (all False where the env reports no wins)


def make_evaluator(
    env: Env,
    algo: Algorithm,
    episodes: int = 10,
    greedy: bool = True,
    max_steps: int = 100_000,
    wins: bool = False,
):
    """A jitted evaluate(params, key) -> returns [episodes]; with `wins=True` (envs that
    report wins: SMAX), the pair (returns, won [episodes] bool)."""
    if wins and not getattr(env, "reports_wins", False):
        raise ValueError(f"env {getattr(env, 'name', env)!r} does not report wins")
    evaluate = jax.jit(
        lambda params, key: play_episodes(env, algo, params, key, episodes, greedy, max_steps)
    )
    if wins:
        return lambda params, key: evaluate(params, key)[::2]
    return lambda params, key: evaluate(params, key).returns


def play_episodes(
    env: Env,
    algo: Algorithm,
    params,
    key: jax.Array,
    episodes: int,
    greedy: bool = True,
    max_steps: int = 100_000,
) -> EvalOutput:
    """`episodes` envs, each until its first episode ends (or max_steps): EvalOutput."""
    key, sub = jax.random.split(key)
    obs, state = jax.vmap(env.reset)(jax.random.split(sub, episodes))

    recurrent = algo.init_carry is not None

    def cond(c):
        return (~jnp.all(c[4])) & (c[5] < max_steps)

    def body(c):
        obs, state, key, ret, finished, t, carry, won, length = c
        key, k_act, k_env = jax.random.split(key, 3)
        if recurrent:  # each env plays one episode, so the carry never needs a reset
            if greedy:
                action, carry = algo.greedy(params, obs, carry)
            else:
                out = algo.act(params, obs, k_act, jnp.iinfo(jnp.int32).max, carry)
                action, carry = out.action, out.carry
        elif greedy:
            action = algo.greedy(params, obs)
        else:
            action = algo.act(params, obs, k_act, jnp.iinfo(jnp.int32).max).action
        nxt = jax.vmap(env.step)(
            jax.random.split(k_env, episodes), state, clip_action(action, env.action_spec)
        )
        ret = ret + jnp.where(finished, 0.0, team_reward(nxt.reward, 1))
        length = length + (~finished).astype(jnp.int32)
        if nxt.won is not None:
            won = won | (~finished & nxt.won)
        finished = finished | nxt.terminated | nxt.truncated
        return nxt.obs, nxt.state, key, ret, finished, t + 1, carry, won, length

    carry = algo.init_carry(episodes) if recurrent else None
    no = jnp.zeros((episodes,), bool)
    out = jax.lax.while_loop(
        cond,
        body,
        (
            obs,
            state,
            key,
            jnp.zeros((episodes,)),
            no,
            0,
            carry,
            no,
            jnp.zeros((episodes,), jnp.int32),
        ),
    )
    return EvalOutput(out[3], out[8], out[7])


__all__ = ["EvalOutput", "make_evaluator", "play_episodes"]
