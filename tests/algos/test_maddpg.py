"""MADDPG: centralised critics over every agent's action, per-agent actors, targets, a fused run."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tianjax.algos import make_algorithm
from tianjax.algos.maddpg import loss as M
from tianjax.config import ConfigError, load_config
from tianjax.core.types import ActionSpec, MAObs, Transition

N, D, S, A = 3, 4, 12, 2
SPEC = ActionSpec(
    discrete=False, shape=(A,), low=np.zeros(A, np.float32), high=np.ones(A, np.float32)
)
SHAPES = MAObs((N, D), (S,), (N, 1))


def _algo(**kw):
    cfg = load_config(
        {
            "algo": "maddpg",
            "env": "MPE_simple_spread_v3_continuous",
            "env_backend": "jaxmarl",
            "num_envs": 4,
            "rollout_len": 8,
            "total_env_steps": 64,
            "maddpg": dict({"buffer_size": 64, "batch_size": 16}, **kw),
        }
    )
    return cfg, make_algorithm(cfg, SHAPES, SPEC)


def test_every_critic_takes_all_agents_actions():
    cfg, algo = _algo()
    params = algo.init(jax.random.key(0)).params
    _, critic_apply, _, _ = M.make_networks(cfg, N, SPEC)
    state = jax.random.normal(jax.random.key(1), (S,))
    actions = jax.random.uniform(jax.random.key(2), (N, A))
    # d Q_i / d a^j is non-zero for every critic i and every agent j
    jac = jax.jacobian(lambda a: critic_apply(params.critic, state, a))(actions)  # [i, j, A]
    assert jac.shape == (N, N, A)
    assert bool(jnp.all(jnp.abs(jac).sum(-1) > 1e-6))
    # changing only another agent's action changes Q_0
    q = critic_apply(params.critic, state, actions)
    q2 = critic_apply(params.critic, state, actions.at[2].add(0.5))
    assert abs(float(q2[0] - q[0])) > 1e-6
    # the critics are separate networks: the same inputs give different Qs
    assert len({round(float(x), 6) for x in q}) == N


def test_actors_are_per_agent_and_exploration_stays_in_bounds():
    _, algo = _algo(noise_std=5.0)
    params = algo.init(jax.random.key(0)).params
    obs = MAObs(jnp.ones((7, N, D)), jnp.zeros((7, S)), jnp.ones((7, N, 1), bool))
    mu = algo.greedy(params, obs)
    assert mu.shape == (7, N, A)
    assert not np.allclose(mu[:, 0], mu[:, 1])  # same observation, different actors
    out = algo.act(params, obs, jax.random.key(3))
    assert bool(jnp.all((out.action >= 0) & (out.action <= 1)))
    assert not np.allclose(out.action, mu)


def _batch(key, B=16):
    ks = jax.random.split(key, 6)
    obs = MAObs(
        jax.random.normal(ks[0], (B, N, D)),
        jax.random.normal(ks[1], (B, S)),
        jnp.ones((B, N, 1), bool),
    )
    nxt = MAObs(
        jax.random.normal(ks[2], (B, N, D)),
        jax.random.normal(ks[3], (B, S)),
        jnp.ones((B, N, 1), bool),
    )
    return Transition(
        obs,
        jax.random.uniform(ks[4], (B, N, A)),
        jax.random.normal(ks[5], (B, N)),
        nxt,
        jnp.arange(B) % 4 == 0,
        jnp.zeros((B,), jnp.int32),
    )


def test_target_by_hand_and_actor_gradient_only_reaches_actors():
    cfg, algo = _algo()
    params = algo.init(jax.random.key(0)).params
    target = jax.tree.map(lambda x: x * 0.5, params)
    actor_apply, critic_apply, _, _ = M.make_networks(cfg, N, SPEC)
    batch = _batch(jax.random.key(4))
    _, m = algo.loss_fn(params, target, batch, jnp.ones((16,)))
    q_next = critic_apply(
        target.critic, batch.next_obs.state, actor_apply(target.actor, batch.next_obs.obs)
    )
    y = batch.reward + cfg.maddpg.gamma * (1.0 - batch.terminated[:, None]) * q_next
    np.testing.assert_allclose(m["target_mean"], jnp.mean(y), rtol=1e-5)
    # the actor term moves no critic: its gradient w.r.t. the critics is zero
    actor_term = lambda p: algo.loss_fn(p, target, batch, jnp.ones((16,)))[1]["actor_loss"]  # noqa: E731
    g = jax.grad(actor_term)(params)
    assert all(float(jnp.abs(x).max()) == 0.0 for x in jax.tree.leaves(g.critic))
    assert any(float(jnp.abs(x).max()) > 0.0 for x in jax.tree.leaves(g.actor))


def test_actor_gradient_is_each_agents_own_chain_rule():
    """grad_theta_i of the actor loss, against jax.grad of the closed form written here:

        J(theta) = -(1/B) sum_b w_b sum_i Q_i(s_b, a_b^1, ..., mu_i(o_b^i; theta_i), ..., a_b^N)

    where only agent i's action comes from its current policy, every other agent's from
    the batch, and critic i is agent i's own. Feeding every critic every agent's current
    action, or critic i another agent's action, gives another gradient."""
    cfg, algo = _algo()
    params = algo.init(jax.random.key(0)).params
    target = jax.tree.map(lambda x: x * 0.5, params)
    _, _, actor, critic = M.make_networks(cfg, N, SPEC)
    batch = _batch(jax.random.key(6))
    w = jnp.asarray(np.random.default_rng(0).uniform(0.2, 2.0, (16,)), jnp.float32)

    def agent(tree, i):
        return jax.tree.map(lambda x: x[i], tree)

    def closed_form(actor_params):
        total = 0.0
        for i in range(N):
            mu_i = actor.apply(agent(actor_params, i), batch.obs.obs[:, i])  # [B, A]
            joint = batch.action.at[:, i].set(mu_i)  # the others' actions from the batch
            q_i = critic.apply(agent(params.critic, i), batch.obs.state, joint)  # [B]
            total = total + jnp.mean(w * q_i)
        return -total

    expected = jax.grad(closed_form)(params.actor)
    # the critic loss does not depend on the actors, so the whole loss's actor gradient is it
    got = jax.grad(lambda p: algo.loss_fn(p, target, batch, w)[0])(params).actor
    chex.assert_trees_all_close(got, expected, rtol=2e-4, atol=1e-6)
    np.testing.assert_allclose(
        float(algo.loss_fn(params, target, batch, w)[1]["actor_loss"]),
        float(closed_form(params.actor)),
        rtol=1e-5,
    )
    assert all(float(jnp.abs(x).max()) > 1e-4 for x in jax.tree.leaves(expected))


