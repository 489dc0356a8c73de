"""make_train: hyperparameters as inputs, so that a vmap over them is the separate runs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tianjax
from tianjax.algos import make_algorithm
from tianjax.config import ConfigError, load_config
from tianjax.core.fused_loop import make_fused
from tianjax.envs.gymnax_env import make_gymnax
from tianjax.runtime.runners.train_fn import (
    WINDOW,
    FusedRun,
    _window_push,
    check,
    final_return,
    make_train,
)

SMALL = ["total_env_steps=2048", "num_envs=2", "rollout_len=64"]  # 16 updates


def _leaves_close(a, b, index=None):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        y = np.asarray(y) if index is None else np.asarray(y)[index]
        # float32 reassociation under vmap, grown over 64 gradient steps: ~1e-6 absolute
        np.testing.assert_allclose(np.asarray(x), y, rtol=1e-4, atol=1e-5)


def test_vmap_over_learning_rates_is_the_separate_runs():
    cfg = load_config("configs/ppo_cartpole.yaml", SMALL)
    init, train_fn = tianjax.make_train(cfg)
    state = init(jax.random.key(3))
    # (at lr 1e-2 Adam grows vmap's float32 reassociation to ~1e-4 in 64 steps: same
    # trajectories, but not allclose at 1e-5)
    lrs = [1e-3, 3e-3]
    one = jax.jit(train_fn)
    separate = [one(state, {"ppo.lr": lr}) for lr in lrs]
    swept = jax.jit(jax.vmap(train_fn, in_axes=(None, 0)))(state, {"ppo.lr": jnp.array(lrs)})
    for i, run in enumerate(separate):
        _leaves_close(run.state.learner.params, swept.state.learner.params, index=i)
        np.testing.assert_allclose(
            run.metrics["loss"], swept.metrics["loss"][i], rtol=1e-4, atol=1e-6
        )
    # the rates really differ: three times the step moves the parameters elsewhere
    a, b = (np.asarray(jax.tree.leaves(r.state.learner.params)[1]) for r in separate)
    assert not np.allclose(a, b, atol=1e-4)
    # the schedule anneals each point's own rate: first gradient step at lr_0 (progress 0)
    assert swept.metrics["lr"].shape == (2, 16)
    np.testing.assert_allclose(final_return(swept), [final_return(r) for r in separate], rtol=1e-5)


def test_a_missing_key_takes_the_config_value_as_the_closed_over_run():
    cfg = load_config("configs/ppo_cartpole.yaml", SMALL + ["ppo.lr=3e-3", "ppo.ent_coef=0.0"])
    init, train_fn = make_train(cfg)
    run = jax.jit(train_fn)(init(jax.random.key(0)), {})
    env = make_gymnax(cfg.env)
    algo = make_algorithm(cfg, env.obs_shape, env.action_spec, correct_staleness=False)
    init_f, run_f = make_fused(cfg, env, algo)
    state, (metrics, episodes) = jax.jit(run_f, static_argnums=1)(init_f(jax.random.key(0)), 16)
    _leaves_close(run.state.learner.params, state.learner.params)
    assert int(run.state.env_steps) == 2048 and run.metrics["loss"].shape == (16,)
    # the episode metrics are the rollouts' own
    done, rets = np.asarray(episodes.done), np.asarray(episodes.returns)
    np.testing.assert_array_equal(run.metrics["episodes"], done.sum(axis=(1, 2)))
    np.testing.assert_allclose(
        run.metrics["episode_return_sum"], np.where(done, rets, 0).sum(axis=(1, 2))
    )


def test_bad_keys_and_values_name_the_key():
    cfg = load_config("configs/ppo_cartpole.yaml", SMALL)
    _, train_fn = make_train(cfg)
    with pytest.raises(ConfigError, match="'ppo.lrr': unknown key"):
        check(cfg, {"ppo.lrr": 1e-3})
    with pytest.raises(ConfigError, match="'ppo.num_epochs': is not a numeric input"):
        check(cfg, {"ppo.num_epochs": 2})
    with pytest.raises(ConfigError, match="'staleness.power': has no effect in fused mode"):
        check(cfg, {"staleness.power": 1.0})
    # concrete values go through the config's own checks, one entry of an array at a time
    with pytest.raises(ConfigError, match="ppo.lr"):
        check(cfg, {"ppo.lr": np.array([1e-3, -1e-3])})
    with pytest.raises(ConfigError, match="ppo.gamma"):
        train_fn(None, {"ppo.gamma": 1.5})  # unjitted: checked before anything is traced
    check(cfg, {"ppo.lr": np.array([1e-3, 1e-2]), "ppo.ent_coef": 0.0})
    with pytest.raises(ConfigError, match="mode"):
        make_train(load_config("configs/ppo_cartpole_async.yaml"))


def test_window_keeps_the_last_100_finished_returns_in_order():
    window = jnp.full((WINDOW,), jnp.nan)
    # a [T=3, B=2] rollout with episodes ending at (0, 1) and (2, 0): returns 5 and 7
    done = jnp.array([[False, True], [False, False], [True, False]])
    rets = jnp.array([[1.0, 5.0], [2.0, 3.0], [7.0, 4.0]])
    window, count = _window_push(window, jnp.int32(0), done, rets)
    assert int(count) == 2 and window[0] == 5.0 and window[1] == 7.0 and np.isnan(window[2])
    # 150 episodes in one rollout: the last 100 are kept (returns 50..149), ring-wrapped
    many = jnp.ones((150, 1), bool)
    window, count = _window_push(window, count, many, jnp.arange(150.0)[:, None])
    assert int(count) == 152
    assert sorted(np.asarray(window).tolist()) == list(map(float, range(50, 150)))
    run = FusedRun(None, {}, window)
    assert final_return(run) == pytest.approx(np.mean(np.arange(50, 150)))
