"""The return of a uniformly random policy on gymnax envs: the floor a learner must beat.

    python experiments/studies/beyond_cartpole/random_returns.py Breakout-MinAtar \
        SpaceInvaders-MinAtar

256 envs x 2,000 steps in one jitted scan per env; prints the mean return of the episodes
that finished (each counted once, auto-reset).
"""

from __future__ import annotations

import argparse

import gymnax
import jax
import jax.numpy as jnp


def random_return(
    name: str, num_envs: int = 256, steps: int = 2000, seed: int = 0
) -> tuple[float, int]:
    env, params = gymnax.make(name)
    num_actions = env.action_space(params).n

    def run(key):
        k0, key = jax.random.split(key)
        _, state = jax.vmap(env.reset, (0, None))(jax.random.split(k0, num_envs), params)

        def step(carry, k):
            state, ret, total, episodes = carry
            k_act, k_env = jax.random.split(k)
            action = jax.random.randint(k_act, (num_envs,), 0, num_actions)
            out = jax.vmap(env.step, (0, 0, 0, None))(
                jax.random.split(k_env, num_envs), state, action, params
            )
            state, reward, done = out[1], out[2], out[3]
            ret = ret + reward
            total = total + jnp.sum(jnp.where(done, ret, 0.0))
            return (state, jnp.where(done, 0.0, ret), total, episodes + jnp.sum(done)), None

        init = (state, jnp.zeros(num_envs), jnp.float32(0.0), jnp.int32(0))
        (_, _, total, episodes), _ = jax.lax.scan(step, init, jax.random.split(key, steps))
        return total / episodes, episodes

    mean, episodes = jax.jit(run)(jax.random.key(seed))
    return float(mean), int(episodes)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("envs", nargs="+", help="gymnax env ids")
    args = ap.parse_args(argv)
    for name in args.envs:
        mean, episodes = random_return(name)
        print(f"{name}: random-policy mean return {mean:.2f} over {episodes} episodes", flush=True)


if __name__ == "__main__":
    main()
