"""Only the run's own key gets anything into a learner, over real sockets with real
`Learner`s. Two layers: the handshake (a connection without the run's credentials is
refused by the learner's gatekeeper before it carries a message) and, behind it, the
per-message MAC (a peer that got past the handshake, e.g. with a token read off a
network under `security: plain`, still cannot inject: a trajectory signed with another key
or not signed at all is rejected and counted by reason). A second run on the same
machine (its own key) cannot connect to the first, while its own traffic works; and the
run key is never written to the run directory.
"""

from __future__ import annotations

import time
from pathlib import Path

import jax
import numpy as np
import pytest
import zmq

import tianjax
import tianjax.runtime.runners.local as local_launch
from tianjax.config import load_config
from tianjax.core.rollout import Episodes
from tianjax.core.types import ParamsMessage
from tianjax.runtime.learner.learner import Learner, to_host
from tianjax.transport.auth import InsecureNoAuth, MessageAuth, new_run_key
from tianjax.transport.channels import ControlClient, ParamSubscriber, TrajectorySender
from tianjax.transport.codec import encode

REPO = Path(__file__).resolve().parents[2]
CONFIG = str(REPO / "configs" / "ppo_cartpole_async.yaml")
TINY = ["num_actors=1", "num_envs=4", "rollout_len=8", "ppo.num_minibatches=1"]
WAIT_S = 20.0
SEND_MS = 5000


def _tree(template, rng, version: int = 0):
    batch_t = template[0]
    leaves = {
        name: (
            rng.standard_normal(s.shape)
            if np.issubdtype(s.dtype, np.floating)
            else np.zeros(s.shape)
        ).astype(s.dtype)
        for name, s in zip(batch_t._fields, batch_t)
    }
    leaves["version"] = np.full(batch_t.version.shape, version, batch_t.version.dtype)
    T, B = batch_t.reward.shape
    # a finished episode with an absurd return: it must never reach the learner's tracker
    episodes = Episodes(
        np.ones((T, B), bool), np.full((T, B), 1e9, np.float32), np.ones((T, B), np.int32)
    )
    return type(batch_t)(**leaves), episodes, np.asarray(0, np.int64)


def _state(learner) -> list[bytes]:
    out = []
    for leaf in jax.tree.leaves(learner.state):
        if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)
        a = np.asarray(leaf)
        out.append((a.dtype.str, a.shape, a.tobytes()))
    return out


def _pump_until(learner, traj: int, ctrl: int = 0, quiet_s: float = 0.2) -> None:
    """Pumps until the learner has processed `traj` trajectory and `ctrl` control messages
    (accepted or rejected), then a little longer to see that nothing more arrives."""

    def processed():
        return (
            learner.traj_in.accepted + sum(learner.traj_in.rejected.values()),
            learner.control.accepted + sum(learner.control.rejected.values()),
        )

    deadline = time.monotonic() + WAIT_S
    while processed() < (traj, ctrl):
        assert time.monotonic() < deadline, f"processed {processed()} of {(traj, ctrl)}"
        learner.pump(10)
    end = time.monotonic() + quiet_s
    while time.monotonic() < end:
        learner.pump(10)
    assert processed() == (traj, ctrl)


@pytest.fixture(scope="module")
def learners():
    config = load_config(CONFIG, TINY)
    made = []
    try:
        for _ in range(2):
            key = new_run_key()
            made.append((Learner(config, key), key))
        yield made
    finally:
        for learner, _ in made:
            learner.close()


