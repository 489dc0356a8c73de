"""The learner applies the balance controller's window over real sockets: a real `Learner`
and one actor's real control and trajectory channels. A window the controller shrank is
reached by not re-granting freed slots; a window it widened is granted at once."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import zmq

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
    "runtime.credits_per_actor=3",
    "runtime.publish_every=1",
    "runtime.max_reuse=0",
    "balance.mode=adaptive",
    "balance.target_staleness=2",
]
WAIT_S = 20.0


def _tree(template, version=0):
    batch_t = template[0]
    leaves = {name: np.zeros(s.shape, s.dtype) for name, s in zip(batch_t._fields, batch_t)}
    T, B = batch_t.reward.shape
    episodes = Episodes(
        np.zeros((T, B), bool), np.zeros((T, B), np.float32), np.zeros((T, B), np.int32)
    )
    return type(batch_t)(**leaves), episodes, np.asarray(0, np.int64)


def _credits(ctl, learner, wait_s=0.5) -> int:
    """Credits granted to the actor until nothing more comes for `wait_s`."""
    total, end = 0, time.monotonic() + wait_s
    while time.monotonic() < end:
        learner.pump(5)
        msg = ctl.recv(20)
        if msg is not None and msg.get("type") == "credit":
            total += msg["n"]
            end = time.monotonic() + wait_s
    return total


def _decide(learner, tau: float, t: float) -> None:
    """The controller measures `tau` over as many updates as it waits for (the pipeline
    after a move, then its measured ones) and decides at time `t` (its clock)."""
    ctl = learner.controller
    for _ in range(max(ctl.updates_needed, 1)):
        ctl.consumed(tau * 10, 10)
    learner.ingress.steer(t)


@pytest.fixture
def rig():
    key = new_run_key()
    learner = Learner(load_config(CONFIG, TINY), key)
    ctx = zmq.Context()
    try:
        shake = learner.net.handshake  # the run's own credentials
        ctl = ControlClient(
            key,
            learner.endpoints["control"],
            identity="actor-0",
            to=learner.address,
            ctx=ctx,
            handshake=shake,
        )
        traj = TrajectorySender(
            key,
            learner.endpoints["traj"],
            sender="actor-0",
            to=learner.address,
            hwm=100,
            ctx=ctx,
            handshake=shake,
        )
        yield learner, ctl, traj
    finally:
        ctx.destroy(linger=0)
        learner.close()


def test_shrunk_window_holds_back_freed_slots_and_a_wider_one_is_granted(rig):
    learner, ctl, traj = rig
    assert ctl.send({"type": "register", "actor": 0})
    assert _credits(ctl, learner) == 3  # the bound: runtime.credits_per_actor
    learner.ingress.steer(0.0)  # the controller's clock starts
    _decide(learner, tau=20.0, t=1.5)  # far too stale: the window falls to one batch (1)
    assert learner.controller.actions.window == 1
    for _ in range(3):
        assert traj.send(_tree(learner.template), version=0, timeout_ms=5000)
    deadline = time.monotonic() + WAIT_S
    while len(learner.pool) < 3:
        assert time.monotonic() < deadline
        learner.pump(10)
    # the first two slots freed are not handed back (2 and then 1 still pooled); the last is
    granted = []
    for _ in range(3):
        assert learner.batches.take(learner.state_version) is not None
        granted.append(_credits(ctl, learner, 0.2))
    assert granted == [0, 0, 1]
    # fresher than asked: the window grows by 0.5 * k * |error| = 1 and the slot is granted now
    _decide(learner, tau=0.0, t=3.0)
    assert learner.controller.actions.window == 2
    assert _credits(ctl, learner) == 1


def test_actor_time_reports_are_summed_and_malformed_ones_ignored(rig):
    learner, ctl, _ = rig
    good = {
        "acting": 3.0,
        "waiting_credit": 1.0,
        "waiting_params": 0.5,
        "sending": 0.5,
        "wall": 5.0,
        "cpu": 2.5,
    }
    assert ctl.send({"type": "register", "actor": 0})
    _credits(ctl, learner, 0.2)
    assert learner.ingress.actor_time_summary() == {
        "actor_time_s": dict.fromkeys(good, 0.0),
        "actor_wait_fraction": None,
    }
    assert ctl.send({"type": "heartbeat", "actor": 0, "credits": 3, "time_s": good})
    _credits(ctl, learner, 0.2)
    assert learner.ingress.actor_time_summary() == {
        "actor_time_s": good,
        "actor_wait_fraction": 0.4,
    }
    # a later report replaces the earlier one only when every field is a finite,
    # non-negative number of seconds
    for bad in (
        {**good, "acting": float("nan")},
        {**good, "wall": -1.0},
        {**good, "cpu": True},
        {k: v for k, v in good.items() if k != "sending"},
        [1, 2],
        "soon",
        {**good, "acting": "3"},
    ):
        assert ctl.send({"type": "heartbeat", "actor": 0, "credits": 3, "time_s": bad})
    _credits(ctl, learner, 0.2)
    assert learner.ingress.actor_time_summary()["actor_time_s"] == good


def test_credits_of_a_restarted_actor_stop_counting_against_admission_by_version(rig):
    """An actor process restarted (the same id registering again, on a new connection or
    the same): the credits its old process held will never come back as trajectories, so
    admission by version writes them off. Left counted, every restart shrank the room for
    good, and after a few the learner held back every credit and waited for ever."""
    learner, ctl, _ = rig
    limits = learner.ingress.limits
    assert ctl.send({"type": "register", "actor": 0})
    assert _credits(ctl, learner) == 3
    assert limits.started - limits.discarded == 3
    for _ in range(4):  # restarted four times: 12 credits out, none of them to come back
        assert ctl.send({"type": "register", "actor": 0})
        assert _credits(ctl, learner) == 3  # granted afresh, each time
        assert limits.started - limits.discarded == 3  # only the newest process's are out
