"""Peers without the run key, over real sockets, cost a learner only a bounded amount.

The fast tests check each layer on its own with real channels: the handshake admits only
the run's credentials (PLAIN token under `plain`, derived CURVE keys under `curve`, and
the address allow-list), a client under `curve` will not talk to a server without the
run's key (a squatter), an oversized subscription or frame disconnects its sender, and
one host holds at most `runtime.max_connections_per_host` connections on each socket.

The slow tests run `tianjax train` (a learner and two actor processes) while a separate
attacker process (tests/transport/hostile_peer.py) attacks it, and check that the run still reaches
its target with these bounds:

- descriptors: the learner closes every connection without credentials, at once or when
  the handshake limit (security.HANDSHAKE_MS, 3 s) runs out: none lives through the attack
  (a flood of 25 s; on a loaded 2-core machine the I/O thread may get to a timeout late,
  so the test allows half of that), and the learner holds at most its own descriptors
  plus the attacker's connections in flight;
- memory: the learner's RSS grows by less than 256 MiB over the attack (16 frames of
  64 MiB buffered whole would be 1 GiB; 1000 subscriptions of 64 KiB, 64 MiB);
- confidentiality under `curve`: a subscriber without the run key receives nothing;
- a squatter waiting for a restarted learner's ports never gets them, nor any byte;
- a holder of the PLAIN token flooding bad messages neither keeps the run from its
  target nor grows the learner past the same bound, and a SIGTERM under that flood
  ends every process of the run within 10 s.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import psutil
import pytest
import zmq

from tianjax.checkpoint import store as ckpt
from tianjax.transport.auth import new_run_key
from tianjax.transport.channels import (
    ParamPublisher,
    ParamSubscriber,
    TrajectoryReceiver,
    TrajectorySender,
)
from tianjax.transport.security import Handshake, SecureContext, resolve_security
from tianjax.transport.sockets import address, process_incarnation

REPO = Path(__file__).resolve().parents[2]
ASYNC_CFG = str(REPO / "configs" / "ppo_cartpole_async.yaml")
ATTACKER = str(REPO / "tests" / "transport" / "hostile_peer.py")
TREE = {"w": np.arange(12, dtype=np.float32)}
WAIT_MS = 5000
RSS_GROWTH_BOUND = 256 << 20
FLOODERS = 3  # bad-message flooders against a whole run, each a process with a connection per port


# ----------------------------------------------------------------------------- handshakes
@pytest.fixture
def server():
    """A server context with its gatekeeper (plain), closed after the test."""
    key = new_run_key()
    net = SecureContext(key, "plain", server=True)
    try:
        yield key, net
    finally:
        net.close()


def _client(key, security="plain"):
    return SecureContext(key, security, server=False)


def test_handshake_credentials_are_derived_per_run_and_never_shown():
    key = new_run_key()
    a, b = Handshake(key, "curve"), Handshake(key, "curve")
    other = Handshake(new_run_key(), "curve")
    assert a.server_public == b.server_public and a.client_public == b.client_public
    assert a.server_public != other.server_public and a.client_public != other.client_public
    assert a.server_public != a.client_public
    assert repr(a) == "Handshake(curve)" and key.hex() not in repr(a)
    with pytest.raises(TypeError):
        pickle.dumps(a)
    # the PLAIN token is the run's: this run's admitted, another's or none refused
    plain = Handshake(key, "plain")
    assert plain.admits(b"PLAIN", [b"tianjax", plain._token]) is None
    assert (
        plain.admits(b"PLAIN", [b"tianjax", Handshake(new_run_key(), "plain")._token])
        == "credentials"
    )
    assert plain.admits(b"NULL", []) == "mechanism"
    assert a.admits(b"CURVE", [zmq.utils.z85.decode(a.client_public)]) is None
    assert a.admits(b"CURVE", [zmq.utils.z85.decode(other.client_public)]) == "credentials"
    assert (
        resolve_security(None, "127.0.0.1") == "plain" and resolve_security(None, "::1") == "plain"
    )
    assert (
        resolve_security(None, "0.0.0.0") == "curve" and resolve_security(None, "host0") == "curve"
    )
    assert resolve_security("plain", "0.0.0.0") == "plain"


@pytest.mark.parametrize("security", ["plain", "curve"])
def test_only_the_runs_credentials_get_a_message_through(security):
    key = new_run_key()
    server = SecureContext(key, security, server=True)
    good, bad = _client(key, security), _client(new_run_key(), security)
    bare = zmq.Context()
    try:
        rx = TrajectoryReceiver(key, TREE, ctx=server.ctx, handshake=server.handshake)
        # another run's credentials, and none at all (NULL mechanism)
        # (kept referenced: a collected channel closes its socket, maybe before its handshake)
        others = [
            TrajectorySender(
                key, rx.endpoint, sender="x", to=rx.address, ctx=bad.ctx, handshake=bad.handshake
            ),
            TrajectorySender(key, rx.endpoint, sender="y", to=rx.address, ctx=bare),
        ]
        for i, other in enumerate(others):
            other.send(TREE, i + 1, timeout_ms=0)
        if security == "curve":
            # the server's public key (public by design, say leaked) with a key pair of its own
            spy = bare.socket(zmq.PUSH)
            spy.linger = 0
            spy.curve_serverkey = server.handshake.server_public
            spy.curve_publickey, spy.curve_secretkey = zmq.curve_keypair()
            spy.connect(rx.endpoint)
            spy.send_multipart([b"x" * 16, b"{}"])
        tx = TrajectorySender(
            key,
            rx.endpoint,
            sender="actor-0",
            to=rx.address,
            ctx=good.ctx,
            handshake=good.handshake,
        )
        assert tx.send(TREE, 3, timeout_ms=WAIT_MS)
        msg = rx.recv(WAIT_MS)
        assert msg is not None and msg.sender == "actor-0" and msg.version == 3
        assert rx.recv(500) is None  # the others never got a frame in (they hold the run key!)
        assert rx.accepted == 1 and not rx.rejected
        # another run's PLAIN token, or an unknown CURVE client key, is the gatekeeper's to
        # refuse (another run's CURVE client fails earlier: it expects another server key)
        deadline = time.monotonic() + WAIT_MS / 1000
        while server.gatekeeper.refused["credentials"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.gatekeeper.admitted >= 1 and server.gatekeeper.refused["credentials"] >= 1
        # parameters too (the PUB's frame cap leaves room for CURVE's handshake commands)
        pub = ParamPublisher(key, ctx=server.ctx, handshake=server.handshake)
        sub = ParamSubscriber(key, pub.endpoint, TREE, ctx=good.ctx, handshake=good.handshake)
        got, deadline = None, time.monotonic() + WAIT_MS / 1000
        while got is None and time.monotonic() < deadline:
            pub.publish(5, TREE)
            got = sub.latest(20)
        assert got is not None and got[0] == 5
    finally:
        bare.destroy(linger=0)
        for net in (good, bad, server):
            net.close()


def test_address_allow_list_refuses_other_hosts_even_with_credentials():
    key = new_run_key()
    server = SecureContext(key, "plain", server=True, allow=("192.0.2.1",))
    client = _client(key)
    try:
        rx = TrajectoryReceiver(key, TREE, ctx=server.ctx, handshake=server.handshake)
        tx = TrajectorySender(
            key,
            rx.endpoint,
            sender="actor-0",
            to=rx.address,
            ctx=client.ctx,
            handshake=client.handshake,
        )
        tx.send(TREE, 1)
        assert rx.recv(1000) is None
        # closed at accept by the kernel-side filter, before any handshake: the gatekeeper
        # (Python, in the learner's process) never even heard of the connection
        gk = server.gatekeeper
        assert gk.admitted == 0 and not gk.refused
        # its own check, the second layer, refuses the host too, and a tcp peer without
        # an address (tcp peers always have one)
        token = server.handshake._token
        for address in (b"127.0.0.1", b""):
            reply = gk._answer(
                [b"1.0", b"7", b"tianjax.tcp", address, b"", b"PLAIN", b"tianjax", token]
            )
            assert reply[2] == b"400"
        assert gk.refused == {"address": 2}
        ipc = gk._answer([b"1.0", b"8", b"tianjax.ipc", b"", b"", b"PLAIN", b"tianjax", token])
        other = gk._answer([b"1.0", b"9", b"elsewhere", b"", b"", b"PLAIN", b"tianjax", token])
        assert ipc[2] == b"200" and other[2] == b"400" and gk.refused["domain"] == 1
    finally:
        client.close()
        server.close()


@pytest.mark.parametrize("security", ["plain", "curve"])
def test_without_its_gatekeeper_a_server_admits_nobody(security):
    """ZAP_ENFORCE_DOMAIN: a server whose ZAP handler is gone refuses every connection,
    even one with the run's credentials (libzmq would otherwise admit a CURVE client that
    knows the server key), and the learner's check sees the gatekeeper is gone."""
    key = new_run_key()
    server = SecureContext(key, security, server=True)
    client = _client(key, security)
    try:
        rx = TrajectoryReceiver(key, TREE, ctx=server.ctx, handshake=server.handshake)
        assert server.gatekeeper.alive
        server.gatekeeper.close()
        assert not server.gatekeeper.alive
        tx = TrajectorySender(
            key,
            rx.endpoint,
            sender="actor-0",
            to=rx.address,
            ctx=client.ctx,
            handshake=client.handshake,
        )
        tx.send(TREE, 1, timeout_ms=0)
        assert rx.recv(1500) is None and rx.accepted == 0
    finally:
        client.close()
        server.close()