def test_wrong_key_and_unsigned_trajectories_are_rejected_by_reason(learners):
    (learner, key), _ = learners
    before = _state(learner)
    base_rejected = dict(learner.traj_in.rejected)
    base_accepted, base_pool = learner.traj_in.accepted, len(learner.pool)
    rng = np.random.default_rng(0)
    n = 5
    ctx = zmq.Context()
    try:
        # the connection credentials (not the run key): past the handshake, to the MACs
        shake = learner.net.handshake
        wrong_key = TrajectorySender(
            new_run_key(),
            learner.endpoints["traj"],
            sender="actor-0",
            to=learner.address,
            hwm=100,
            ctx=ctx,
            handshake=shake,
        )
        zero_tag = TrajectorySender(
            InsecureNoAuth(),
            learner.endpoints["traj"],
            sender="actor-0",
            to=learner.address,
            hwm=100,
            ctx=ctx,
            handshake=shake,
        )
        raw = ctx.socket(zmq.PUSH)
        raw.linger, raw.sndtimeo = 0, SEND_MS
        shake.client(raw)
        raw.connect(learner.endpoints["traj"])
        for i in range(n):
            assert wrong_key.send(_tree(learner.template, rng), version=0, timeout_ms=SEND_MS)
            assert zero_tag.send(_tree(learner.template, rng), version=0, timeout_ms=SEND_MS)
            # with the right key, then the tag taken off: header and leaves only
            frames = encode(
                _tree(learner.template, rng),
                auth=MessageAuth(key),
                kind="traj",
                version=0,
                sender="actor-0",
                seq=i + 1,
                to=learner.address,
            )
            raw.send_multipart(frames[1:])
        _pump_until(learner, base_accepted + sum(base_rejected.values()) + 3 * n)
    finally:
        ctx.destroy(linger=0)

    assert learner.traj_in.rejected["auth"] - base_rejected.get("auth", 0) == 3 * n
    assert sum(learner.traj_in.rejected.values()) - sum(base_rejected.values()) == 3 * n
    assert learner.traj_in.accepted == base_accepted
    assert len(learner.pool) == base_pool and learner.env_steps == 0
    assert learner.tracker.episodes == 0 and learner.dropped_nonfinite == 0
    assert _state(learner) == before


def test_a_second_run_cannot_inject_into_the_first(learners):
    (a, _), (b, key_b) = learners
    state_a, state_b = _state(a), _state(b)
    version_a = a.state_version
    a_rejected = sum(a.traj_in.rejected.values())
    a_accepted, a_pool, b_pool = a.traj_in.accepted, len(a.pool), len(b.pool)
    a_refused = a.net.gatekeeper.refused["credentials"]
    rng = np.random.default_rng(1)
    n = 4
    ctx = zmq.Context()
    try:
        # run B's actor-0, pointed at run A: real channels, run B's key and handshake
        shake_b = b.net.handshake
        into_a = TrajectorySender(
            key_b,
            a.endpoints["traj"],
            sender="actor-0",
            to=a.address,
            hwm=100,
            ctx=ctx,
            handshake=shake_b,
        )
        ctl_a = ControlClient(
            key_b,
            a.endpoints["control"],
            identity="actor-0",
            to=a.address,
            ctx=ctx,
            handshake=shake_b,
        )
        params_a = ParamSubscriber(
            key_b,
            a.endpoints["params"],
            ParamsMessage(to_host(a.state.params), np.zeros((), np.int64)),
            ctx=ctx,
            handshake=shake_b,
        )
        # the same, pointed at its own run B
        into_b = TrajectorySender(
            key_b,
            b.endpoints["traj"],
            sender="actor-0",
            to=b.address,
            hwm=100,
            ctx=ctx,
            handshake=shake_b,
        )
        ctl_b = ControlClient(
            key_b,
            b.endpoints["control"],
            identity="actor-0",
            to=b.address,
            ctx=ctx,
            handshake=shake_b,
        )
        params_b = ParamSubscriber(
            key_b,
            b.endpoints["params"],
            ParamsMessage(to_host(b.state.params), np.zeros((), np.int64)),
            ctx=ctx,
            handshake=shake_b,
        )

        for ctl in (ctl_a, ctl_b):
            ok = [
                ctl.send({"type": "register", "actor": 0}),
                ctl.send({"type": "heartbeat", "actor": 0, "credits": 2}),
            ]
            assert all(ok) or ctl is ctl_a
        # the register is answered before any trajectory arrives: the credits granted are the
        # window less what the actor already holds, so a trajectory pooled first would take one
        _pump_until(b, 0, ctrl=2)
        # run B's learner answered its own actor's register with credits; run A said nothing
        assert ctl_b.recv(WAIT_S * 1000) == {
            "type": "credit",
            "n": b.config.runtime.credits_per_actor,
        }
        assert ctl_a.recv(200) is None
        for i in range(n):
            # queued, or refused once the handshake failed: either way nothing may reach A
            into_a.send(_tree(a.template, rng), version=0, timeout_ms=0)
            assert into_b.send(_tree(b.template, rng), version=0, timeout_ms=SEND_MS)
        _pump_until(b, n, ctrl=2)
        # parameters: run B's actor takes run B's, and never run A's
        deadline = time.monotonic() + WAIT_S
        got_b = None
        # run A's gatekeeper refuses all three of run B's connections at the handshake
        while got_b is None or a.net.gatekeeper.refused["credentials"] - a_refused < 3:
            assert time.monotonic() < deadline, (got_b, dict(a.net.gatekeeper.refused))
            a.publish()
            b.publish()
            a.pump(10)
            got_b = got_b or params_b.latest(50)
            assert params_a.latest(0) is None
        assert got_b[0] == b.state_version
        assert params_a.accepted == 0 and not params_a.rejected  # not one byte of A's parameters
        _pump_until(a, a_accepted + a_rejected)  # and nothing of B's reaches A
    finally:
        ctx.destroy(linger=0)

    # run A: nothing got past the handshake, and nothing changed
    assert sum(a.traj_in.rejected.values()) == a_rejected
    assert a.traj_in.accepted == a_accepted
    assert not a.control.rejected and a.control.accepted == 0
    assert len(a.pool) == a_pool and a.env_steps == 0 and a.tracker.episodes == 0
    assert a.actors == {} and a.control.peers == {}
    assert a.state_version == version_a and _state(a) == state_a
    # run B: its own actor got in
    assert b.traj_in.accepted == n and not b.traj_in.rejected
    assert b.control.accepted == 2 and not b.control.rejected
    assert len(b.pool) - b_pool == n and {item[1] for item in b.pool} == {b"actor-0"}
    assert b"actor-0" in b.actors
    assert _state(b) == state_b  # taking in trajectories does not update


