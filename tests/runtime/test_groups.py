"""The averager and two GroupSyncs over real loopback sockets, in one process, with
parameters moved by hand (tianjax/runtime/groups): round 0 is the groups' common start;
two fresh deltas make their mean, which both groups merge keeping what they learned since
they sent; a delta waiting in an averager that is stopped is lost with it, and its group
keeps that progress and sends it with its next delta to the restarted averager, which goes
on from its checkpoint's round; a group silent past groups.timeout_s is left out of rounds
and is back with its next delta; a delta staler than groups.max_staleness is dropped, and
its group learns it from the average."""

from __future__ import annotations

import secrets
import threading
import time

import jax
import numpy as np
import pytest

from tianjax.config import load_config
from tianjax.runtime.groups.averager import Averager, initial_params
from tianjax.runtime.groups.sync import GroupPlace, GroupSync
from tianjax.transport.auth import new_run_key
from tianjax.transport.security import secure_context

from ..integration.conftest import REPO

CONFIG = str(REPO / "configs" / "ppo_latency_async.yaml")


def _config(*overrides):
    return load_config(
        CONFIG,
        [
            "groups.count=2",
            "num_actors=2",
            "network.hidden=[8]",
            "groups.sync_every=1",
            "runtime.bind_host=127.0.0.1",
            "groups.round_wait_s=0.5",
            *overrides,
        ],
    )


class Rig:
    """An averager in a thread and two groups whose boundaries the test calls."""

    def __init__(self, config, run_dir):
        self.config, self.run_dir = config, run_dir
        self.key = new_run_key()
        self.theta0 = jax.tree.map(jax.numpy.asarray, initial_params(config))
        self.averager = self.thread = None
        self.endpoints = None
        self.start_averager()
        self.nets = [secure_context(self.key, config.runtime, server=False) for _ in range(2)]
        self.groups = [
            GroupSync(config, GroupPlace(g, self.endpoints), self.key, self.nets[g], self.theta0)
            for g in range(2)
        ]
        self.params = [self.theta0, self.theta0]
        self.updates = [0, 0]

    def start_averager(self):
        self._stop = False
        # (a restarted averager is a new process: a new incarnation)
        self.averager = Averager(
            self.config,
            self.key,
            str(self.run_dir),
            endpoints=self.endpoints,
            incarnation=secrets.token_hex(8),
        )
        self.endpoints = self.averager.endpoints
        self.summary = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        self.summary = self.averager.run(lambda: self._stop)

    def stop_averager(self):
        self._stop = True
        self.thread.join(30)
        self.averager.close(self.summary)

    def step(self, g: int, change: float | None = None):
        """Group g's boundary, after an update that moved every parameter by `change`."""
        if change is not None:
            self.params[g] = jax.tree.map(lambda x: x + change, self.params[g])
            self.updates[g] += 1
        merged = self.groups[g].boundary(self.params[g], self.updates[g])
        if merged is not None:
            self.params[g] = merged
        return merged

    def until(self, what, timeout=20.0, groups=(0, 1)):
        deadline = time.monotonic() + timeout
        while not what():
            assert time.monotonic() < deadline, "timed out"
            for g in groups:
                self.step(g)
            time.sleep(0.01)

    def close(self):
        if self.thread is not None and self.thread.is_alive():
            self.stop_averager()
        for s in self.groups:
            s.close()
        for n in self.nets:
            n.close()


@pytest.fixture
def rig(tmp_path, request):
    r = Rig(_config(*getattr(request, "param", ())), tmp_path / "averager")
    try:
        yield r
    finally:
        r.close()


def _close(a, b, atol=1e-6):
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=atol), a, b)


def test_fresh_deltas_make_the_mean_and_each_group_keeps_its_progress(rig):
    rig.until(lambda: all(s.base_round == 0 for s in rig.groups))  # round 0: the start
    _close(rig.params[0], rig.theta0)
    rig.step(0, 0.5)  # group 0 moved every parameter by 0.5, group 1 by -0.25
    rig.step(1, -0.25)
    rig.until(lambda: all(s.base_round == 1 for s in rig.groups))
    mean = jax.tree.map(lambda x: x + 0.125, rig.theta0)
    _close(rig.params[0], mean)
    _close(rig.params[1], mean)
    # a group that learned more after it sent keeps that on top of the average
    rig.step(0, 1.0)
    rig.step(0)
    rig.step(1, 0.25)
    rig.until(lambda: all(s.base_round == 2 for s in rig.groups))
    assert rig.averager.round == 2
    for s in rig.groups:
        assert s.counts["deltas_merged"] == 2 and s.counts["deltas_lost"] == 0


