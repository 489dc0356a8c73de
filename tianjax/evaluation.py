"""Policy evaluation on JAX envs: N episodes run side by side in one jitted loop.

`make_evaluator(env, algo, episodes)` returns a jitted `evaluate(params, key)` that plays
each of `episodes` envs until its first episode ends (greedy by default) and returns their
undiscounted returns [episodes].
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tianjax.algos.base import Algorithm
from tianjax.envs.jax_env import JaxEnv
from tianjax.rollout import clip_action


def make_evaluator(env: JaxEnv, algo: Algorithm, episodes: int = 10, greedy: bool = True,
                   max_steps: int = 100_000):
    return jax.jit(lambda params, key: _evaluate(env, algo, params, key, episodes, greedy, max_steps))


def _evaluate(env, algo, params, key, episodes, greedy, max_steps):
    key, sub = jax.random.split(key)
    obs, state = jax.vmap(env.reset)(jax.random.split(sub, episodes))

    def cond(c):
        _, _, _, _, finished, t = c
        return (~jnp.all(finished)) & (t < max_steps)

    def body(c):
        obs, state, key, ret, finished, t = c
        key, k_act, k_env = jax.random.split(key, 3)
        if greedy:
            action = algo.greedy(params, obs)
        else:
            action = algo.act(params, obs, k_act, jnp.iinfo(jnp.int32).max).action
        nxt = jax.vmap(env.step)(jax.random.split(k_env, episodes), state,
                                 clip_action(action, env.action_spec))
        ret = ret + jnp.where(finished, 0.0, nxt.reward)
        finished = finished | nxt.terminated | nxt.truncated
        return nxt.obs, nxt.state, key, ret, finished, t + 1

    init = (obs, state, key, jnp.zeros((episodes,)), jnp.zeros((episodes,), bool), 0)
    return jax.lax.while_loop(cond, body, init)[3]
