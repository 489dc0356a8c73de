"""A minimal single-function fused PPO, the reference for tianjax's fused training speed.

It has the shape of the well-known single-file JAX PPO (PureJaxRL's): 2x64 tanh actor and
critic, GAE, 4 epochs x 4 minibatches, Adam with linear annealing, one jitted scan over all
updates. It has none of tianjax's extras (truncation bootstrapping, version stamps,
non-finite guard, episode bookkeeping), so it is the bare cost of the algorithm on this
machine. Used by experiments/benchmarks/bench_fused.py and
experiments/studies/beyond_cartpole/minatar_vs_minimal.py (which
flattens MinAtar's maps into its input).
"""

from __future__ import annotations

import flax.linen as nn
import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import optax


class _AC(nn.Module):
    num_actions: int

    @nn.compact
    def __call__(self, x):
        x = x.reshape(x.shape[0], -1)  # maps (MinAtar's 10x10xC) flattened
        o = nn.initializers.orthogonal
        a = nn.tanh(nn.Dense(64, kernel_init=o(np.sqrt(2)))(x))
        a = nn.tanh(nn.Dense(64, kernel_init=o(np.sqrt(2)))(a))
        logits = nn.Dense(self.num_actions, kernel_init=o(0.01))(a)
        c = nn.tanh(nn.Dense(64, kernel_init=o(np.sqrt(2)))(x))
        c = nn.tanh(nn.Dense(64, kernel_init=o(np.sqrt(2)))(c))
        return logits, nn.Dense(1, kernel_init=o(1.0))(c)[:, 0]


def make_train(
    env_name="CartPole-v1",
    num_envs=4,
    num_steps=128,
    total_steps=500_000,
    epochs=4,
    minibatches=4,
    lr=2.5e-4,
    gamma=0.99,
    lam=0.95,
    clip=0.2,
    ent=0.01,
    vf=0.5,
    max_norm=0.5,
    anneal=True,
):
    env, env_params = gymnax.make(env_name)
    n_updates = total_steps // (num_envs * num_steps)
    batch = num_envs * num_steps
    mb = batch // minibatches
    net = _AC(env.action_space(env_params).n)
    tx = optax.chain(
        optax.clip_by_global_norm(max_norm),
        optax.adam(
            optax.linear_schedule(lr, 0.0 if anneal else lr, n_updates * epochs * minibatches),
            eps=1e-5,
        ),
    )

    def train(key):
        key, k1, k2 = jax.random.split(key, 3)
        params = net.init(k1, jnp.zeros((1,) + env.observation_space(env_params).shape))
        opt = tx.init(params)
        obs, st = jax.vmap(env.reset, (0, None))(jax.random.split(k2, num_envs), env_params)

        def update(carry, _):
            params, opt, st, obs, key = carry

            def step(c, _):
                st, obs, key = c
                key, ka, ke = jax.random.split(key, 3)
                logits, v = net.apply(params, obs)
                a = jax.random.categorical(ka, logits)
                lp = jnp.take_along_axis(jax.nn.log_softmax(logits), a[:, None], 1)[:, 0]
                obs2, st, r, term, trunc, _ = jax.vmap(env.step, (0, 0, 0, None))(
                    jax.random.split(ke, num_envs), st, a, env_params
                )
                return (st, obs2, key), (obs, a, r, term | trunc, lp, v)

            with jax.named_scope("rollout"):  # (names for benchmarks/profile_fused.py only)
                (st, obs, key), tr = jax.lax.scan(step, (st, obs, key), None, num_steps)
            o, a, r, d, lp, v = tr
            _, last_v = net.apply(params, obs)

            def gae(c, x):
                adv, nv = c
                r_, d_, v_ = x
                delta = r_ + gamma * nv * (1 - d_) - v_
                adv = delta + gamma * lam * (1 - d_) * adv
                return (adv, v_), adv

            with jax.named_scope("advantages"):
                _, adv = jax.lax.scan(
                    gae, (jnp.zeros_like(last_v), last_v), (r, d, v), reverse=True
                )
            tgt = adv + v

            def epoch(c, _):
                params, opt, key = c
                key, kp = jax.random.split(key)
                with jax.named_scope("shuffle"):
                    perm = jax.random.permutation(kp, batch)
                    data = jax.tree.map(
                        lambda x: x.reshape((batch,) + x.shape[2:])[perm].reshape(
                            (minibatches, mb) + x.shape[2:]
                        ),
                        (o, a, lp, v, adv, tgt),
                    )

                def mb_step(c, d):
                    params, opt = c
                    o_, a_, lp_, v_, adv_, tgt_ = d

                    def loss(p):
                        logits, val = net.apply(p, o_)
                        logp = jax.nn.log_softmax(logits)
                        nlp = jnp.take_along_axis(logp, a_[:, None], 1)[:, 0]
                        vc = v_ + jnp.clip(val - v_, -clip, clip)
                        vl = 0.5 * jnp.maximum((val - tgt_) ** 2, (vc - tgt_) ** 2).mean()
                        ratio = jnp.exp(nlp - lp_)
                        an = (adv_ - adv_.mean()) / (adv_.std() + 1e-8)
                        pl = -jnp.minimum(
                            ratio * an, jnp.clip(ratio, 1 - clip, 1 + clip) * an
                        ).mean()
                        entropy = -(jnp.exp(logp) * logp).sum(-1).mean()
                        return pl + vf * vl - ent * entropy

                    with jax.named_scope("loss"):
                        g = jax.grad(loss)(params)
                    with jax.named_scope("optimizer"):
                        u, opt = tx.update(g, opt)
                        params = optax.apply_updates(params, u)
                    return (params, opt), None

                (params, opt), _ = jax.lax.scan(mb_step, (params, opt), data)
                return (params, opt, key), None

            (params, opt, key), _ = jax.lax.scan(epoch, (params, opt, key), None, epochs)
            return (params, opt, st, obs, key), (r, d)

        carry, (r, d) = jax.lax.scan(update, (params, opt, st, obs, key), None, n_updates)
        return carry[0], r, d

    return train, n_updates * batch
