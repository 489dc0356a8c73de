"""An algorithm of one's own, from this file alone: its config section, its loss and acting,
and its AlgorithmSpec, registered once, then trained fused and async (a learner and an
actor process that imports this file) without any other file of tianjax knowing it.

The algorithm is REINFORCE with a learned baseline (a "vanilla policy gradient"), with its
own section `vpg`:

    L(theta) = -(1/N) sum_i w_i log pi_theta(a_i|s_i) (G_i - V(s_i)) + (1/2N) sum_i w_i (V_theta(s_i) - G_i)^2

G the discounted return within the rollout (bootstrapped from V at the rollout's end and
where a time limit cut an episode), w_i the staleness weights (1 when fresh).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
import pytest

import tianjax
from tianjax.algos import ON_POLICY, Algorithm, AlgorithmSpec
from tianjax.algos.policy import actor_critic
from tianjax.config import ConfigError, check_key
from tianjax.core import distributions as D
from tianjax.core import staleness as S
from tianjax.core.update import gradient_step, guarded, init_state, make_optimizer


@dataclass(frozen=True)
class VPGConfig:
    lr: float = 3e-3  # Adam's learning rate
    gamma: float = 0.99  # discount of the returns
    hidden_probe: int = 7  # not read by the loss: a key that shapes nothing, for the checks below

    def __post_init__(self):
        check_key(self.lr > 0, "vpg.lr", f"must be > 0, got {self.lr}")
        check_key(0 < self.gamma <= 1, "vpg.gamma", f"must be in (0, 1], got {self.gamma}")


class VPGBatch(NamedTuple):
    obs: jax.Array
    action: jax.Array
    ret: jax.Array
    weight: jax.Array


def discounted_returns(reward, done, bootstrap, last_value, gamma):
    """G_t = r_t + gamma (bootstrap_t + (1 - done_t) G_{t+1}), G_T = V(s_T); [T, B]."""

    def back(g_next, x):
        r, d, b = x
        g = r + gamma * (b + (1.0 - d) * g_next)
        return g, g

    _, g = jax.lax.scan(
        back, last_value, (reward, done.astype(jnp.float32), bootstrap), reverse=True
    )
    return g


def make_vpg(config, obs_shape, action_spec, *, correct_staleness: bool = True) -> Algorithm:
    cfg = config.vpg
    policy = actor_critic(config, obs_shape, action_spec)
    optimizer = make_optimizer(cfg.lr, 0.5)

    def loss_fn(params, batch: VPGBatch):
        dist, value = policy.apply(params, batch.obs)
        adv = jax.lax.stop_gradient(batch.ret - value)
        pg = -jnp.mean(batch.weight * D.log_prob(dist, batch.action) * adv)
        v = 0.5 * jnp.mean(batch.weight * jnp.square(value - batch.ret))
        return pg + v, {"policy_loss": pg, "value_loss": v}

    def init(key):
        k_net, k_state = jax.random.split(key)
        return init_state(policy.init_params(k_net), optimizer, k_state)

    def update(state, traj, fresh=True):
        last = policy.value(state.params, traj.last_obs)
        ret = discounted_returns(traj.reward, traj.done, traj.bootstrap_value, last, cfg.gamma)
        if correct_staleness:
            w, _ = S.staleness_weights(state.version, traj.version, config.staleness)
        else:
            w = jnp.ones(traj.reward.shape, jnp.float32)
        flat = jax.tree.map(
            lambda x: x.reshape((-1,) + x.shape[2:]), VPGBatch(traj.obs, traj.action, ret, w)
        )
        params, opt_state, metrics = gradient_step(
            loss_fn, optimizer, state.params, state.opt_state, flat
        )
        return state._replace(
            params=params, opt_state=opt_state, version=state.version + 1
        ), metrics

    return Algorithm(
        "vpg",
        ON_POLICY,
        init,
        policy.act,
        policy.value,
        policy.greedy,
        guarded(update),
        loss_fn,
        policy.network,
    )


def check_vpg(config) -> None:
    check_key(
        config.rollout_len >= 8,
        "rollout_len",
        f"vpg needs rollouts of 8 steps or more, got {config.rollout_len}",
    )


SPEC = tianjax.algos.register(
    AlgorithmSpec(
        "vpg",
        make_vpg,
        config=VPGConfig,
        check=check_vpg,
        shape_keys=("vpg.hidden_probe",),
        sweepable=("vpg.lr", "vpg.gamma"),
    )
)

BASE = {
    "algo": "vpg",
    "env": "CartPole-v1",
    "env_backend": "gymnax",
    "num_envs": 8,
    "rollout_len": 32,
    "target_return": None,
    "loggers": [],
    "eval": {"episodes": 0},
}


def test_its_section_is_loaded_overridden_and_checked_like_a_built_in_one():
    config = tianjax.load_config(BASE, ["vpg.lr=1e-3"])
    assert config.vpg.lr == 1e-3 and config.algo_config is config.vpg
    assert "vpg" in config.to_dict(read_only=True) and "ppo" not in config.to_dict(read_only=True)
    with pytest.raises(ConfigError, match="config key 'vpg.lr': must be > 0"):
        tianjax.load_config(BASE, ["vpg.lr=-1"])
    with pytest.raises(ConfigError, match="config key 'vpg.nope': unknown key"):
        tianjax.load_config(BASE, ["vpg.nope=1"])
    with pytest.raises(ConfigError, match="config key 'rollout_len': vpg needs"):
        tianjax.load_config(BASE, ["rollout_len=4"])
    # the other parts read the spec: checkpoint keys, make_train's inputs
    from tianjax.checkpoint import store
    from tianjax.runtime.runners.train_fn import sweepable

    assert "vpg.hidden_probe" in store.shape_keys(config)
    assert sweepable(config) == ("vpg.lr", "vpg.gamma")


def test_it_trains_fused(tmp_path):
    result = tianjax.train(
        BASE,
        ["total_env_steps=8192"],
        run_dir=str(tmp_path / "fused"),
        progress=False,
        verbose=False,
    )
    assert result.summary["updates"] == 8192 // (8 * 32)
    assert result.summary["episodes"] > 0
    with open(os.path.join(result.run_dir, "config.yaml")) as f:
        assert "vpg:" in f.read()


@pytest.mark.slow
def test_it_trains_async_with_an_actor_process_that_imports_this_file(tmp_path):
    config = dict(BASE, mode="async", num_actors=1, imports=[os.path.abspath(__file__)])
    result = tianjax.train(
        config,
        ["total_env_steps=8192"],
        run_dir=str(tmp_path / "async"),
        progress=False,
        verbose=False,
    )
    assert result.summary["env_steps"] >= 8192 - 8 * 32
    assert result.summary["updates"] >= 8192 // (8 * 32) - 1
    assert result.summary["episodes"] > 0
