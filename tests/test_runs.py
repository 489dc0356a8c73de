"""tianjax.load(run_dir) and tianjax.evaluate(run dir | LoadedRun | TrainResult)."""

import jax
import numpy as np
import pytest

import tianjax
from tianjax.config import ConfigError


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("runs") / "cartpole"
    return tianjax.train(
        "configs/ppo_cartpole.yaml",
        ["total_env_steps=4096", "log_every=1", "eval.episodes=3"],
        run_dir=str(run_dir),
        verbose=False,
        progress=False,
    )


def test_load_gives_config_params_and_the_greedy_policy(trained):
    run = tianjax.load(trained.run_dir)
    assert (
        run.config == trained.config
        and run.obs_shape == (4,)
        and run.step == trained.summary["updates"]
    )
    jax.tree.map(np.testing.assert_array_equal, run.params, trained.params)
    obs = jax.random.normal(jax.random.key(0), (16, 4))
    np.testing.assert_array_equal(run.policy(obs), run.algo.greedy(trained.params, obs))
    # one checkpoint directory loads too
    step_dir = f"{trained.run_dir}/checkpoints/{run.step}"
    assert tianjax.load(step_dir).step == run.step


def test_evaluate_agrees_across_its_inputs_and_with_train(trained):
    """Run dir, LoadedRun and TrainResult hold the same params and use train's key by default:
    the same returns, and the summary's eval_return (3 episodes there too)."""
    by_result = tianjax.evaluate(trained, episodes=3)
    by_dir = tianjax.evaluate(trained.run_dir, episodes=3)
    by_loaded = tianjax.evaluate(tianjax.load(trained.run_dir), episodes=3)
    assert by_result.returns.shape == (3,)
    np.testing.assert_array_equal(by_result.returns, by_dir.returns)
    np.testing.assert_array_equal(by_result.returns, by_loaded.returns)
    assert by_result.returns.mean() == pytest.approx(trained.summary["eval_return"])
    other = tianjax.evaluate(trained, episodes=3, seed=12345)
    assert other.returns.shape == (3,)
    with pytest.raises(ConfigError, match="episodes must be >= 1"):
        tianjax.evaluate(trained, episodes=0)
    with pytest.raises(ConfigError, match="does not exist"):
        tianjax.load(f"{trained.run_dir}/nope")


def test_a_run_of_several_seeds_evaluates_each_and_says_so(tmp_path):
    run = tianjax.train(
        "configs/ppo_cartpole.yaml",
        [
            "total_env_steps=2048",
            "num_seeds=2",
            "num_envs=4",
            "rollout_len=64",
            "compile_cache=null",
        ],
        run_dir=str(tmp_path / "run"),
        verbose=False,
        progress=False,
    )
    out = tianjax.evaluate(run.run_dir, episodes=3)
    assert out.seeds == 2 and out.returns.shape == (6,)  # 3 episodes of each seed's policy
    assert out.line().startswith(
        f"eval 3 episodes x 2 seeds (checkpoint step {run.summary['updates']}): mean "
    )