def test_curve_actor_will_not_talk_to_a_squatter_without_the_key():
    """The actor side pins the learner's public key: a server that binds the port with
    any other key (a squatter) gets no handshake done, so no parameters are taken from it
    and no trajectory is sent to it."""
    key = new_run_key()
    squatter = SecureContext(new_run_key(), "curve", server=True)
    actor = _client(key, "curve")
    try:
        squatter.gatekeeper.handshake = Handshake(key, "curve")  # even admitting the actor's key
        pub = ParamPublisher(new_run_key(), ctx=squatter.ctx, handshake=squatter.handshake)
        sub = ParamSubscriber(key, pub.endpoint, TREE, ctx=actor.ctx, handshake=actor.handshake)
        rx = TrajectoryReceiver(key, TREE, ctx=squatter.ctx, handshake=squatter.handshake)
        tx = TrajectorySender(
            key,
            rx.endpoint,
            sender="actor-0",
            to=rx.address,
            ctx=actor.ctx,
            handshake=actor.handshake,
        )
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            pub.publish(1, TREE)
            assert sub.latest(20) is None
        tx.send(TREE, 1, timeout_ms=0)
        assert rx.recv(500) is None and rx.accepted == 0
        assert sub.accepted == 0 and not sub.rejected  # not even a frame to reject
    finally:
        actor.close()
        squatter.close()


def test_oversized_subscription_disconnects_the_subscriber():
    key = new_run_key()
    server = SecureContext(key, "plain", server=True)
    client = _client(key)
    try:
        pub = ParamPublisher(key, ctx=server.ctx, handshake=server.handshake)
        normal = ParamSubscriber(
            key, pub.endpoint, TREE, ctx=client.ctx, handshake=client.handshake
        )
        greedy = ParamSubscriber(
            key, pub.endpoint, TREE, ctx=client.ctx, handshake=client.handshake
        )
        greedy.socket.setsockopt(zmq.SUBSCRIBE, bytes(64 << 10))  # over SUBSCRIPTION_MAX_BYTES
        got, deadline = None, time.monotonic() + WAIT_MS / 1000
        while got is None and time.monotonic() < deadline:
            pub.publish(1, TREE)
            got = normal.latest(20)
        assert got is not None and got[0] == 1
        for _ in range(20):
            pub.publish(2, TREE)
            assert greedy.latest(20) is None  # its connection was dropped, subscriptions and all
    finally:
        client.close()
        server.close()


