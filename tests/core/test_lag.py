"""The forced lag: a ring of parameter versions, and the fused loop acting K versions behind."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tianjax.algos import make_algorithm
from tianjax.config import ConfigError, load_config
from tianjax.core import distributions as D
from tianjax.core import lag
from tianjax.core.fused_loop import corrects_staleness, make_fused
from tianjax.envs.gymnax_env import make_gymnax


def test_ring_returns_the_version_k_behind_and_version_zero_before_that():
    ring = lag.init({"w": jnp.zeros(2)}, capacity=4, lag=3)
    seen = []
    for v in range(1, 9):  # learner versions 1..8, each pushed as it is made
        ring = lag.push(ring, {"w": jnp.full(2, float(v))}, v)
        params, v_b = lag.behaviour(ring, v)
        seen.append((int(v_b), float(params["w"][0])))
    # v_b = max(v - 3, 0), and the params are that version's (version v holds the value v)
    assert seen == [(0, 0.0), (0, 0.0), (0, 0.0), (1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0), (5, 5.0)]


def test_ring_serves_several_lags_side_by_side_under_vmap():
    def history(k):
        ring = lag.init({"w": jnp.zeros(())}, capacity=5, lag=k)
        for v in range(1, 7):
            ring = lag.push(ring, {"w": jnp.asarray(float(v))}, v)
        return lag.behaviour(ring, 6)

    params, v_b = jax.jit(jax.vmap(history))(jnp.array([0, 1, 4]))
    np.testing.assert_array_equal(v_b, [6, 5, 2])
    np.testing.assert_array_equal(params["w"], [6.0, 5.0, 2.0])


def _recording(algo):
    """The real algorithm whose update also returns, per iteration, the learner's version,
    the batch's behaviour versions, what was acted on, and the parameters it made."""

    def update(state, traj, fresh=True):
        new, metrics = algo.update(state, traj, fresh)
        return new, dict(
            metrics,
            learner_version=state.version,
            behaviour_version=traj.version,
            obs=traj.obs,
            action=traj.action,
            behaviour_log_prob=traj.behaviour_log_prob,
            new_params=new.params,
        )

    return algo._replace(update=update)


@pytest.mark.parametrize("correct", [True, False])
def test_forced_lag_4_every_behaviour_version_is_learner_version_minus_4(correct):
    cfg = load_config(
        "configs/ppo_cartpole.yaml",
        [
            "num_envs=2",
            "rollout_len=8",
            "ppo.num_minibatches=2",
            "total_env_steps=160",
            "staleness.forced_lag=4",
            f"staleness.correct={str(correct).lower()}",
        ],
    )
    env = make_gymnax(cfg.env)
    assert corrects_staleness(cfg) == correct
    algo = make_algorithm(cfg, env.obs_shape, env.action_spec, correct_staleness=correct)
    init, run = make_fused(cfg, env, _recording(algo))
    state = jax.jit(init)(jax.random.key(0))
    history = [state.learner.params]
    state, (m, _) = jax.jit(run, static_argnums=1)(state, 10)
    V = np.asarray(m["learner_version"])
    np.testing.assert_array_equal(V, np.arange(10))
    v_b = np.asarray(m["behaviour_version"])  # [10, T, B]
    # every sample of the update at version V was acted with version V - 4 (version 0 for
    # the first 4 updates, which have no older version: tau = V there)
    np.testing.assert_array_equal(v_b, np.maximum(V - 4, 0)[:, None, None] * np.ones((1, 8, 2)))
    np.testing.assert_array_equal(m["tau_min"], np.minimum(V, 4))
    np.testing.assert_array_equal(m["tau_max"], np.minimum(V, 4))
    # and with those versions' parameters: the stored log mu is the log-prob under the
    # parameters the learner had at that version
    history += [jax.tree.map(lambda x: x[i], m["new_params"]) for i in range(10)]
    for i in range(10):
        params = history[int(v_b[i, 0, 0])]
        dist, _ = algo.network.apply(params, m["obs"][i])
        np.testing.assert_allclose(
            D.log_prob(dist, m["action"][i]), m["behaviour_log_prob"][i], rtol=1e-5, atol=1e-5
        )
    # the diagnostics of every update: nothing dropped, the weights' ESS a share of the batch
    assert np.all(np.asarray(m["stale_dropped_frac"]) == 0)
    assert np.all((np.asarray(m["weight_ess"]) > 0) & (np.asarray(m["weight_ess"]) <= 1 + 1e-6))


