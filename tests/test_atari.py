"""Atari through envpool: frames stay uint8 from the env, through the actor's batch and the
wire, to the learner's decoded batch; the Nature torso takes them."""

import jax
import numpy as np
import pytest
import zmq

from tianjax.config import ConfigError, load_config
from tianjax.runtime.sources import batch_template, make_source
from tianjax.transport.auth import RunKey
from tianjax.transport.channels import TrajectoryReceiver, TrajectorySender

KEY = RunKey(bytes(range(32)))
T, B = 4, 2


def test_pong_frames_are_uint8_from_env_to_learner():
    config = load_config("configs/ppo_pong_async.yaml", [f"num_envs={B}", f"rollout_len={T}"])
    source = make_source(config, seed=0)
    try:
        assert source.obs_dtype == np.uint8
        params = jax.jit(source.algo.init)(jax.random.key(0)).params
        assert params["params"]["Torso_0"]["NatureCNN_0"]["Conv_0"]["kernel"].shape == (8, 8, 4, 32)
        rollout = source(params, 0, 0)
    finally:
        source.close()
    obs = rollout.batch.obs
    assert obs.dtype == np.uint8 and obs.shape == (T, B, 4, 84, 84) and obs.max() > 0
    assert rollout.batch.last_obs.dtype == np.uint8

    template = batch_template(config, source.algo, (4, 84, 84), np.uint8)
    ctx = zmq.Context()
    try:
        with TrajectoryReceiver(KEY, template, ctx=ctx) as rx, \
                TrajectorySender(KEY, rx.endpoint, sender="actor-0", ctx=ctx) as tx:
            assert tx.send((rollout.batch, rollout.episodes, np.asarray(0, np.int64)), 0, timeout_ms=5000)
            msg = rx.recv(timeout_ms=10_000)
    finally:
        ctx.term()
    assert msg is not None and rx.accepted == 1
    got = msg.tree[0]
    assert got.obs.dtype == np.uint8 and got.obs.nbytes == T * B * 4 * 84 * 84  # one byte a pixel
    np.testing.assert_array_equal(got.obs, obs)


def test_env_options_reach_envpool_and_bad_ones_name_the_key():
    with pytest.raises(ConfigError, match="config key 'env_options': envpool refused .*'no_such_option'"):
        make_source(load_config("configs/ppo_pong_async.yaml", ["num_envs=1", "rollout_len=4",
                                                                "env_options.no_such_option=1"]), seed=0)
    with pytest.raises(ConfigError, match="config key 'env_options': is for host envs"):
        load_config("configs/ppo_cartpole.yaml", ["env_options.max_steps_in_episode=10"])
    with pytest.raises(ConfigError, match="config key 'env_options.stack_num': must be a number"):
        load_config("configs/ppo_pong_async.yaml", ["env_options.stack_num={a: 1}"])