# ----------------------------------------------------------------------------- replays
# What a holder of the PLAIN token (anyone who reads a network under `security: plain`) can
# do: record genuine messages off the wire and send them again, elsewhere or later. The
# messages are recorded here from real channels (this test holds the run key, as actors
# do); the attacker, a separate process, gets only the recorded bytes and the token.
TINY = ["num_actors=2", "num_envs=4", "rollout_len=8", "ppo.num_minibatches=1"]


def _tiny_tree(template):
    from tianjax.core.rollout import Episodes

    batch_t = template[0]
    T, B = batch_t.reward.shape
    batch = type(batch_t)(*[np.zeros(x.shape, x.dtype) for x in batch_t])
    return (
        batch,
        Episodes(np.zeros((T, B), bool), np.zeros((T, B), np.float32), np.zeros((T, B), np.int32)),
        np.asarray(0, np.int64),
    )


def _hex(frames) -> list[str]:
    return [bytes(f).hex() for f in frames]


def _record(key, socket_type: int, send) -> list[bytes]:
    """What a real channel puts on the wire: `send(endpoint)` makes a channel, which it
    returns, send one message to a tap (a PLAIN server admitting the run's token), whose
    frames are returned."""
    net = SecureContext(key, "plain", server=True)
    tap = net.ctx.socket(socket_type)
    tap.linger = 0
    net.handshake.server(tap)
    endpoint = f"tcp://127.0.0.1:{tap.bind_to_random_port('tcp://127.0.0.1')}"
    channel = None
    try:
        channel = send(endpoint)
        assert tap.poll(WAIT_MS), "nothing recorded"
        frames = tap.recv_multipart()
        return frames[1:] if socket_type == zmq.ROUTER else frames  # (a ROUTER's routing id)
    finally:
        if channel is not None:
            channel.close()
        tap.close(linger=0)
        net.close()


def _replayer(
    tmp_path: Path, socket: str, messages, *, endpoint: str = "", token: bytes = b""
) -> tuple:
    n = len(list(tmp_path.glob("replay-*.json")))
    spec = tmp_path / f"replay-{n}.json"
    out = tmp_path / f"replay-{n}.out"
    spec.write_text(
        json.dumps(
            {
                "socket": socket,
                "endpoint": endpoint,
                "token": token.decode(),
                "messages": [_hex(m) for m in messages],
                "endpoint_out": str(tmp_path / f"replay-{n}.endpoint"),
            }
        )
    )
    p = subprocess.Popen(
        [sys.executable, ATTACKER, "replay", str(spec), "20", str(out)],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
    )
    return p, out, tmp_path / f"replay-{n}.endpoint"


def _replay(tmp_path, learner, channel: str, messages, pumped=None) -> dict:
    """The attacker sends `messages` to `learner`'s `channel` port while it pumps, until it
    has processed them all (accepted or rejected); returns that channel's rejected counts."""
    rx = learner.traj_in if channel == "traj" else learner.control
    before = rx.accepted + sum(rx.rejected.values())
    p, out, _ = _replayer(
        tmp_path,
        "push" if channel == "traj" else "dealer",
        messages,
        endpoint=learner.endpoints[channel],
        token=learner.net.handshake._token,
    )
    try:
        deadline = time.monotonic() + 30
        while rx.accepted + sum(rx.rejected.values()) < before + len(messages):
            assert time.monotonic() < deadline, dict(rx.rejected)
            learner.pump(10)
        assert p.wait(30) == 0 and json.loads(out.read_text())["sent"] == len(messages)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return rx.rejected


@pytest.fixture
def own_incarnations(monkeypatch):
    """Each Learner made here its own incarnation, as each learner process has."""
    import secrets

    import tianjax.runtime.learner.io as learner_io

    monkeypatch.setattr(learner_io, "process_incarnation", lambda: secrets.token_hex(8))


def test_recorded_register_and_trajectories_are_refused_by_a_restarted_learner_and_another(
    tmp_path, own_incarnations
):
    from tianjax.config import load_config
    from tianjax.launch.ports import HeldPorts
    from tianjax.runtime.learner.learner import Learner
    from tianjax.transport.channels import ControlClient

    config = load_config(ASYNC_CFG, TINY)
    key = new_run_key()
    shake = Handshake(key, "plain")
    ports = HeldPorts("127.0.0.1", "tcp")
    learners = []

    def learner(**kw):
        learners.append(Learner(config, key, **kw))
        return learners[-1]

    try:
        first = learner(
            endpoints=ports.endpoints, listen_fds={k: os.dup(v) for k, v in ports.fds.items()}
        )
        tree = _tiny_tree(first.template)

        # actor-0's register and first trajectory for this learner incarnation, off the wire
        def send_register(ep):
            ch = ControlClient(
                key, ep, identity="actor-0", to=first.address, handshake=shake, incarnation="a" * 16
            )
            assert ch.send({"type": "register", "actor": 0, "pid": 1})
            return ch

        def send_traj(ep):
            ch = TrajectorySender(
                key, ep, sender="actor-0", to=first.address, handshake=shake, incarnation="a" * 16
            )
            assert ch.send(tree, 0, timeout_ms=WAIT_MS)
            return ch

        register, traj = _record(key, zmq.ROUTER, send_register), _record(key, zmq.PULL, send_traj)
        # genuine: the learner they were for takes each once, and refuses it again
        assert dict(_replay(tmp_path, first, "control", [register, register])) == {"replay": 1}
        assert dict(_replay(tmp_path, first, "traj", [traj, traj])) == {"replay": 1}
        assert b"actor-0" in first.actors and first.traj_in.accepted == 1
        first.close()

        # the learner restarts on the held ports (same key, a fresh guard): nothing recorded
        # before is taken, neither the register nor the trajectories
        restarted = learner(
            endpoints=ports.endpoints, listen_fds={k: os.dup(v) for k, v in ports.fds.items()}
        )
        assert restarted.address != first.address
        assert dict(_replay(tmp_path, restarted, "control", [register])) == {"old_incarnation": 1}
        assert dict(_replay(tmp_path, restarted, "traj", [traj, traj])) == {"old_incarnation": 2}
        # nor by another learner of the run (a multi-host run's other process, same key;
        # made in this process it has the same name, learner-0, so its reason is that of an
        # earlier incarnation; one named learner-1 refuses it as "recipient", test_channels)
        other = learner()
        assert dict(_replay(tmp_path, other, "control", [register])) == {"old_incarnation": 1}
        assert dict(_replay(tmp_path, other, "traj", [traj])) == {"old_incarnation": 1}
        for lr, refused in ((restarted, {"old_incarnation": 3}), (other, {"old_incarnation": 2})):
            assert lr.actors == {} and lr.traj_in.accepted == 0 and lr.control.accepted == 0
            assert not lr.pool and lr.env_steps == 0 and lr.measures.produced == 0
            summary = lr.stats.summary(time.perf_counter(), 1.0)
            assert summary["rejected_by_reason"] == refused
    finally:
        for lr in learners[1:]:
            lr.close()
        ports.close()