def test_an_actors_ring_acts_with_the_version_k_behind_the_newest_it_holds():
    from tianjax.runtime.actor.actor import lagged_version

    assert lagged_version([0], 4) == 0  # the first versions: the oldest held
    assert lagged_version([0, 1, 2, 3, 4], 4) == 0
    assert lagged_version([1, 2, 3, 4, 5], 4) == 1
    # the channel skipped versions (it keeps only the newest): at least K behind
    assert lagged_version([3, 5, 8, 9, 10], 4) == 5
    assert lagged_version([7, 8], 0) == 8


def test_forced_lag_is_refused_outside_fused_and_async_modes_and_must_be_a_whole_number():
    cfg = load_config("configs/ppo_cartpole_async.yaml", ["staleness.forced_lag=4"])
    assert cfg.staleness.forced_lag == 4
    # a lag beyond max_staleness (8 there) would drop every sample and leave the learner
    # waiting forever (actors 16 behind version 9 acted with version 0 until stopped)
    with pytest.raises(ConfigError, match="staleness.forced_lag .16. or null") as e:
        load_config("configs/ppo_cartpole_async.yaml", ["staleness.forced_lag=16"])
    assert "'staleness.max_staleness'" in str(e.value)
    with pytest.raises(ConfigError, match="staleness.max_staleness"):
        load_config(
            "configs/ppo_cartpole.yaml", ["staleness.forced_lag=4", "staleness.max_staleness=3"]
        )
    for eta in ("null", "16"):
        load_config(
            "configs/ppo_cartpole_async.yaml",
            ["staleness.forced_lag=16", f"staleness.max_staleness={eta}"],
        )
    with pytest.raises(ConfigError, match="staleness.forced_lag"):
        load_config("configs/ppo_cartpole_async.yaml", ["staleness.forced_lag=4", "mode=sync"])
    with pytest.raises(ConfigError, match="staleness.forced_lag"):
        load_config("configs/ppo_cartpole.yaml", ["staleness.forced_lag=-1"])


def test_make_train_takes_the_lag_as_an_input_within_the_ring():
    import tianjax

    cfg = load_config(
        "configs/ppo_cartpole.yaml",
        ["num_envs=2", "rollout_len=8", "ppo.num_minibatches=2", "total_env_steps=96"],
    )
    init, train_fn = tianjax.make_train(cfg)
    with pytest.raises(ConfigError, match="staleness.forced_lag"):  # no ring: no lag input
        train_fn(init(jax.random.key(0)), {"staleness.forced_lag": 2})
    cfg = load_config(
        "configs/ppo_cartpole.yaml",
        [
            "num_envs=2",
            "rollout_len=8",
            "ppo.num_minibatches=2",
            "total_env_steps=96",
            "staleness.forced_lag=3",
        ],
    )
    init, train_fn = tianjax.make_train(cfg)
    state = init(jax.random.key(0))
    with pytest.raises(ConfigError, match=r"\[0, 3\]"):
        train_fn(state, {"staleness.forced_lag": 4})
    out = jax.jit(jax.vmap(train_fn, in_axes=(None, 0)))(
        state, {"staleness.forced_lag": jnp.array([0, 3])}
    )
    # 6 updates: tau = min(V, K) for K = 0 and K = 3
    np.testing.assert_array_equal(out.metrics["tau_mean"][0], np.zeros(6))
    np.testing.assert_array_equal(out.metrics["tau_mean"][1], [0, 1, 2, 3, 3, 3])
