"""IPPO: one agent is single-agent PPO; agent columns; agent ids, masks, centralised value."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tianjax.algos import make_algorithm
from tianjax.algos.ippo import loss as I
from tianjax.algos.ppo.loss import PPOBatch
from tianjax.config import ConfigError, load_config
from tianjax.core.types import ActionSpec, MAObs, Trajectory

T, B, D, A = 8, 4, 5, 3
SPEC = ActionSpec(discrete=True, num_actions=A)
PPO_KEYS = {
    "num_envs": B,
    "rollout_len": T,
    "total_env_steps": 10 * T * B,
    "ppo.num_minibatches": 2,
}


def _config(algo, **kw):
    base = dict(PPO_KEYS, algo=algo, env_backend="jaxmarl" if algo == "ippo" else "gymnax", **kw)
    return load_config({}, [f"{k}={v}" for k, v in base.items()])


def _single_agent_traj(key, version=0):
    ks = jax.random.split(key, 6)
    return Trajectory(
        obs=jax.random.normal(ks[0], (T, B, D)),
        action=jax.random.randint(ks[1], (T, B), 0, A),
        reward=jax.random.normal(ks[2], (T, B)),
        done=jax.random.bernoulli(ks[3], 0.2, (T, B)),
        bootstrap_value=jnp.zeros((T, B)),
        behaviour_log_prob=jnp.log(jax.random.uniform(ks[4], (T, B), minval=0.2, maxval=0.5)),
        behaviour_value=jax.random.normal(ks[5], (T, B)),
        version=jnp.full((T, B), version, jnp.int32),
        last_obs=jax.random.normal(ks[0], (B, D)),
        trunc_obs=jax.random.normal(ks[1], (B, D)),
        trunc_t=jnp.array([-1, 3, -1, 7], jnp.int32),  # envs 1 and 3 were cut by a time limit
    )


def _one_agent(traj):
    """The same data as a multi-agent trajectory with N = 1."""

    def ma(o):
        return MAObs(o[..., None, :], o, jnp.ones(o.shape[:-1] + (1, A), bool))

    ag = lambda x: x[..., None]  # noqa: E731
    return Trajectory(
        obs=ma(traj.obs),
        action=ag(traj.action),
        reward=ag(traj.reward),
        done=traj.done,
        bootstrap_value=ag(traj.bootstrap_value),
        behaviour_log_prob=ag(traj.behaviour_log_prob),
        behaviour_value=ag(traj.behaviour_value),
        version=traj.version,
        last_obs=ma(traj.last_obs),
        trunc_obs=ma(traj.trunc_obs),
        trunc_t=traj.trunc_t,
    )


@pytest.mark.parametrize("correct_staleness", [False, True])
def test_one_agent_ippo_update_equals_ppo(correct_staleness):
    ppo = make_algorithm(_config("ppo"), (D,), SPEC, correct_staleness=correct_staleness)
    ippo = make_algorithm(
        _config("ippo", **{"marl.agent_id": False}),
        MAObs((1, D), (D,), (1, A)),
        SPEC,
        correct_staleness=correct_staleness,
    )
    state = ppo.init(jax.random.key(0))
    jax.tree.map(np.testing.assert_array_equal, state.params, ippo.init(jax.random.key(0)).params)
    # learner version 3, data from version 1: tau = 2 exercises the staleness weights too
    state = state._replace(version=jnp.asarray(3, jnp.int32))
    traj = _single_agent_traj(jax.random.key(1), version=1)
    s_ppo, m_ppo = jax.jit(ppo.update)(state, traj)
    s_ippo, m_ippo = jax.jit(ippo.update)(state, _one_agent(traj))
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
        s_ppo.params,
        s_ippo.params,
    )
    for k in m_ppo:
        np.testing.assert_allclose(m_ppo[k], m_ippo[k], rtol=1e-5, atol=1e-6, err_msg=k)
    assert int(s_ippo.version) == 4
    moved = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), state.params, s_ippo.params)
    assert max(jax.tree.leaves(moved)) > 1e-4  # the update did learn something


@pytest.mark.parametrize("jit", [False, True])
def test_one_agent_ippo_loss_equals_ppo_loss(jit):
    ppo = make_algorithm(_config("ppo"), (D,), SPEC)
    ippo = make_algorithm(
        _config("ippo", **{"marl.agent_id": False}), MAObs((1, D), (D,), (1, A)), SPEC
    )
    params = ppo.init(jax.random.key(2)).params
    traj = _single_agent_traj(jax.random.key(3))
    n = T * B
    flat = lambda x: x.reshape((n,) + x.shape[2:])  # noqa: E731
    adv = jax.random.normal(jax.random.key(4), (n,))
    w = jax.random.uniform(jax.random.key(5), (n,), minval=0.5, maxval=1.5)
    batch = PPOBatch(
        flat(traj.obs),
        flat(traj.action),
        flat(traj.behaviour_log_prob),
        flat(traj.behaviour_value),
        adv,
        adv + flat(traj.behaviour_value),
        w,
    )
    agent_obs = I.AgentObs(batch.obs, batch.obs, jnp.ones((n, A), bool), jnp.ones((n, 1)))
    f_ppo, f_ippo = (jax.jit(a.loss_fn) if jit else a.loss_fn for a in (ppo, ippo))
    l_ppo, m_ppo = f_ppo(params, batch)
    l_ippo, m_ippo = f_ippo(params, batch._replace(obs=agent_obs))
    np.testing.assert_allclose(l_ppo, l_ippo, rtol=1e-6)
    for k in m_ppo:
        np.testing.assert_allclose(m_ppo[k], m_ippo[k], rtol=1e-6, atol=1e-7, err_msg=k)


def test_agent_columns_by_hand():
    t, b, n = 2, 2, 3
    val = jnp.arange(t * b * n, dtype=jnp.float32).reshape(t, b, n)  # agent i of env b at t
    obs = MAObs(
        val[..., None], jnp.stack([val[..., 0], -val[..., 0]], -1), jnp.ones((t, b, n, 2), bool)
    )
    traj = Trajectory(
        obs=obs,
        action=val.astype(jnp.int32),
        reward=val,
        done=jnp.array([[True, False], [False, True]]),
        bootstrap_value=val,
        behaviour_log_prob=val,
        behaviour_value=val,
        version=jnp.array([[5, 6], [7, 8]], jnp.int32),
        last_obs=MAObs(val[0, ..., None], jnp.zeros((b, 2)), jnp.ones((b, n, 2), bool)),
        trunc_obs=MAObs(val[1, ..., None], jnp.zeros((b, 2)), jnp.ones((b, n, 2), bool)),
        trunc_t=jnp.array([-1, 1], jnp.int32),
    )
    cols = I.agent_columns(traj)
    assert cols.reward.shape == (t, b * n)
    # column b * N + i is agent i of env b
    np.testing.assert_array_equal(cols.reward[1], [6, 7, 8, 9, 10, 11])
    np.testing.assert_array_equal(cols.done[0], [True] * 3 + [False] * 3)
    np.testing.assert_array_equal(cols.version[1], [7, 7, 7, 8, 8, 8])
    np.testing.assert_array_equal(cols.obs.agent_id[0, 4], [0, 1, 0])
    np.testing.assert_array_equal(cols.obs.state[1, 3], [9, -9])  # env 1's global state
    assert cols.last_obs.obs.shape == (b * n, 1)
    np.testing.assert_array_equal(cols.trunc_t, [-1, -1, -1, 1, 1, 1])
    np.testing.assert_array_equal(cols.trunc_obs.obs[:, 0], val[1].reshape(-1))


def test_agent_id_separates_agents_and_masks_hold():
    cfg = _config("ippo")
    algo = make_algorithm(cfg, MAObs((3, D), (7,), (3, A)), SPEC)
    params = algo.init(jax.random.key(0)).params
    same = jnp.ones((64, 3, D))
    avail = jnp.broadcast_to(jnp.array([True, False, True]), (64, 3, A))
    obs = MAObs(same, jnp.zeros((64, 7)), avail)
    out = algo.act(params, obs, jax.random.key(1))
    assert (
        out.action.shape == (64, 3) and out.log_prob.shape == (64, 3) and out.value.shape == (64, 3)
    )
    assert not bool(jnp.any(out.action == 1))  # the masked action is never taken
    v = algo.value(params, obs)[0]
    assert len({float(x) for x in v}) == 3  # the one-hot id tells identical agents apart


def test_centralised_value_reads_the_state_not_the_obs():
    cfg = _config("ippo", **{"marl.centralised_value": True})
    algo = make_algorithm(cfg, MAObs((2, D), (6,), (2, A)), SPEC)
    params = algo.init(jax.random.key(0)).params
    k1, k2 = jax.random.split(jax.random.key(1))
    obs = MAObs(
        jax.random.normal(k1, (4, 2, D)), jax.random.normal(k2, (4, 6)), jnp.ones((4, 2, A), bool)
    )
    v = algo.value(params, obs)
    np.testing.assert_array_equal(v, algo.value(params, obs._replace(obs=obs.obs + 1.0)))
    assert not np.allclose(v, algo.value(params, obs._replace(state=obs.state + 1.0)))


def test_single_and_multi_agent_mismatch_names_the_key():
    with pytest.raises(ConfigError, match="'env_backend'"):
        load_config({"algo": "ippo", "env": "CartPole-v1"})
    with pytest.raises(ConfigError, match="'algo'"):
        load_config({"algo": "ppo", "env": "MPE_simple_spread_v3", "env_backend": "jaxmarl"})


def test_multi_agent_algos_take_actor_processes_but_not_acting_inside_the_learner():
    for algo in ("ippo", "qmix", "maddpg"):
        base = {"algo": algo, "env": "SMAX_3m", "env_backend": "jaxmarl", "num_actors": 2}
        assert load_config({**base, "mode": "async"}).mode == "async"
        with pytest.raises(ConfigError, match="^config key 'num_actors'"):
            load_config({**base, "mode": "sync", "num_actors": 0})


def test_fused_ippo_on_smax_reports_wins(tmp_path):
    import json

    import tianjax

    run = tmp_path / "smax"
    result = tianjax.train(
        {
            "algo": "ippo",
            "env": "SMAX_3m",
            "env_backend": "jaxmarl",
            "num_envs": 4,
            "rollout_len": 64,
            "total_env_steps": 512,
            "log_every": 1,
            "target_return": None,
            "target_win_rate": 0.9,
            "compile_cache": None,
            "eval": {"episodes": 8},
        },
        run_dir=str(run),
        progress=False,
        verbose=False,
    )
    s = result.summary
    assert s["env_steps"] == 512 and s["updates"] == 2 and s["target_win_rate"] == 0.9
    # 128 steps per env: every env has ended at least one battle (SMAX's limit is 101 steps)
    assert s["episodes"] >= 4 and 0.0 <= s["final_win_rate"] <= 1.0
    assert s["eval_win_rate"] * 8 == round(s["eval_win_rate"] * 8)  # the greedy policy's 8 battles
    # `tianjax eval` / tianjax.evaluate from the final checkpoint: the same 8 battles (same
    # seed, same params), so the same returns and win rate, and the line says it
    ev = tianjax.evaluate(str(run), episodes=8)
    assert ev.won.shape == (8,) and ev.win_rate == s["eval_win_rate"]
    assert np.isclose(ev.returns.mean(), s["eval_return"], atol=1e-5)
    assert f"win rate {s['eval_win_rate']:.3f}" in ev.line()
    records = [json.loads(line) for line in open(run / "metrics.jsonl")]
    assert all("win_rate_100" in r for r in records if "eval_return" not in r)
    # the final evaluation's record has the greedy policy's win rate
    assert [r["eval_win_rate"] for r in records if "eval_return" in r] == [s["eval_win_rate"]]
    from tianjax.metrics.report import load_runs, table_rows, write_report

    rep = write_report([str(run)], str(tmp_path / "report"))  # `tianjax report`: the win-rate curve
    assert any(f.endswith("win_rate_vs_steps.png") for f in rep.figures)
    assert table_rows(load_runs([str(run)]))[0]["final_win_rate"] == s["final_win_rate"]


def test_progress_counts_env_steps_not_agent_samples():
    cfg = _config("ippo")
    algo = make_algorithm(cfg, MAObs((3, D), (7,), (3, A)), SPEC)
    state = algo.init(jax.random.key(0))
    k = jax.random.split(jax.random.key(1), 4)
    obs = MAObs(
        jax.random.normal(k[0], (T, B, 3, D)), jnp.zeros((T, B, 7)), jnp.ones((T, B, 3, A), bool)
    )
    last = MAObs(jnp.zeros((B, 3, D)), jnp.zeros((B, 7)), jnp.ones((B, 3, A), bool))
    z = jnp.zeros((T, B, 3))
    traj = Trajectory(
        obs=obs,
        action=jax.random.randint(k[1], (T, B, 3), 0, A),
        reward=jax.random.normal(k[2], (T, B, 3)),
        done=jnp.zeros((T, B), bool),
        bootstrap_value=z,
        behaviour_log_prob=jnp.full((T, B, 3), -1.0),
        behaviour_value=z,
        version=jnp.zeros((T, B), jnp.int32),
        last_obs=last,
        trunc_obs=last,
        trunc_t=jnp.full((B,), -1, jnp.int32),
    )
    new, metrics = jax.jit(algo.update)(state, traj)
    assert (
        int(new.fresh_steps) == T * B
    )  # 3 agents, but T * B env steps: the lr anneals on env steps
    new, _ = jax.jit(algo.update)(new, traj, False)  # a reuse pass adds no progress
    assert int(new.fresh_steps) == T * B
