"""Policy evaluation on JAX envs: N episodes run side by side in one jitted loop.

`make_evaluator(env, algo, episodes)` returns a jitted `evaluate(params, key)` that plays
each of `episodes` envs until its first episode ends (greedy by default) and returns their
undiscounted returns [episodes]; with `wins=True` (envs that report wins: SMAX), the pair
(returns, won [episodes] bool).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tianjax.core.algorithm import Algorithm
from tianjax.core.rollout import clip_action, team_reward
from tianjax.core.types import Env


def make_evaluator(
    env: Env,
    algo: Algorithm,
    episodes: int = 10,
    greedy: bool = True,
    max_steps: int = 100_000,
    wins: bool = False,
):
    if wins and not getattr(env, "reports_wins", False):
        raise ValueError(f"env {getattr(env, 'name', env)!r} does not report wins")
    evaluate = jax.jit(
        lambda params, key: _evaluate(env, algo, params, key, episodes, greedy, max_steps)
    )
    return evaluate if wins else (lambda params, key: evaluate(params, key)[0])


def _evaluate(env, algo, params, key, episodes, greedy, max_steps):
    key, sub = jax.random.split(key)
    obs, state = jax.vmap(env.reset)(jax.random.split(sub, episodes))

    recurrent = algo.init_carry is not None

    def cond(c):
        return (~jnp.all(c[4])) & (c[5] < max_steps)

    def body(c):
        obs, state, key, ret, finished, t, carry, won = c
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
        if nxt.won is not None:
            won = won | (~finished & nxt.won)
        finished = finished | nxt.terminated | nxt.truncated
        return nxt.obs, nxt.state, key, ret, finished, t + 1, carry, won

    carry = algo.init_carry(episodes) if recurrent else None
    no = jnp.zeros((episodes,), bool)
    out = jax.lax.while_loop(
        cond, body, (obs, state, key, jnp.zeros((episodes,)), no, 0, carry, no)
    )
    return out[3], out[7]


__all__ = ["make_evaluator"]
