"""env_backend: brax (tianjax/envs/brax_env.py): the protocol, the time limit and auto-reset
rule and the config (its learning run is in tests/learning/). Skipped without brax
(the optional extra), except the check of the message that says how to install it."""

import subprocess
import sys
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tianjax.algos import make_algorithm
from tianjax.config import ConfigError, load_config
from tianjax.core.rollout import make_rollout
from tianjax.envs.factory import make_jax_env

CONFIG = "configs/ppo_brax_inverted_pendulum.yaml"
LIMIT = 10  # steps: a pole left alone stays up this long, full force topples it in 7


class Jitted(NamedTuple):
    env: object
    reset: object  # keys [B] -> (obs, state), jitted
    step: object  # (keys [B], state, action [B, 1]) -> JaxStep, jitted
    raw_step: object  # brax's own step (no time limit, no reset), jitted


@pytest.fixture(scope="module")
def jitted():
    pytest.importorskip("brax")
    env = make_jax_env("brax", "inverted_pendulum", {"backend": "spring", "episode_length": LIMIT})
    return Jitted(
        env,
        jax.jit(jax.vmap(env.reset)),
        jax.jit(jax.vmap(env.step)),
        jax.jit(jax.vmap(env.env.step)),
    )


def keys(seed, n=2):
    return jax.random.split(jax.random.key(seed), n)


def test_spaces_and_shapes(jitted):
    env = jitted.env
    assert env.obs_shape == (4,) and env.obs_dtype == np.float32
    spec = env.action_spec
    assert not spec.discrete and spec.shape == (1,)
    np.testing.assert_array_equal(spec.low, [-1.0])
    np.testing.assert_array_equal(spec.high, [1.0])
    obs, state = jitted.reset(keys(0))
    assert obs.shape == (2, 4) and obs.dtype == jnp.float32
    out = jitted.step(keys(1), state, jnp.zeros((2, 1)))
    assert out.obs.shape == out.final_obs.shape == (2, 4)
    assert out.reward.shape == out.terminated.shape == out.truncated.shape == (2,)
    assert out.reward.dtype == jnp.float32 and out.terminated.dtype == jnp.bool_
    np.testing.assert_array_equal(out.reward, [1.0, 1.0])
    # the dtypes of the state stay the same across a step (a lax.scan carry needs that)
    assert jax.tree.map(lambda x: x.dtype, out.state) == jax.tree.map(lambda x: x.dtype, state)


def test_time_limit_truncates_termination_does_not_and_both_reset_in_the_same_step(jitted):
    """Env 0 is left alone and reaches the time limit; env 1 is pushed until the pole falls."""
    action = jnp.array([[0.0], [1.0]])
    _, state = jitted.reset(keys(0))
    raw = state.env_state  # the same episodes stepped by brax itself, without our wrapper
    ended_at = [None, None]
    for t in range(1, LIMIT + 1):
        k = keys(100 + t)
        out = jitted.step(k, state, action)
        raw = jitted.raw_step(raw, action)
        fresh_obs, _ = jitted.reset(k)
        for i in range(2):
            if ended_at[i] is not None:
                continue
            if bool(out.terminated[i] | out.truncated[i]):
                ended_at[i] = t
                # final_obs: where the episode ended (the bootstrap point); obs: the first
                # of a new episode, drawn with the step's key
                np.testing.assert_allclose(out.final_obs[i], raw.obs[i], rtol=1e-5, atol=1e-7)
                np.testing.assert_allclose(out.obs[i], fresh_obs[i], rtol=1e-6)
                assert int(out.state.step[i]) == 0
            else:
                np.testing.assert_allclose(out.obs[i], raw.obs[i], rtol=1e-5, atol=1e-7)
                np.testing.assert_array_equal(out.obs[i], out.final_obs[i])
                assert int(out.state.step[i]) == t
            if t == ended_at[i] == LIMIT:
                assert bool(out.truncated[i]) and not bool(out.terminated[i])
        if t == ended_at[1]:  # the fall
            assert bool(out.terminated[1]) and not bool(out.truncated[1])
            assert abs(float(out.final_obs[1, 1])) > 0.2  # the pole's angle past the limit
            assert np.all(np.abs(np.asarray(out.obs[1])) <= 0.01)  # a fresh episode's start
        state = out.state
    assert ended_at == [LIMIT, 7]


def test_rollout_bootstraps_truncation_from_the_final_obs():
    pytest.importorskip("brax")
    cfg = load_config(
        CONFIG,
        ["num_envs=2", "rollout_len=8", "total_env_steps=16", "env_options.episode_length=5"],
    )  # 5 steps: too short to fall
    env = make_jax_env(cfg.env_backend, cfg.env, cfg.env_options)
    algo = make_algorithm(cfg, env.obs_shape, env.action_spec, correct_staleness=False)
    params = algo.init(jax.random.key(0)).params
    init, rollout = make_rollout(env, algo, 2, 8)
    _, batch, episodes = jax.jit(rollout)(params, 0, init(jax.random.key(1)), 0)
    done = np.asarray(batch.done)
    assert done[4].all() and done.sum() == 2  # each env's 5-step episode ends at t = 4
    np.testing.assert_array_equal(np.asarray(episodes.lengths)[4], [5, 5])
    np.testing.assert_allclose(np.asarray(episodes.returns)[4], [5.0, 5.0])
    assert np.asarray(batch.trunc_t).tolist() == [4, 4]
    value_final = algo.value(params, batch.trunc_obs)
    boot = np.asarray(batch.bootstrap_value)
    np.testing.assert_allclose(boot[4], value_final, rtol=1e-5)
    assert np.all(boot[np.arange(8) != 4] == 0)
    # the bootstrap is not taken from the next episode's first observation
    assert not np.allclose(batch.trunc_obs, batch.obs[5])
    assert not np.allclose(boot[4], algo.value(params, batch.obs[5]))


def test_config_and_bad_input_are_one_line_naming_the_key():
    pytest.importorskip("brax")
    cfg = load_config(CONFIG)
    assert (cfg.env_backend, cfg.mode, cfg.env_options["backend"]) == ("brax", "fused", "spring")
    for options, key in [
        ({"env": "no_such_env"}, "'env'"),
        ({"env_options": {"backend": "bogus"}}, "'env_options'"),
        ({"env_options": {"episode_length": 0}}, "'env_options.episode_length'"),
    ]:
        cfg = load_config(CONFIG, **options)
        with pytest.raises(ConfigError, match=key) as e:
            make_jax_env(cfg.env_backend, cfg.env, cfg.env_options)
        assert "\n" not in str(e.value)


def test_missing_brax_says_how_to_install_it(tmp_path):
    """Run without brax importable (even where it is installed): one line, exit 2."""
    code = (
        "import sys; sys.modules['brax'] = None; sys.modules['brax.envs'] = None; "
        "from tianjax.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, "train", CONFIG, f"run_dir={tmp_path / 'run'}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "config key 'env_backend'" in lines[0] and 'pip install -e ".[brax]"' in lines[0]


def test_module_colon_env_id_imports_the_module_that_registers_it(tmp_path, monkeypatch):
    pytest.importorskip("brax")
    (tmp_path / "my_brax_envs.py").write_text(
        "from brax import envs\n"
        "from brax.envs.inverted_pendulum import InvertedPendulum\n"
        "envs.register_environment('my_pendulum', InvertedPendulum)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    env = make_jax_env("brax", "my_brax_envs:my_pendulum", {"backend": "spring"})
    assert env.name == "my_brax_envs:my_pendulum" and env.obs_shape == (4,)