def test_run_key_is_never_written_to_the_run_dir(tmp_path, monkeypatch):
    keys = []

    def recording_key():
        key = new_run_key()
        keys.append(key)
        return key

    monkeypatch.setattr(local_launch, "new_run_key", recording_key)
    run_dir = tmp_path / "run"
    result = tianjax.train(
        CONFIG,
        [*TINY, "total_env_steps=320", "log_every=1"],
        run_dir=str(run_dir),
        progress=False,
        verbose=False,
    )
    assert len(keys) == 1 and result.summary["updates"] >= 1
    key = keys[0]
    needles = [key.hex().encode(), key.hex().upper().encode(), bytes(key)]
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    names = {p.name for p in files}
    assert {"config.yaml", "metrics.jsonl", "summary.json"} <= names, names
    for path in files:
        data = path.read_bytes()
        for needle in needles:
            assert needle not in data, f"the run key is in {path.relative_to(run_dir)}"


def test_mac_beyond_loopback_warns_what_an_observer_can_do(capsys):
    from tianjax.transport.security import secure_context

    for overrides, warned in (
        (["runtime.bind_host=0.0.0.0", "runtime.security=plain"], True),
        (["runtime.bind_host=127.0.0.1", "runtime.security=plain"], False),
        (["runtime.bind_host=0.0.0.0", "runtime.security=curve"], False),
    ):
        rt = load_config(CONFIG, TINY + overrides).runtime
        for server in (True, False):
            secure_context(new_run_key(), rt, server=server).close()
            err = capsys.readouterr().err
            assert ("beyond loopback" in err) == (warned and server), (overrides, server, err)
    secure_context(
        new_run_key(),
        load_config(CONFIG, TINY + ["runtime.bind_host=0.0.0.0", "runtime.security=plain"]).runtime,
        server=True,
    ).close()
    err = capsys.readouterr().err
    assert "reads the connection token and every parameter and trajectory in clear" in err
    assert "runtime.security: curve" in err and err.count("\n") == 1  # one line


def test_a_learner_whose_gatekeeper_dies_stops_with_one_line():
    from tianjax.runtime.learner.io import GatekeeperStopped

    learner = Learner(load_config(CONFIG, TINY), new_run_key())
    try:
        learner.io.check()  # alive: nothing to say
        learner.net.gatekeeper.close()
        with pytest.raises(GatekeeperStopped, match="gatekeeper stopped; no actor can connect"):
            learner.run()
    finally:
        learner.close()
