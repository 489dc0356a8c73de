"""What a learner counts is what it learned: a real `Learner`, one actor's real channels,
real orbax checkpoints.

- a checkpoint leaves out the pooled trajectories it does not hold (admitted, never
  learned from): the env steps and budget saved are those learned from, and a run resumed
  from it reports how many it gave back to the budget;
- an update skipped for non-finite gradients counts none of its samples as fresh.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import zmq

from tianjax.checkpoint import store as ckpt
from tianjax.config import load_config
from tianjax.core.rollout import Episodes
from tianjax.runtime.learner.learner import Learner
from tianjax.transport.auth import new_run_key
from tianjax.transport.channels import ControlClient, TrajectorySender

CONFIG = str(Path(__file__).resolve().parents[3] / "configs" / "ppo_cartpole_async.yaml")
TINY = [
    "num_actors=1",
    "num_envs=4",
    "rollout_len=8",
    "ppo.num_minibatches=1",
    "runtime.max_reuse=0",
]
TRAJ = 4 * 8  # env steps per trajectory
WAIT_S = 30.0


def _tree(template, reward: float = 0.0):
    batch_t = template[0]
    leaves = {name: np.zeros(s.shape, s.dtype) for name, s in zip(batch_t._fields, batch_t)}
    leaves["reward"] = np.full(batch_t.reward.shape, reward, batch_t.reward.dtype)
    T, B = batch_t.reward.shape
    episodes = Episodes(
        np.zeros((T, B), bool), np.zeros((T, B), np.float32), np.zeros((T, B), np.int32)
    )
    return type(batch_t)(**leaves), episodes, np.asarray(0, np.int64)


class _Actor:
    """One actor's control and trajectory channels, addressed to `learner`."""

    def __init__(self, key, learner):
        self.ctx = zmq.Context()
        net = dict(ctx=self.ctx, handshake=learner.net.handshake)
        self.ctl = ControlClient(
            key, learner.endpoints["control"], identity="actor-0", to=learner.address, **net
        )
        self.traj = TrajectorySender(
            key, learner.endpoints["traj"], sender="actor-0", to=learner.address, hwm=100, **net
        )

    def close(self):
        self.ctx.destroy(linger=0)


def test_a_checkpoint_leaves_out_the_pool_and_a_resume_reports_it(tmp_path):
    key = new_run_key()
    # a batch of 4 trajectories: 3 pooled never make an update
    config = load_config(
        CONFIG,
        TINY
        + [
            "runtime.batch_trajectories=4",
            "runtime.credits_per_actor=4",
            f"total_env_steps={8 * TRAJ}",
        ],
    )
    learner = Learner(config, key, checkpoint_root=str(tmp_path))
    actor = _Actor(key, learner)
    try:
        assert actor.ctl.send({"type": "register", "actor": 0})
        for _ in range(3):
            assert actor.traj.send(_tree(learner.template), version=0, timeout_ms=5000)
        deadline = time.monotonic() + WAIT_S
        while len(learner.pool) < 3:
            assert time.monotonic() < deadline
            learner.pump(10)
        assert learner.env_steps == 3 * TRAJ and learner.measures.produced == 3 * TRAJ
        learner.recorder.open_checkpoints(str(tmp_path), start=0)
        learner.save_checkpoint(time.perf_counter())
        learner.recorder.close()
    finally:
        actor.close()
        learner.close()
    meta = ckpt.read_meta(str(tmp_path))
    # nothing learned: nothing of it saved as done, and what was left out is said
    assert meta["env_steps"] == 0 and meta["balance"]["produced"] == 0
    assert meta["unlearned_samples"] == 3 * TRAJ

    resumed = Learner(
        load_config(
            CONFIG,
            TINY
            + ["runtime.batch_trajectories=4", f"total_env_steps={8 * TRAJ}", f"resume={tmp_path}"],
        ),
        new_run_key(),
    )
    try:
        assert resumed.env_steps == 0 and resumed.measures.produced == 0
        assert resumed.ingress.credits_left() == 8  # the whole budget is there to be acted again
        assert resumed.result().extra_summary["resume_unlearned_samples"] == 3 * TRAJ
    finally:
        resumed.close()


def test_a_skipped_update_counts_nothing_as_fresh():
    """Rewards of 3e38 are finite (they pass the receiver's check) but their returns
    overflow: the update's gradients are not finite, it is skipped, and its samples were
    not learned from."""
    key = new_run_key()
    config = load_config(CONFIG, TINY + [f"total_env_steps={TRAJ}"])
    learner = Learner(config, key)
    actor = _Actor(key, learner)
    sent = threading.Event()

    def act():
        assert actor.ctl.send({"type": "register", "actor": 0})
        deadline = time.monotonic() + WAIT_S
        while (msg := actor.ctl.recv(100)) is None or msg.get("type") != "credit":
            if time.monotonic() > deadline:
                return
        sent.set()
        actor.traj.send(_tree(learner.template, reward=3e38), version=0, timeout_ms=5000)

    thread = threading.Thread(target=act, daemon=True)
    try:
        thread.start()
        give_up = time.monotonic() + 120  # (the run ends by itself; this bounds a broken one)
        out = learner.run(should_stop=lambda: time.monotonic() > give_up)
    finally:
        thread.join(10)
        actor.close()
        learner.close()
    assert sent.is_set()
    extra = out.extra_summary
    assert out.skipped_updates == 1 and out.updates == 0
    assert extra["balance"]["samples_consumed"] == TRAJ  # taken from the pool...
    assert extra["balance"]["samples_fresh"] == 0  # ...but not learned from
    assert extra["skipped_fresh_samples"] == TRAJ
