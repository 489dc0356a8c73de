"""The receiver thread's placement (ShardedUpdate.placer, one learner device): a decoded
trajectory's fields arrive on the device with the batch's shardings and their own values,
the behaviour versions stay on the host, and the episodes and the step count pass through."""

from pathlib import Path

import jax
import numpy as np

from tianjax.algos import make_algorithm
from tianjax.config import load_config
from tianjax.envs.factory import env_spec
from tianjax.runtime.actor.sources import batch_template
from tianjax.runtime.learner.sharded_update import ShardedUpdate

CONFIG = str(Path(__file__).resolve().parents[3] / "configs" / "ppo_latency_async.yaml")


def test_a_trajectory_is_placed_field_by_field_as_the_batch_is_sharded():
    config = load_config(CONFIG, ["num_actors=2", "num_envs=4", "rollout_len=8"])
    obs_shape, obs_dtype, action_spec = env_spec(config)
    algo = make_algorithm(config, obs_shape, action_spec, obs_dtype=obs_dtype)
    template = batch_template(config, algo, obs_shape, obs_dtype)
    sgd = ShardedUpdate(config, algo, template[0], config.batch_trajectories)
    place = sgd.placer()
    assert place is not None  # one device, one process
    rng = np.random.default_rng(0)
    tree = jax.tree.map(lambda s: (rng.standard_normal(s.shape) * 10).astype(s.dtype), template)

    batch, episodes, act_steps = place(tree)

    assert type(batch) is type(tree[0])
    for name in batch._fields:
        got, sent = getattr(batch, name), getattr(tree[0], name)
        if name == "version":
            assert got is sent  # read on the host by the loop (staleness, admission)
            continue
        assert isinstance(got, jax.Array), name
        assert got.sharding == getattr(sgd.traj_sharding, name), name
        np.testing.assert_array_equal(np.asarray(got), sent)
    assert episodes is tree[1] and act_steps is tree[2]