def test_learner_control_is_refused_reflected_back_and_by_another_actor(tmp_path, own_incarnations):
    from tianjax.config import load_config
    from tianjax.runtime.learner.learner import Learner
    from tianjax.transport.channels import ControlClient
    from tianjax.transport.codec import decode_json

    config = load_config(ASYNC_CFG, TINY)
    key = new_run_key()
    lr = Learner(config, key)
    client = SecureContext(key, "plain", server=False)
    net = dict(ctx=client.ctx, handshake=client.handshake)
    p = None
    try:
        a = ControlClient(
            key,
            lr.endpoints["control"],
            identity="actor-0",
            to=lr.address,
            incarnation="a" * 16,
            **net,
        )
        assert a.send({"type": "register", "actor": 0, "pid": 1})
        deadline = time.monotonic() + 30
        while not a.socket.poll(10):  # the learner answers with credits
            assert time.monotonic() < deadline
            lr.pump(10)
        credit = a.socket.recv_multipart()  # recorded off actor-0's connection
        assert (
            decode_json(
                credit, auth=lr.control._auth, kind="ctrl.down", max_bytes=1 << 16, to=a.address
            ).body["type"]
            == "credit"
        )
        # reflected back to the learner: the wrong direction
        assert dict(_replay(tmp_path, lr, "control", [credit])) == {"kind": 1}
        assert lr.control.accepted == 1  # actor-0's register only
        # handed to actor-1 by a peer it connects to (on a network: anyone on the path)
        p, out, endpoint_file = _replayer(tmp_path, "router", [credit, credit])
        deadline = time.monotonic() + 30
        while not endpoint_file.exists():
            assert time.monotonic() < deadline and p.poll() is None
            time.sleep(0.05)
        b = ControlClient(
            key,
            endpoint_file.read_text(),
            identity="actor-1",
            to=lr.address,
            incarnation="b" * 16,
            **net,
        )
        assert b.send({"type": "heartbeat", "actor": 1})
        assert p.wait(30) == 0 and json.loads(out.read_text())["sent"] == 2
        deadline = time.monotonic() + 10
        while sum(b.rejected.values()) < 2:
            assert time.monotonic() < deadline, dict(b.rejected)
            assert b.recv(50) is None
        assert dict(b.rejected) == {"recipient": 2} and b.accepted == 0
        # and actor-0 after a restart (a new incarnation of the same actor) refuses it too
        a2 = ControlClient(
            key,
            endpoint_file.read_text(),
            identity="actor-0",
            to=lr.address,
            incarnation="c" * 16,
            **net,
        )
        from tianjax.transport.codec import CodecError

        with pytest.raises(CodecError) as e:
            decode_json(
                credit, auth=lr.control._auth, kind="ctrl.down", max_bytes=1 << 16, to=a2.address
            )
        assert e.value.reason == "old_incarnation"
    finally:
        if p is not None and p.poll() is None:
            p.kill()
            p.wait()
        client.close()
        lr.close()