def test_a_delta_lost_with_the_averager_goes_with_the_next_one(rig):
    rig.until(lambda: all(s.base_round == 0 for s in rig.groups))
    rig.step(0, 0.5)
    rig.step(1, 0.5)
    rig.until(lambda: all(s.base_round == 1 for s in rig.groups))
    theta1 = rig.params[0]
    # group 0 sends; group 1 does not, so the round waits (round_wait_s) and the averager
    # is stopped with group 0's delta waiting in it
    rig.step(0, 1.0)
    rig.until(lambda: rig.groups[0].in_flight is not None, groups=(0,))
    time.sleep(0.3)  # (it arrives)
    rig.stop_averager()
    rig.start_averager()  # from its checkpoint: round 1; a new incarnation
    assert rig.averager.round == 1 and rig.averager.resumed_from == 1
    rig.until(lambda: rig.groups[0].counts["deltas_lost"] == 1, groups=(0,))
    # the average is the one it had: group 0 keeps the progress of the lost delta
    _close(rig.params[0], jax.tree.map(lambda x: x + 1.0, theta1))
    # (group 1 follows the new incarnation too before it sends: one sent before would go
    # to the stopped one and be lost the same way)
    rig.until(lambda: rig.groups[1].base_source == rig.averager.address, groups=(1,))
    rig.step(1, 0.0)  # both send: group 0's delta now carries the lost one's progress
    rig.step(0, 0.0)
    rig.until(lambda: all(s.base_round == 2 for s in rig.groups))
    _close(rig.params[0], jax.tree.map(lambda x: x + 0.5, theta1))


@pytest.mark.parametrize(
    "rig", [("groups.timeout_s=1.5", "groups.round_wait_s=0.2")], indirect=True
)
def test_a_silent_group_is_left_out_and_back_with_its_next_delta(rig, capfd):
    rig.until(lambda: all(s.base_round == 0 for s in rig.groups))
    time.sleep(1.7)  # group 1 says nothing for longer than timeout_s
    rig.step(0, 0.5)
    rig.until(lambda: rig.groups[0].base_round == 1, groups=(0,))
    assert 1 in rig.averager.left_out
    # its round had group 0 alone: the average is group 0's parameters
    _close(rig.params[0], jax.tree.map(lambda x: x + 0.5, rig.theta0))
    rig.step(1, -0.5)  # back: its delta was made against round 0, one round stale
    rig.until(lambda: rig.groups[1].base_round == 2, groups=(1,))
    # (group 0 was silent as long, and came back first)
    assert 1 not in rig.averager.left_out and rig.averager.counts["rejoins"] == 2
    # constant schedule: its one-round-stale delta has the round to itself
    _close(rig.params[1], rig.theta0)
    assert "group 1 silent for more than 1.5 s" in capfd.readouterr().err


@pytest.mark.parametrize(
    "rig",
    [("groups.schedule=cutoff", "groups.max_staleness=0", "groups.round_wait_s=0.2")],
    indirect=True,
)
def test_a_delta_too_stale_is_dropped_and_its_group_takes_the_average(rig):
    rig.until(lambda: all(s.base_round == 0 for s in rig.groups))
    rig.step(1, 2.0)  # group 1 makes a delta against round 0 and holds it unsent
    assert rig.groups[1].prepared is not None
    rig.step(0, 0.5)
    rig.until(lambda: rig.groups[0].base_round == 1, groups=(0,))  # closed without group 1
    # group 1 sends it now: one round stale, and max_staleness is 0
    rig.until(lambda: rig.groups[1].base_round == 1, groups=(1,))
    s = rig.groups[1]
    assert s.counts["deltas_dropped"] == 1 and rig.averager.counts["dropped"] == 1
    # dropped: its progress is the average's to leave; it continues from round 1's average
    _close(rig.params[1], jax.tree.map(lambda x: x + 0.5, rig.theta0))
    assert rig.averager.round == 1  # a round of dropped deltas only does not advance
