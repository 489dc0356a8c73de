"""DQN: hand-computed double-Q / Huber loss, staleness equivalence at tau = 0, target
syncs, the epsilon schedule, a fused replay run."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tianjax.algos import make_algorithm
from tianjax.algos.dqn import loss as dqn
from tianjax.config import ConfigError, load_config
from tianjax.core.types import ActionSpec, Transition

JIT = [False, True]


def _maybe_jit(fn, jit):
    return jax.jit(fn) if jit else fn


# ----------------------------------------------------------------------------- the loss
#
# A tabular "network": obs is a one-hot state, Q(s, .) = obs @ params["q"] (3 states, 2
# actions), so every Q-value in the loss is chosen by hand.

Q_ONLINE = np.array([[1.0, 2.0], [3.0, 0.0], [0.5, 4.0]], np.float32)
Q_TARGET = np.array([[10.0, 20.0], [5.0, 7.0], [1.0, 2.0]], np.float32)
GAMMA, DELTA = 0.9, 1.0


def table_apply(params, obs):
    return obs @ params["q"]


def _onehot(states):
    return jnp.eye(3, dtype=jnp.float32)[jnp.asarray(states)]


def _hand_batch():
    #            s  a  r    s' terminated
    rows = [
        (0, 1, 1.0, 1, False),  # double: argmax Qo(1)=0 -> Qt(1,0)=5; max Qt(1)=7
        (2, 0, 0.5, 2, True),  # terminal: target = r
        (1, 0, 0.0, 0, False),  # both: Qt(0,1)=20
        (2, 1, 3.0, 2, False),
    ]  # both: Qt(2,1)=2; |td| < delta (quadratic part)
    s, a, r, s2, term = map(np.array, zip(*rows))
    return Transition(
        _onehot(s),
        jnp.asarray(a, jnp.int32),
        jnp.asarray(r, jnp.float32),
        _onehot(s2),
        jnp.asarray(term),
        jnp.zeros((4,), jnp.int32),
    )


def _huber(x, d=DELTA):
    x = abs(x)
    return 0.5 * x * x if x <= d else 0.5 * d * d + d * (x - d)


# Q(s, a):        2,   0.5,  3,   4
# double target:  1 + .9*5 = 5.5,  0.5,  .9*20 = 18,  3 + .9*2 = 4.8
# plain target:   1 + .9*7 = 7.3,  0.5,  18,  4.8
DOUBLE_TD = np.array([2 - 5.5, 0.0, 3 - 18.0, 4 - 4.8])
PLAIN_TD = np.array([2 - 7.3, 0.0, 3 - 18.0, 4 - 4.8])
DOUBLE_HUBER = np.array([3.0, 0.0, 14.5, 0.32])  # by hand from DOUBLE_TD
PLAIN_HUBER = np.array([4.8, 0.0, 14.5, 0.32])


@pytest.mark.parametrize("jit", JIT)
@pytest.mark.parametrize("double_q", [True, False])
def test_each_transitions_hand_values_through_the_loss(jit, double_q):
    """Each transition alone through the real loss: its loss is the hand-computed Huber
    value, its target and |td| the ones worked out above (the sign of td too, from
    q_mean - target_mean), and the hand Huber values agree with Huber's closed form."""
    loss_fn = _maybe_jit(
        dqn.make_loss(table_apply, gamma=GAMMA, double_q=double_q, huber_delta=DELTA), jit
    )
    params, target = {"q": jnp.asarray(Q_ONLINE)}, {"q": jnp.asarray(Q_TARGET)}
    batch = _hand_batch()
    huber = DOUBLE_HUBER if double_q else PLAIN_HUBER
    td = DOUBLE_TD if double_q else PLAIN_TD
    np.testing.assert_allclose([_huber(x) for x in td], huber, rtol=1e-6)
    q_sa = [2.0, 0.5, 3.0, 4.0]
    for i in range(4):
        one = jax.tree.map(lambda x: x[i : i + 1], batch)
        loss, m = loss_fn(params, target, one, jnp.ones(1))
        np.testing.assert_allclose(loss, huber[i], rtol=1e-6, atol=1e-7, err_msg=f"transition {i}")
        np.testing.assert_allclose(m["q_mean"], q_sa[i], rtol=1e-6)
        np.testing.assert_allclose(m["target_mean"], q_sa[i] - td[i], rtol=1e-6)
        np.testing.assert_allclose(m["q_mean"] - m["target_mean"], td[i], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(m["td_abs"], abs(td[i]), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("jit", JIT)
@pytest.mark.parametrize("double_q", [True, False])
def test_loss_hand_computed(jit, double_q):
    loss_fn = _maybe_jit(
        dqn.make_loss(table_apply, gamma=GAMMA, double_q=double_q, huber_delta=DELTA), jit
    )
    params, target = {"q": jnp.asarray(Q_ONLINE)}, {"q": jnp.asarray(Q_TARGET)}
    batch = _hand_batch()
    huber = DOUBLE_HUBER if double_q else PLAIN_HUBER
    td = DOUBLE_TD if double_q else PLAIN_TD

    loss, m = loss_fn(params, target, batch, jnp.ones(4))
    np.testing.assert_allclose(loss, huber.mean(), rtol=1e-6)  # 4.455 (double), 4.905 (plain)
    np.testing.assert_allclose(m["q_mean"], np.mean([2, 0.5, 3, 4]), rtol=1e-6)
    np.testing.assert_allclose(m["td_abs"], np.abs(td).mean(), rtol=1e-6)
    np.testing.assert_allclose(m["target_mean"], np.mean([2, 0.5, 3, 4] - td), rtol=1e-6)

    w = jnp.array([2.0, 1.0, 0.0, 1.0])
    loss_w, _ = loss_fn(params, target, batch, w)
    np.testing.assert_allclose(loss_w, (huber * np.asarray(w)).mean(), rtol=1e-6)


def test_loss_time_batch_shape_matches_flat():
    """A [T, B] batch (as the distributed learner may pass) gives the flat loss."""
    loss_fn = dqn.make_loss(table_apply, gamma=GAMMA, double_q=True, huber_delta=DELTA)
    params, target = {"q": jnp.asarray(Q_ONLINE)}, {"q": jnp.asarray(Q_TARGET)}
    batch, w = _hand_batch(), jnp.array([2.0, 1.0, 0.5, 1.0])
    tb = jax.tree.map(lambda x: x.reshape((2, 2) + x.shape[1:]), batch)
    flat_loss, _ = loss_fn(params, target, batch, w)
    tb_loss, _ = loss_fn(params, target, tb, w.reshape(2, 2))
    np.testing.assert_allclose(tb_loss, flat_loss, rtol=1e-6)


@pytest.mark.parametrize("jit", JIT)
def test_loss_gradient_only_through_online_q_sa(jit):
    loss_fn = dqn.make_loss(table_apply, gamma=GAMMA, double_q=True, huber_delta=DELTA)
    grad = _maybe_jit(jax.grad(loss_fn, argnums=(0, 1), has_aux=True), jit)
    (g_online, g_target), _ = grad(
        {"q": jnp.asarray(Q_ONLINE)}, {"q": jnp.asarray(Q_TARGET)}, _hand_batch(), jnp.ones(4)
    )
    # d/dQ(s,a) mean huber = clip(td, -delta, delta) / N, only at the taken (s, a); the
    # target (bootstrap and double-Q argmax alike) carries no gradient.
    expected = np.zeros((3, 2), np.float32)
    expected[0, 1] += -1.0 / 4  # td -3.5 clipped
    expected[2, 0] += 0.0  # td 0
    expected[1, 0] += -1.0 / 4  # td -15 clipped
    expected[2, 1] += -0.8 / 4  # td -0.8
    np.testing.assert_allclose(g_online["q"], expected, atol=1e-6)
    np.testing.assert_array_equal(g_target["q"], np.zeros((3, 2)))


# ----------------------------------------------------------------------------- algorithm


def _config(**dqn_kw):
    base = dict(
        lr=1e-2,
        batch_size=8,
        buffer_size=64,
        learning_starts=0,
        updates_per_rollout=1,
        target_update_every=3,
        target_tau=1.0,
        eps_start=1.0,
        eps_end=0.1,
        eps_fraction=0.5,
    )
    base.update(dqn_kw)
    return load_config(
        {
            "algo": "dqn",
            "total_env_steps": 1000,
            "num_envs": 2,
            "rollout_len": 4,
            "network": {"hidden": [8]},
            "dqn": base,
            "staleness": {"schedule": "polynomial", "power": 1.0},
        }
    )


OBS_SHAPE = (4,)
SPEC = ActionSpec(discrete=True, num_actions=3)


def _random_batch(key, n=8, version=0):
    k1, k2, k3, k4, k5 = jax.random.split(key, 5)
    return Transition(
        jax.random.normal(k1, (n,) + OBS_SHAPE),
        jax.random.randint(k2, (n,), 0, 3),
        jax.random.normal(k3, (n,)),
        jax.random.normal(k4, (n,) + OBS_SHAPE),
        jax.random.bernoulli(k5, 0.3, (n,)),
        jnp.full((n,), version, jnp.int32),
    )


def test_registry_builds_dqn():
    algo = make_algorithm(_config(), OBS_SHAPE, SPEC)
    assert algo.name == "dqn" and algo.buffer == "replay"
    state = algo.init(jax.random.key(0))
    assert state.target_params is not None
    jax.tree.map(np.testing.assert_array_equal, state.params, state.target_params)


def test_continuous_actions_rejected():
    spec = ActionSpec(discrete=False, shape=(2,))
    with pytest.raises(ConfigError, match="'algo'"):
        dqn.make(_config(), OBS_SHAPE, spec)
    with pytest.raises(ValueError, match="discrete"):
        make_algorithm(_config(), OBS_SHAPE, spec)


@pytest.mark.parametrize("jit", JIT)
def test_act_value_greedy_shapes(jit):
    algo = dqn.make(_config(), OBS_SHAPE, SPEC)
    params = algo.init(jax.random.key(0)).params
    obs = jax.random.normal(jax.random.key(1), (5,) + OBS_SHAPE)
    out = _maybe_jit(algo.act, jit)(params, obs, jax.random.key(2), 0)
    assert out.action.shape == (5,) and out.action.dtype == jnp.int32
    assert out.log_prob.shape == (5,) and out.value.shape == (5,)
    np.testing.assert_array_equal(out.value, 0.0)
    np.testing.assert_array_equal(_maybe_jit(algo.value, jit)(params, obs), np.zeros(5))
    q = algo.network.apply(params, obs)
    np.testing.assert_array_equal(_maybe_jit(algo.greedy, jit)(params, obs), np.argmax(q, -1))


@pytest.mark.parametrize("jit", JIT)
def test_epsilon_schedule_values(jit):
    # total_env_steps 1000, eps_fraction 0.5: 1.0 -> 0.1 linearly over 500 env steps.
    cfg = _config().dqn
    eps = _maybe_jit(dqn.epsilon_schedule(cfg.eps_start, cfg.eps_end, cfg.eps_fraction * 1000), jit)
    np.testing.assert_allclose(eps(0), 1.0, rtol=1e-6)
    np.testing.assert_allclose(eps(100), 0.82, rtol=1e-6)
    np.testing.assert_allclose(eps(250), 0.55, rtol=1e-6)
    np.testing.assert_allclose(eps(500), 0.1, rtol=1e-6)
    np.testing.assert_allclose(eps(1000), 0.1, rtol=1e-6)
    np.testing.assert_allclose(eps(jnp.iinfo(jnp.int32).max), 0.1, rtol=1e-6)  # no overflow


@pytest.mark.parametrize("jit", JIT)
def test_act_follows_epsilon(jit):
    """At step 0 (eps 1) actions are uniform; at the end (eps_end 0) they are greedy;
    in the middle (eps 0.5) a fraction 0.5 * (1 - 1/A) differs from greedy."""
    algo = dqn.make(_config(eps_end=0.0), OBS_SHAPE, SPEC)
    params = algo.init(jax.random.key(0)).params
    obs = jax.random.normal(jax.random.key(1), (4000,) + OBS_SHAPE)
    act = _maybe_jit(algo.act, jit)
    greedy = np.asarray(algo.greedy(params, obs))

    end = act(params, obs, jax.random.key(2), 500)
    np.testing.assert_array_equal(end.action, greedy)
    np.testing.assert_allclose(end.log_prob, 0.0, atol=1e-6)  # log mu = log 1

    start = np.asarray(act(params, obs, jax.random.key(3), 0).action)
    counts = np.bincount(start, minlength=3) / len(start)
    np.testing.assert_allclose(counts, 1 / 3, atol=0.04)
    out = act(params, obs, jax.random.key(3), 0)
    np.testing.assert_allclose(out.log_prob, np.log(1 / 3), rtol=1e-5)

    mid = np.asarray(act(params, obs, jax.random.key(4), 250).action)  # eps 0.5
    np.testing.assert_allclose(np.mean(mid != greedy), 0.5 * 2 / 3, atol=0.04)


def _tree_equal(a, b):
    return all(bool(jnp.array_equal(x, y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.mark.parametrize("jit", JIT)
def test_fresh_samples_corrected_update_equals_plain(jit):
    """With every tau = 0 the staleness weights are exactly 1, so the corrected update
    equals the plain one, bit for bit (a non-constant schedule, so it is not trivial)."""
    config = _config()
    corrected = dqn.make(config, OBS_SHAPE, SPEC, correct_staleness=True)
    plain = dqn.make(config, OBS_SHAPE, SPEC, correct_staleness=False)
    state = corrected.init(jax.random.key(0))
    state = state._replace(version=jnp.asarray(5, jnp.int32))
    batch = _random_batch(jax.random.key(1), version=5)

    loss_w = corrected.loss_fn(state.params, state.target_params, batch, jnp.ones(8))
    s_c, m_c = _maybe_jit(corrected.update, jit)(state, batch)
    s_p, m_p = _maybe_jit(plain.update, jit)(state, batch)
    assert _tree_equal(s_c.params, s_p.params)
    assert _tree_equal(s_c.opt_state, s_p.opt_state)
    np.testing.assert_array_equal(m_c["loss"], m_p["loss"])
    np.testing.assert_allclose(m_c["loss"], loss_w[0], rtol=1e-6)
    np.testing.assert_array_equal(m_c["weight_min"], 1.0)
    np.testing.assert_array_equal(m_c["weight_max"], 1.0)
    assert int(s_c.version) == 6 and float(m_c["update_skipped"]) == 0.0

    # mixed staleness: the polynomial schedule now reweights, so the updates differ
    stale = batch._replace(version=jnp.array([5, 5, 5, 5, 0, 0, 1, 2], jnp.int32))
    s_c, m_c = corrected.update(state, stale)
    s_p, _ = plain.update(state, stale)
    assert not _tree_equal(s_c.params, s_p.params)
    assert float(m_c["weight_min"]) < 1.0 < float(m_c["weight_max"])


@pytest.mark.parametrize("jit", JIT)
def test_target_sync_every_k_updates(jit):
    k = 3
    algo = dqn.make(_config(target_update_every=k), OBS_SHAPE, SPEC)
    update = _maybe_jit(algo.update, jit)
    state = algo.init(jax.random.key(0))
    synced = state.params
    for i in range(1, 3 * k + 2):
        state, m = update(state, _random_batch(jax.random.key(i), version=i - 1))
        assert int(state.version) == i
        assert not _tree_equal(state.params, synced)  # params move every update
        if i % k == 0:
            synced = state.params
            assert float(m["target_synced"]) == 1.0
        else:
            assert float(m["target_synced"]) == 0.0
        # the target is exactly the online params of the last multiple of k (initial before)
        assert _tree_equal(state.target_params, synced), f"update {i}"


@pytest.mark.parametrize("jit", JIT)
def test_polyak_target_update(jit):
    algo = dqn.make(_config(target_update_every=2, target_tau=0.25), OBS_SHAPE, SPEC)
    update = _maybe_jit(algo.update, jit)
    s0 = algo.init(jax.random.key(0))
    s1, _ = update(s0, _random_batch(jax.random.key(1)))
    jax.tree.map(np.testing.assert_array_equal, s1.target_params, s0.params)  # no sync yet
    s2, _ = update(s1, _random_batch(jax.random.key(2)))
    expected = jax.tree.map(lambda p, t: 0.25 * p + 0.75 * t, s2.params, s0.params)
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
        s2.target_params,
        expected,
    )


def test_update_learns_fixed_batch():
    """Repeated steps on one batch drive its TD error down (targets fixed between syncs)."""
    algo = dqn.make(_config(target_update_every=10_000, lr=1e-2), OBS_SHAPE, SPEC)
    update = jax.jit(algo.update)
    state = algo.init(jax.random.key(0))
    batch = _random_batch(jax.random.key(1), n=16)
    _, first = update(state, batch)
    for _ in range(200):
        state, m = update(state, batch)
    assert float(m["td_abs"]) < 0.2 * float(first["td_abs"])


def test_guarded_skips_non_finite():
    algo = dqn.make(_config(), OBS_SHAPE, SPEC)
    state = algo.init(jax.random.key(0))
    batch = _random_batch(jax.random.key(1))
    bad = batch._replace(reward=batch.reward.at[0].set(jnp.nan))
    new, m = jax.jit(algo.update)(state, bad)
    assert float(m["update_skipped"]) == 1.0 and int(new.skipped_updates) == 1
    assert int(new.version) == 0
    assert _tree_equal(new.params, state.params) and _tree_equal(
        new.target_params, state.target_params
    )


def test_fused_replay_smoke():
    """A few fused iterations: replay fills, updates start at learning_starts."""
    from tianjax.core.fused_loop import make_fused
    from tianjax.envs.gymnax_env import make_gymnax

    config = load_config(
        {
            "algo": "dqn",
            "total_env_steps": 1000,
            "num_envs": 2,
            "rollout_len": 4,
            "network": {"hidden": [16]},
            "dqn": {
                "batch_size": 8,
                "buffer_size": 20,
                "learning_starts": 16,
                "updates_per_rollout": 2,
                "target_update_every": 2,
            },
        }
    )
    env = make_gymnax("CartPole-v1")
    algo = make_algorithm(config, env.obs_shape, env.action_spec, correct_staleness=False)
    init, run = make_fused(config, env, algo)
    state = jax.jit(init)(jax.random.key(0))
    state, (metrics, episodes) = jax.jit(run, static_argnums=1)(state, 4)
    # 8 transitions per iteration: learning starts at iteration 2 (16 env steps), 2 updates each
    assert int(state.env_steps) == 32
    assert int(state.replay.size) == 20 and int(state.replay.insert_pos) == 12
    assert int(state.learner.version) == 3 * 2
    np.testing.assert_array_equal(np.asarray(metrics["loss"])[0], 0.0)  # skipped iteration
    assert np.all(np.isfinite(np.asarray(metrics["loss"])))
    assert episodes.done.shape == (4, 4, 2)