def test_soft_target_update():
    _, algo = _algo(target_tau=0.25)
    state = algo.init(jax.random.key(0))
    state = state._replace(target_params=jax.tree.map(jnp.zeros_like, state.params))
    new, _ = jax.jit(algo.update)(state, _batch(jax.random.key(5)))
    jax.tree.map(
        lambda t, p: np.testing.assert_allclose(t, 0.25 * p, rtol=1e-5, atol=1e-7),
        new.target_params,
        new.params,
    )


def test_discrete_env_is_refused_by_name():
    cfg, _ = _algo()
    with pytest.raises(ConfigError, match="'env'"):
        make_algorithm(cfg, SHAPES, ActionSpec(discrete=True, num_actions=5))


def test_fused_maddpg_runs_its_config_small(tmp_path):
    import tianjax

    result = tianjax.train(
        "configs/maddpg_mpe_spread.yaml",
        [
            "total_env_steps=2048",
            "num_envs=4",
            "rollout_len=32",
            "log_every=4",
            "maddpg.learning_starts=512",
            "maddpg.batch_size=64",
            "eval.episodes=2",
            "compile_cache=null",
        ],
        run_dir=str(tmp_path / "m"),
        progress=False,
        verbose=False,
    )
    s = result.summary
    # 16 iterations of 128 env steps, learning from the 4th (512 steps collected): 13 x 4 updates
    assert s["env_steps"] == 2048 and s["updates"] == 52 and s["skipped_updates"] == 0
    assert np.isfinite(s["eval_return"]) and np.isfinite(result.metrics["critic_loss"][-1])
    # the final evaluation is a record of its own, kept apart from the training columns
    assert result.evaluations["eval_return"].tolist() == [s["eval_return"]]
    assert result.evaluations["updates"].tolist() == [52]