def test_a_flood_of_bad_messages_neither_holds_the_learner_nor_grows_it(tmp_path):
    """A holder of the PLAIN token floods both ports with messages that fail their checks
    (unsigned, of 64 small frames each, and tiny ones). Each receive handles a bounded
    number of them, so the learner's loop and its receiver thread stay responsive: every
    pump returns, the receiver stops when told, and memory stays bounded (the high-water
    marks count whole messages, and every one is small)."""
    from tianjax.config import load_config
    from tianjax.runtime.learner.learner import Learner

    lr = Learner(load_config(ASYNC_CFG, TINY), new_run_key())
    out = tmp_path / "badflood.json"
    env = dict(os.environ, HOSTILE_PLAIN_TOKEN=lr.net.handshake._token.decode())
    p = subprocess.Popen(
        [sys.executable, ATTACKER, "badflood", json.dumps(lr.endpoints), "8", str(out)],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    me = psutil.Process()
    try:
        deadline = time.monotonic() + 30
        while sum(lr.control.rejected.values()) < 1000 or sum(lr.traj_in.rejected.values()) < 1000:
            assert time.monotonic() < deadline and p.poll() is None, (
                lr.control.rejected,
                lr.traj_in.rejected,
            )
            lr.pump(50)
        rss0, peak, longest, stopped = me.memory_info().rss, 0, 0.0, None
        while p.poll() is None:
            t = time.monotonic()
            lr.pump(50)
            longest = max(longest, time.monotonic() - t)
            peak = max(peak, me.memory_info().rss)
            if stopped is None and time.monotonic() > deadline - 25:  # mid-flood
                stopped = lr.rx.stop()  # the receiver thread sees its stop however much arrives
                lr.rx.start()
        assert p.wait(30) == 0 and json.loads(out.read_text())["sent"] > 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        lr.close()
    print(
        f"bad-message flood: {sum(lr.control.rejected.values())} control and "
        f"{sum(lr.traj_in.rejected.values())} trajectory messages rejected; longest pump {longest:.2f} s, "
        f"RSS {rss0 / 2**20:.0f} -> peak {peak / 2**20:.0f} MiB"
    )
    assert stopped is True
    assert longest < 5.0  # (a pump waits 50 ms; the bound is for a loaded machine)
    assert peak - rss0 < 128 << 20
    assert lr.traj_in.accepted == 0 and lr.control.accepted == 0 and not lr.pool


# ----------------------------------------------------------------------------- connection limit
HELD_S = 1.0  # a connection open this long was not refused: the limit ends one within a moment


def _connections(ports: dict) -> dict:
    """port name -> the set of (local, remote) of the tcp connections from 127.0.0.1 that
    this process holds on that port (accepted: one in the listen backlog is not held).
    Read off its own descriptors: /proc/net/tcp lists every connection of the machine,
    and after a while of this attack, tens of thousands of closed ones."""
    from tianjax.transport.connections import _captured

    by_port = {port: name for name, port in ports.items()}
    out: dict = {name: set() for name in ports}
    for fd in os.listdir("/proc/self/fd"):
        with _captured(int(fd)) as sock:
            try:
                local, remote = sock.getsockname()[:2], sock.getpeername()[:2]
            except (AttributeError, OSError):  # not a tcp socket (None), or not connected
                continue
        if local[1] in by_port and remote[0] == "127.0.0.1":
            out[by_port[local[1]]].add((local, remote))
    return out


def test_one_host_never_holds_more_than_its_limit_of_connections(tmp_path):
    """runtime.max_connections_per_host: a separate process holding the PLAIN token (what
    an observer of a network under `plain` holds) opens as many connections as it can to
    each of a learner's three ports, ZeroMQ sockets that pass the handshake and would
    stay, and raw silent ones. From 127.0.0.1 the learner holds at most the limit on each
    socket (one over it lives only until the limit's thread ends it), counts each it
    ended in summary.json's handshakes_refused, and once the attacker is gone an actor
    connects to all three sockets and gets its messages through."""
    from tianjax.config import load_config
    from tianjax.core.types import ParamsMessage
    from tianjax.runtime.learner.learner import Learner
    from tianjax.transport.channels import ControlClient
    from tianjax.transport.connections import PER_HOST_LIMIT

    limit, per_kind = 3, 12
    key = new_run_key()
    lr = Learner(load_config(ASYNC_CFG, [*TINY, f"runtime.max_connections_per_host={limit}"]), key)
    ports = {name: int(e.rsplit(":", 1)[1]) for name, e in lr.endpoints.items()}
    out = tmp_path / "hold.json"
    env = dict(os.environ, HOSTILE_PLAIN_TOKEN=lr.net.handshake._token.decode())
    p = subprocess.Popen(
        [sys.executable, ATTACKER, "hold", json.dumps(lr.endpoints), "8", str(out), str(per_kind)],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    first_seen: dict = {}
    held_max = dict.fromkeys(ports, 0)
    open_max = dict.fromkeys(ports, 0)
    client = None
    try:
        while p.poll() is None:
            now = time.monotonic()
            conns = _connections(ports)
            live = set().union(*conns.values())
            first_seen = {c: first_seen.get(c, now) for c in live}
            for name, cs in conns.items():
                open_max[name] = max(open_max[name], len(cs))
                held_max[name] = max(held_max[name], sum(now - first_seen[c] >= HELD_S for c in cs))
            lr.pump(20)
        assert p.wait(30) == 0
        report = json.loads(out.read_text())
        refused = lr.net.refused[PER_HOST_LIMIT]
        print(
            f"connection limit {limit}: held at most {held_max}, open at a sample at most {open_max}; "
            f"{refused} connections ended over the limit; attacker {report}"
        )
        assert held_max == dict.fromkeys(ports, limit), held_max  # full, and never more
        assert report["raw_closed_by_learner"] > 0 and refused > 0
        assert (
            lr.stats.summary(time.perf_counter(), 1.0)["handshakes_refused"][PER_HOST_LIMIT]
            >= refused
        )

        # the attacker is gone: its slots are free again, on every socket
        client = SecureContext(key, "plain", server=False)
        net = dict(ctx=client.ctx, handshake=client.handshake)
        control = ControlClient(
            key, lr.endpoints["control"], identity="actor-0", to=lr.address, **net
        )
        traj = TrajectorySender(key, lr.endpoints["traj"], sender="actor-0", to=lr.address, **net)
        template = ParamsMessage(jax.tree.map(np.asarray, lr.state.params), np.zeros((), np.int64))
        sub = ParamSubscriber(key, lr.endpoints["params"], template, **net)
        assert control.send({"type": "register", "actor": 0, "pid": os.getpid()})
        assert traj.send(_tiny_tree(lr.template), 0, timeout_ms=WAIT_MS)
        got, deadline = None, time.monotonic() + 30
        while b"actor-0" not in lr.actors or lr.traj_in.accepted == 0 or got is None:
            assert time.monotonic() < deadline, (
                lr.actors,
                lr.traj_in.accepted,
                got,
                dict(lr.net.refused),
            )
            lr.pump(20)
            lr.publish()
            got = got or sub.latest(20)
        assert got[0] == lr.state_version
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        if client is not None:
            client.close()
        lr.close()


# ----------------------------------------------------------------------------- whole runs
class _Run:
    """`tianjax train` as a subprocess, with its resource use sampled."""

    def __init__(self, tmp_path: Path, *overrides: str):
        self.run_dir = tmp_path / "run"
        self.tmp = tmp_path
        env = dict(
            os.environ,
            JAX_PLATFORMS="cpu",
            PYTHONUNBUFFERED="1",
            PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        )
        self.err = open(tmp_path / "launcher.err", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tianjax.cli",
                "train",
                ASYNC_CFG,
                f"run_dir={self.run_dir}",
                *overrides,
                "--no-progress",
            ],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=self.err,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.ps = psutil.Process(self.proc.pid)
        self.attackers: list[subprocess.Popen] = []

    def actor_endpoints(self, timeout: float = 120.0) -> dict:
        """What any local user can read: an actor process's command line."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.stderr()
            for p in self.ps.children(recursive=True):
                try:
                    cmd = p.cmdline()
                except psutil.Error:
                    continue
                if "--endpoints-json" in cmd and "actor" in cmd:
                    return json.loads(cmd[cmd.index("--endpoints-json") + 1])
            time.sleep(0.1)
        raise AssertionError("no actor process")

    def updates(self) -> int:
        path = self.run_dir / "metrics.jsonl"
        if not path.exists():
            return 0
        lines = [line for line in path.read_text().splitlines() if line.strip()]
        try:
            return json.loads(lines[-1]).get("updates", 0) if lines else 0
        except ValueError:
            return 0

    def wait_updates(self, n: int, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while self.updates() < n:
            assert self.proc.poll() is None, self.stderr()
            assert time.monotonic() < deadline, f"no {n} updates; " + self.stderr()
            time.sleep(0.2)

    def attack(
        self, kind: str, endpoints: dict, seconds: float, extra: int = 0, env: dict | None = None
    ) -> Path:
        out = self.tmp / f"{kind}-{len(self.attackers)}.json"
        p = subprocess.Popen(
            [
                sys.executable,
                ATTACKER,
                kind,
                json.dumps(endpoints),
                str(seconds),
                str(out),
                str(extra),
            ],
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=dict(os.environ, **(env or {})),
        )
        self.attackers.append(p)
        return out

    def sample(self) -> tuple[int, int]:
        return self.ps.memory_info().rss, self.ps.num_fds()

    def sample_until_attackers_end(self, timeout: float = 300.0) -> tuple[int, int]:
        """Peak (RSS, descriptors) of the learner while the attackers run."""
        peak_rss = peak_fds = 0
        deadline = time.monotonic() + timeout
        while any(a.poll() is None for a in self.attackers):
            assert time.monotonic() < deadline, "the attackers did not finish"
            if self.proc.poll() is None:
                rss, fds = self.sample()
                peak_rss, peak_fds = max(peak_rss, rss), max(peak_fds, fds)
            time.sleep(0.1)
        assert all(a.returncode == 0 for a in self.attackers)
        return peak_rss, peak_fds

    def plain_token(self) -> str:
        """The run's PLAIN token, what an observer of its network reads off any handshake
        under `plain`. Read here from an actor's starting environment (its own user may
        read /proc/PID/environ), and passed to an attacker as the token only: the
        attacker never holds the run key."""
        from tianjax.transport.auth import KEY_ENV, RunKey

        for p in self.ps.children(recursive=True):
            try:
                env = p.environ()
            except psutil.Error:
                continue
            if env.get(KEY_ENV):
                return Handshake(RunKey(bytes.fromhex(env[KEY_ENV])), "plain")._token.decode()
        raise AssertionError("no process of the run holds the run key")

    def processes(self) -> list[psutil.Process]:
        """The launcher and every process it started."""
        return [self.ps, *self.ps.children(recursive=True)]

    def strays(self) -> list[psutil.Process]:
        """Processes still running whose command line names this run's directory (any
        the launcher started, even one started after a look at its children)."""
        out = []
        for p in psutil.process_iter(["cmdline"]):
            if (
                p.pid != os.getpid()
                and str(self.run_dir) in " ".join(p.info["cmdline"] or ())
                and not _exited(p)
            ):
                out.append(p)
        return out

    def wait(self, timeout: float = 300.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError("the run did not end; " + self.stderr()) from None

    def summary(self) -> dict:
        return json.loads((self.run_dir / "summary.json").read_text())

    def stderr(self) -> str:
        self.err.flush()
        return (self.tmp / "launcher.err").read_text(errors="replace")[-3000:]

    def close(self) -> None:
        for p in [self.proc, *self.attackers]:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass
        self.err.close()


@pytest.fixture
def run_factory(tmp_path):
    made = []

    def make(*overrides):
        r = _Run(tmp_path, *overrides)
        made.append(r)
        return r

    try:
        yield make
    finally:
        for r in made:
            r.close()


@pytest.mark.slow
def test_run_reaches_target_under_connection_flood_oversized_frames_and_subscriptions(run_factory):
    run = run_factory("checkpoint.every=40")
    endpoints = run.actor_endpoints()
    run.wait_updates(5)  # compiled and learning: what it holds now is its working size
    rss0, fds0 = run.sample()
    seconds, held = 12.0, 1000
    flood = run.attack("flood", endpoints, seconds, held)
    frames = run.attack("frames", endpoints, seconds)
    subs = run.attack("subscribe", endpoints, seconds, 1000)
    peak_rss, peak_fds = run.sample_until_attackers_end()
    assert run.wait() == 0, run.stderr()

    s = run.summary()
    assert s["convergence_time_s"] is not None, s  # reached its target (475)
    assert "Traceback" not in run.stderr()
    assert ckpt.has_checkpoint(str(run.run_dir))  # checkpoints went on under the flood
    assert sum(s["handshakes_refused"].values()) > 0 and s["rejected_messages"] == 0
    f = json.loads(flood.read_text())
    print(
        f"hostile peers: RSS {rss0 / 2**20:.0f} -> peak {peak_rss / 2**20:.0f} MiB, descriptors "
        f"{fds0} -> peak {peak_fds}"
    )
    assert f["closed_by_learner"] >= held  # every connection is closed by the learner...
    # ...long before the attack ends, silent ones included (a NULL-mechanism server, or
    # libzmq's default 30 s handshake limit, would have let them stay to the end)
    print(f"hostile peers: flood {f}")
    assert f["longest_held_s"] < seconds / 2, f
    assert f["oldest_held_at_end_s"] < seconds / 2, f
    assert json.loads(frames.read_text())["frames_sent"] > 0
    assert json.loads(subs.read_text())["received"] == {"null": 0, "plain": 0, "curve": 0}
    assert peak_rss - rss0 < RSS_GROWTH_BOUND, (peak_rss - rss0) / 2**20
    # its own descriptors, plus at most the attacker's connections in flight
    assert peak_fds <= fds0 + held + 64, (fds0, peak_fds)


@pytest.mark.slow
def test_under_curve_a_subscriber_without_the_key_reads_nothing(run_factory):
    run = run_factory("runtime.security=curve")
    endpoints = run.actor_endpoints()
    run.wait_updates(5)
    out = run.attack("subscribe", endpoints, 8.0, 10)
    run.sample_until_attackers_end()
    assert run.wait() == 0, run.stderr()
    s = run.summary()
    assert s["convergence_time_s"] is not None, s  # reached its target (475)
    assert json.loads(out.read_text())["received"] == {"null": 0, "plain": 0, "curve": 0}


@pytest.mark.slow
def test_squatter_never_gets_a_restarted_learners_ports(run_factory):
    # a budget no machine spends during the 20 s attack: the launcher frees the ports as the
    # run ends, a moment before its process exits, and a squatter may then bind them (after
    # the run, they are anyone's); 200k and then 500k steps ended inside the attack. The test
    # stops the run itself once the attack is over.
    run = run_factory(
        "runtime.restart_learner=true", "checkpoint.every=20", "total_env_steps=5000000"
    )
    endpoints = run.actor_endpoints()
    run.wait_updates(30)
    # binds each port the moment it is free, while the run lasts (after it, they are anyone's)
    squat = run.attack("squat", endpoints, 20.0, run.proc.pid)
    time.sleep(0.5)
    learner = next(
        p
        for p in run.ps.children(recursive=True)
        if "tianjax.launch.role" in p.cmdline() and "learner" in p.cmdline()
    )
    learner.send_signal(signal.SIGKILL)
    run.sample_until_attackers_end()
    assert run.proc.poll() is None, "the run ended during the attack; " + run.stderr()
    run.proc.send_signal(signal.SIGTERM)
    assert run.wait() == 130, run.stderr()  # the CLI's stop by signal
    s = run.summary()
    assert s["learner_restarts"] == 1 and s["convergence_time_s"] is not None, s
    report = json.loads(squat.read_text())
    assert report == {"bound": [], "connections": 0, "bytes": 0}, report


def _exited(p: psutil.Process) -> bool:
    try:
        return p.status() == psutil.STATUS_ZOMBIE  # (exited; its parent has not reaped it yet)
    except psutil.NoSuchProcess:
        return True


@pytest.mark.slow
def test_run_reaches_target_under_a_token_holders_flood_of_bad_messages(run_factory):
    """Separate processes holding the PLAIN token (not the run key) flood the trajectory
    and control ports with messages that fail their checks (64 small frames, and tiny
    ones) from the moment the run is learning until it ends: the run reaches its target,
    the learner's memory stays bounded, and every rejection is counted by reason."""
    from tianjax.transport.codec import REASONS

    run = run_factory()
    endpoints = run.actor_endpoints()
    token = run.plain_token()
    run.wait_updates(5)  # compiled and learning: what it holds now is its working size
    rss0, _ = run.sample()
    floods = [
        run.attack("badflood", endpoints, 600.0, run.proc.pid, env={"HOSTILE_PLAIN_TOKEN": token})
        for _ in range(FLOODERS)
    ]
    peak_rss, _ = run.sample_until_attackers_end(timeout=600.0)
    assert run.wait() == 0, run.stderr()
    s = run.summary()
    sent = sum(json.loads(f.read_text())["sent"] for f in floods)
    print(
        f"token-holder flood: {sent} messages sent, {s['rejected_messages']} rejected "
        f"{s['rejected_by_reason']}; learner RSS {rss0 / 2**20:.0f} -> peak {peak_rss / 2**20:.0f} MiB; "
        f"convergence {s['convergence_time_s']} s"
    )
    assert s["convergence_time_s"] is not None, s  # reached its target (475)
    assert "Traceback" not in run.stderr()
    assert peak_rss - rss0 < RSS_GROWTH_BOUND, (peak_rss - rss0) / 2**20
    # counted by reason, every one a reason the codec names (none slipped through: an
    # accepted one would have been learned from, or crashed the role)
    by_reason = s["rejected_by_reason"]
    assert sent > 0 and by_reason and set(by_reason) <= set(REASONS), by_reason
    assert sum(by_reason.values()) == s["rejected_messages"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("to", ["group", "launcher"])
def test_sigterm_under_a_flood_of_bad_messages_ends_every_process_of_the_run(run_factory, to):
    """The same flood, and a SIGTERM once the run has made some updates: to the
    launcher's process group (a Ctrl-C in a terminal, `kill -TERM -PGID`) or to the
    launcher alone (`kill PID`). Every process of the run has exited within 10 s of it:
    no receive that misses its stop, no join without a bound (the launcher's stop of its
    actors and the final checkpoint included)."""
    run = run_factory("total_env_steps=5000000")  # a budget it does not spend here
    endpoints = run.actor_endpoints()
    token = run.plain_token()
    floods = [
        run.attack("badflood", endpoints, 600.0, run.proc.pid, env={"HOSTILE_PLAIN_TOKEN": token})
        for _ in range(FLOODERS)
    ]
    run.wait_updates(10)  # learning while flooded
    procs = run.processes()
    assert len(procs) >= 3, procs  # the launcher (the learner) and its two actors
    assert {p.pid for p in run.strays()} >= {p.pid for p in procs}  # (what finds a survivor, below)
    t0 = time.monotonic()
    if to == "group":
        os.killpg(run.proc.pid, signal.SIGTERM)
    else:
        run.proc.send_signal(signal.SIGTERM)
    took: dict = {}
    while len(took) < len(procs) and time.monotonic() - t0 < 60:
        run.proc.poll()  # (reaps the launcher)
        for p in procs:
            if p.pid not in took and _exited(p):
                took[p.pid] = time.monotonic() - t0
        time.sleep(0.02)
    survivors = [p for p in procs if p.pid not in took] + run.strays()
    slowest = max(took.values(), default=0.0)
    print(
        f"SIGTERM to the {to} under a bad-message flood: every process exited within {slowest:.2f} s "
        f"(each: {sorted(round(t, 2) for t in took.values())})"
    )
    assert not survivors and len(took) == len(procs), (survivors, took)
    assert slowest <= 10.0, took
    assert run.wait() == 130, run.stderr()  # the CLI's stop by signal
    assert "Traceback" not in run.stderr()
    s = run.summary()
    assert s["interrupted"] is True and s["rejected_messages"] > 0, s
    run.sample_until_attackers_end(timeout=60.0)  # the flood stops once the run is gone
    assert all(json.loads(f.read_text())["sent"] > 0 for f in floods)


def test_security_config_keys_are_checked():
    from tianjax.config import ConfigError, load_config

    config = load_config(
        ASYNC_CFG, ["runtime.security=curve", "runtime.allow_hosts=[10.0.0.5, '::1']"]
    )
    assert config.runtime.security == "curve" and config.runtime.allow_hosts == ("10.0.0.5", "::1")
    with pytest.raises(ConfigError, match=r"runtime.allow_hosts\[1\]"):
        load_config(ASYNC_CFG, ["runtime.allow_hosts=[10.0.0.5, host0]"])
    with pytest.raises(ConfigError, match="runtime.security"):
        load_config(ASYNC_CFG, ["runtime.security=tls"])
    with pytest.raises(ConfigError, match="runtime.io_threads"):
        load_config(ASYNC_CFG, ["runtime.io_threads=0"])
    # by default, room for every actor of the run on one host and some restarts; 0: none
    assert load_config(ASYNC_CFG, ["num_actors=5"]).max_connections_per_host == 5 + 8
    assert (
        load_config(ASYNC_CFG, ["runtime.max_connections_per_host=0"]).max_connections_per_host == 0
    )
    for bad in ("-1", "2.5", "many"):
        with pytest.raises(ConfigError, match="runtime.max_connections_per_host"):
            load_config(ASYNC_CFG, [f"runtime.max_connections_per_host={bad}"])
    unlimited = SecureContext(new_run_key(), "plain", server=True, max_connections_per_host=0)
    try:
        # no limit, but its watcher still caps each connection's TCP back-off
        assert unlimited.limit.max_per_host is None and unlimited.gatekeeper is not None
    finally:
        unlimited.close()


@pytest.mark.parametrize("transport", ["tcp", "ipc"])
def test_held_ports_are_served_by_each_learner_and_never_free(transport):
    """What a restarted learner relies on: the launcher's listening sockets serve one
    receiver after another, and between them nobody else can bind the address."""
    import socket
    import stat

    from tianjax.launch.ports import HeldPorts, PrivateDir

    key = new_run_key()
    private = PrivateDir()
    ports = HeldPorts("127.0.0.1", transport, private.path)
    server, client = SecureContext(key, "plain", server=True), _client(key)
    try:
        assert stat.S_IMODE(os.stat(private.path).st_mode) == 0o700
        endpoint = ports.endpoints["traj"]
        if transport == "ipc":
            assert endpoint == f"ipc://{private.path}/traj.ipc"
        # (every receiver this process makes has the same default address)
        tx = TrajectorySender(
            key,
            endpoint,
            sender="actor-0",
            to=address("learner", process_incarnation()),
            ctx=client.ctx,
            handshake=client.handshake,
        )
        for version in (1, 2):  # two learner incarnations on the same held socket
            # (each learner process gets its own copy of the descriptor: so does this one)
            rx = TrajectoryReceiver(
                key,
                TREE,
                endpoint=endpoint,
                use_fd=os.dup(ports.fds["traj"]),
                ctx=server.ctx,
                handshake=server.handshake,
            )
            # (a send racing the sender's noticing that the last receiver is gone is lost,
            # as with a dead learner: send until one arrives)
            msg, deadline = None, time.monotonic() + WAIT_MS / 1000
            while msg is None and time.monotonic() < deadline:
                tx.send(TREE, version, timeout_ms=100)
                msg = rx.recv(100)
            assert msg is not None and msg.version == version
            rx.close()
            if transport == "tcp":  # between incarnations, a squatter cannot bind the port
                host, port = endpoint[len("tcp://") :].rsplit(":", 1)
                with socket.socket() as squatter, pytest.raises(OSError):
                    squatter.bind((host, int(port)))
            else:
                assert os.path.exists(endpoint[len("ipc://") :])  # the path is the launcher's
    finally:
        client.close()
        server.close()
        ports.close()
        private.close()
    assert not os.path.exists(private.path)
