"""Learning tests on continuous control: PPO on gymnax Pendulum and on the brax inverted
pendulum (slow: minutes on 2 CPU cores)."""

import json

import jax
import numpy as np
import pytest

import tianjax
from tests.envs.test_brax_env import CONFIG
from tianjax.algos import make_algorithm
from tianjax.core.evaluation import make_evaluator
from tianjax.envs.factory import make_jax_env
from tianjax.envs.gymnax_env import make_gymnax


@pytest.mark.slow
def test_ppo_continuous_improves_pendulum(tmp_path):
    result = tianjax.train(
        "configs/ppo_pendulum.yaml", run_dir=str(tmp_path / "run"), progress=False, verbose=False
    )
    ret = result.metrics["return_mean_100"]
    first = ret[np.isfinite(ret)][0]  # the first record after an episode has ended
    assert first < -900  # a random policy
    assert result.summary["final_return"] > -400
    # the greedy policy is at least as good
    env = make_gymnax("Pendulum-v1")
    algo = make_algorithm(result.config, env.obs_shape, env.action_spec)
    rets = make_evaluator(env, algo, 16)(result.params, jax.random.key(7))
    assert float(np.mean(rets)) > -400


@pytest.mark.slow
def test_ppo_learns_to_balance_the_brax_pendulum(tmp_path):
    """Half the shipped config's budget (under 2 min on 2 CPU cores, compile included).
    The untrained policy, sampling, balances about 21 steps (measured below: 20.9); the
    trained one (781 at this budget, seed 0) must hold the pole for 600 of the 1000 steps
    on average over its last 100 episodes."""
    pytest.importorskip("brax")
    result = tianjax.train(
        CONFIG,
        ["total_env_steps=524288", "eval.episodes=0"],
        run_dir=str(tmp_path / "run"),
        progress=False,
        verbose=False,
    )
    cfg = result.config
    env = make_jax_env(cfg.env_backend, cfg.env, cfg.env_options)
    algo = make_algorithm(cfg, env.obs_shape, env.action_spec, correct_staleness=False)
    untrained = algo.init(jax.random.key(0)).params
    random_return = float(
        np.mean(make_evaluator(env, algo, 32, greedy=False)(untrained, jax.random.key(3)))
    )
    assert random_return < 100
    final = result.summary["final_return"]
    assert final >= 600 and final >= 10 * random_return, (final, random_return)
    records = [json.loads(x) for x in open(tmp_path / "run" / "metrics.jsonl")]
    assert records[-1]["env_steps"] == 524288
