"""Schedules follow progress (fresh env steps learned / budget), never update counts, and
importing the package starts no JAX backend."""

import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tianjax.algos import make_algorithm
from tianjax.config import load_config
from tianjax.core.rollout import make_rollout
from tianjax.core.update import learning_rate, lr_schedule, step_progress
from tianjax.envs.gymnax_env import make_gymnax


def test_lr_schedule_known_values():
    lr = lr_schedule(1e-3, True, 1000)
    np.testing.assert_allclose(
        lr(jnp.array([0, 250, 1000, 5000])), [1e-3, 7.5e-4, 0.0, 0.0], rtol=1e-6
    )
    flat = lr_schedule(1e-3, False, 1000)
    np.testing.assert_allclose(flat(jnp.array([0.0, 999.0])), [1e-3, 1e-3])


def test_step_progress_spreads_a_fresh_batch_over_its_gradient_steps_and_holds_on_reuse():
    np.testing.assert_allclose(step_progress(jnp.int32(100), True, 40, 4), [100, 110, 120, 130])
    np.testing.assert_allclose(step_progress(jnp.int32(100), False, 40, 4), [100, 100, 100, 100])


def _ppo(overrides):
    cfg = load_config("configs/ppo_cartpole.yaml", overrides)
    env = make_gymnax(cfg.env)
    algo = make_algorithm(cfg, env.obs_shape, env.action_spec, correct_staleness=False)
    init, rollout = make_rollout(env, algo, cfg.num_envs, cfg.rollout_len)
    state = algo.init(jax.random.key(0))
    _, traj, _ = jax.jit(rollout)(state.params, state.version, init(jax.random.key(1)))
    return cfg, algo, state, traj


def test_without_reuse_the_learning_rate_is_the_linear_schedule_over_gradient_steps():
    # 3 updates of 2 epochs x 2 minibatches: optax's linear schedule over the 12 gradient steps
    cfg, algo, state, traj = _ppo(
        [
            "num_envs=2",
            "rollout_len=8",
            "total_env_steps=48",
            "ppo.num_epochs=2",
            "ppo.num_minibatches=2",
        ]
    )
    reference = optax.linear_schedule(cfg.ppo.lr, 0.0, 12)
    update = jax.jit(algo.update)
    for u in range(3):
        state, m = update(state, traj)
        # the learning rate stored is the one the update's last gradient step used
        assert float(learning_rate(state.opt_state)) == pytest.approx(
            float(reference(4 * u + 3)), rel=1e-5
        )
        assert int(state.fresh_steps) == 16 * (u + 1)
    assert float(learning_rate(state.opt_state)) == pytest.approx(cfg.ppo.lr / 12, rel=1e-5)


def test_a_reuse_pass_takes_gradient_steps_without_using_up_the_schedule():
    cfg, algo, state, traj = _ppo(
        [
            "num_envs=2",
            "rollout_len=8",
            "total_env_steps=48",
            "ppo.num_epochs=1",
            "ppo.num_minibatches=1",
        ]
    )
    update = jax.jit(algo.update)
    state, _ = update(state, traj)  # fresh: progress 0 -> 1/3
    lr_fresh = float(learning_rate(state.opt_state))
    before = jax.tree.leaves(state.params)[0].copy()
    for _ in range(4):  # reuse passes: the parameters move, the schedule stays
        state, _ = update(state, traj, jnp.bool_(False))
    assert int(state.fresh_steps) == 16 and int(state.version) == 5
    assert float(learning_rate(state.opt_state)) == pytest.approx(
        cfg.ppo.lr * (1 - 16 / 48), rel=1e-5
    )
    assert lr_fresh == pytest.approx(cfg.ppo.lr, rel=1e-6)  # one gradient step, taken at progress 0
    assert not np.array_equal(before, jax.tree.leaves(state.params)[0])


def test_a_state_resumed_under_a_larger_budget_goes_on_from_its_fresh_steps():
    # 3 updates of 16 env steps spend a 48-step budget; resumed with 96, the same state's next
    # update runs from progress 48 / 96, and a reuse pass after it holds at 64 / 96
    opts = ["num_envs=2", "rollout_len=8", "ppo.num_epochs=2", "ppo.num_minibatches=2"]
    cfg, algo, state, traj = _ppo([*opts, "total_env_steps=48"])
    update = jax.jit(algo.update)
    for _ in range(3):
        state, _ = update(state, traj)
    assert int(state.fresh_steps) == 48 and float(learning_rate(state.opt_state)) == pytest.approx(
        cfg.ppo.lr / 12, rel=1e-5
    )
    cfg96 = load_config("configs/ppo_cartpole.yaml", [*opts, "total_env_steps=96"])
    env = make_gymnax(cfg96.env)
    resumed = make_algorithm(cfg96, env.obs_shape, env.action_spec, correct_staleness=False)
    update = jax.jit(resumed.update)
    state, _ = update(state, traj)  # gradient steps at 48, 52, 56, 60 of 96
    assert int(state.fresh_steps) == 64 and int(state.version) == 4
    assert float(learning_rate(state.opt_state)) == pytest.approx(
        cfg.ppo.lr * (1 - 60 / 96), rel=1e-5
    )
    state, _ = update(state, traj, jnp.bool_(False))
    assert int(state.fresh_steps) == 64
    assert float(learning_rate(state.opt_state)) == pytest.approx(
        cfg.ppo.lr * (1 - 64 / 96), rel=1e-5
    )


def test_importing_every_module_starts_no_jax_backend():
    # a multi-host script imports tianjax's modules and only then calls
    # jax.distributed.initialize(), which fails once a backend exists
    code = textwrap.dedent("""
        import importlib, pkgutil, sys
        import tianjax
        from jax._src import xla_bridge
        names = [m.name for m in pkgutil.walk_packages(tianjax.__path__, "tianjax.")]
        for name in names:
            importlib.import_module(name)
            if xla_bridge.backends_are_initialized():
                print("BACKEND", name); sys.exit(1)
        print("OK", len(names))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.startswith("OK"), out.stdout + out.stderr
    assert int(out.stdout.split()[1]) >= 30  # it did walk the package
