"""Multi-agent learning against a random policy, on the same env in the same run.

    .venv/bin/python experiments/studies/marl/marl_learning.py configs/ippo_mpe_spread.yaml \
        [key=value ...]

Trains the config with `tianjax.train` and plays uniformly random (available) actions in
the same env for as many episodes, then prints both: the final return (mean of the last 100
episodes, the agents' mean reward summed over an episode) and, for envs that report wins
(SMAX), the win rates. Env steps count decisions of all agents at once (one step of every
agent); wall and compile times are the run's own.
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np

import tianjax
from tianjax.config import load_config
from tianjax.core import team_reward
from tianjax.envs import make_jax_env


def random_policy(env, episodes: int, seed: int = 0) -> tuple[float, float | None]:
    """Mean return (and win rate, where the env reports wins) of uniformly random actions
    among the available ones, over `episodes` episodes played side by side."""

    def play(key):
        key, sub = jax.random.split(key)
        obs, state = jax.vmap(env.reset)(jax.random.split(sub, episodes))
        zeros = jnp.zeros((episodes,))

        def cond(c):
            return ~jnp.all(c[4])

        def body(c):
            obs, state, key, ret, finished, won = c
            key, k_act, k_env = jax.random.split(key, 3)
            if env.action_spec.discrete:
                action = jax.random.categorical(k_act, jnp.where(obs.avail, 0.0, -1e9))
            else:
                shape = obs.obs.shape[:-1] + tuple(env.action_spec.shape)
                action = jax.random.uniform(
                    k_act, shape, minval=env.action_spec.low, maxval=env.action_spec.high
                )
            nxt = jax.vmap(env.step)(jax.random.split(k_env, episodes), state, action)
            ret = ret + jnp.where(finished, 0.0, team_reward(nxt.reward, 1))
            done = nxt.terminated | nxt.truncated
            if nxt.won is not None:  # envs that report wins (SMAX)
                won = won | (~finished & done & nxt.won)
            return nxt.obs, nxt.state, key, ret, finished | done, won

        init = (obs, state, key, zeros, zeros.astype(bool), zeros.astype(bool))
        out = jax.lax.while_loop(cond, body, init)
        return out[3], out[5]

    ret, won = jax.jit(play)(jax.random.key(seed))
    return float(np.mean(ret)), (
        float(np.mean(won)) if getattr(env, "reports_wins", False) else None
    )


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("config")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--random-episodes", type=int, default=1000)
    args = parser.parse_args(argv)
    config = load_config(args.config, args.overrides)
    env = make_jax_env(config.env_backend, config.env)
    rand_ret, rand_win = random_policy(env, args.random_episodes, config.seed)
    result = tianjax.train(config, progress=False, verbose=False)
    s = result.summary
    row = {
        "config": args.config,
        "env": config.env,
        "algo": config.algo,
        "env_steps": s["env_steps"],
        "wall_time_s": round(s["wall_time_s"], 1),
        "compile_time_s": round(s["compile_time_s"], 1),
        "final_return": round(s["final_return"], 2),
        "random_return": round(rand_ret, 2),
        "final_win_rate": s.get("final_win_rate"),
        "random_win_rate": rand_win,
        "eval_return": None if s.get("eval_return") is None else round(s["eval_return"], 2),
        "eval_win_rate": s.get("eval_win_rate"),
        "convergence_env_steps": s.get("convergence_env_steps"),
        "run_dir": s["run_dir"],
    }
    print("| " + " | ".join(row) + " |")
    print("|" + "---|" * len(row))
    print("| " + " | ".join("-" if v is None else str(v) for v in row.values()) + " |")
    print(json.dumps(row))
    return row


if __name__ == "__main__":
    main()
