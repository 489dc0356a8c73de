"""Peers without the run key, over real sockets, cost a learner only a bounded amount.

The fast tests check each layer on its own with real channels: the handshake admits only
the run's credentials (PLAIN token under `mac`, derived CURVE keys under `curve`, and
the address allow-list), a client under `curve` will not talk to a server without the
run's key (a squatter), and an oversized subscription or frame disconnects its sender.

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
- a squatter waiting for a restarted learner's ports never gets them, nor any byte.
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

import numpy as np
import psutil
import pytest
import zmq

from tianjax.checkpoint import store as ckpt
from tianjax.transport.auth import new_run_key
from tianjax.transport.channels import ParamPublisher, ParamSubscriber, TrajectoryReceiver, TrajectorySender
from tianjax.transport.security import Handshake, SecureContext, resolve_security

REPO = Path(__file__).resolve().parents[2]
ASYNC_CFG = str(REPO / "configs" / "ppo_cartpole_async.yaml")
ATTACKER = str(REPO / "tests" / "transport" / "hostile_peer.py")
TREE = {"w": np.arange(12, dtype=np.float32)}
WAIT_MS = 5000
RSS_GROWTH_BOUND = 256 << 20


# ----------------------------------------------------------------------------- handshakes
@pytest.fixture
def server():
    """A server context with its gatekeeper (mac), closed after the test."""
    key = new_run_key()
    net = SecureContext(key, "mac", server=True)
    try:
        yield key, net
    finally:
        net.close()


def _client(key, security="mac"):
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
    mac = Handshake(key, "mac")
    assert mac.admits(b"PLAIN", [b"tianjax", mac._token]) is None
    assert mac.admits(b"PLAIN", [b"tianjax", Handshake(new_run_key(), "mac")._token]) == "credentials"
    assert mac.admits(b"NULL", []) == "mechanism"
    assert a.admits(b"CURVE", [zmq.utils.z85.decode(a.client_public)]) is None
    assert a.admits(b"CURVE", [zmq.utils.z85.decode(other.client_public)]) == "credentials"
    assert resolve_security(None, "127.0.0.1") == "mac" and resolve_security(None, "::1") == "mac"
    assert resolve_security(None, "0.0.0.0") == "curve" and resolve_security(None, "host0") == "curve"
    assert resolve_security("mac", "0.0.0.0") == "mac"


@pytest.mark.parametrize("security", ["mac", "curve"])
def test_only_the_runs_credentials_get_a_message_through(security):
    key = new_run_key()
    server = SecureContext(key, security, server=True)
    good, bad = _client(key, security), _client(new_run_key(), security)
    bare = zmq.Context()
    try:
        rx = TrajectoryReceiver(key, TREE, ctx=server.ctx, handshake=server.handshake)
        # another run's credentials, and none at all (NULL mechanism)
        # (kept referenced: a collected channel closes its socket, maybe before its handshake)
        others = [TrajectorySender(key, rx.endpoint, sender="x", ctx=bad.ctx, handshake=bad.handshake),
                  TrajectorySender(key, rx.endpoint, sender="y", ctx=bare)]
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
        tx = TrajectorySender(key, rx.endpoint, sender="actor-0", ctx=good.ctx, handshake=good.handshake)
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
    server = SecureContext(key, "mac", server=True, allow=("192.0.2.1",))
    client = _client(key)
    try:
        rx = TrajectoryReceiver(key, TREE, ctx=server.ctx, handshake=server.handshake)
        tx = TrajectorySender(key, rx.endpoint, sender="actor-0", ctx=client.ctx, handshake=client.handshake)
        tx.send(TREE, 1)
        assert rx.recv(1000) is None
        assert server.gatekeeper.refused["address"] >= 1 and server.gatekeeper.admitted == 0
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
        tx = TrajectorySender(key, rx.endpoint, sender="actor-0", ctx=actor.ctx, handshake=actor.handshake)
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
    server = SecureContext(key, "mac", server=True)
    client = _client(key)
    try:
        pub = ParamPublisher(key, ctx=server.ctx, handshake=server.handshake)
        normal = ParamSubscriber(key, pub.endpoint, TREE, ctx=client.ctx, handshake=client.handshake)
        greedy = ParamSubscriber(key, pub.endpoint, TREE, ctx=client.ctx, handshake=client.handshake)
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


# ----------------------------------------------------------------------------- whole runs
class _Run:
    """`tianjax train` as a subprocess, with its resource use sampled."""

    def __init__(self, tmp_path: Path, *overrides: str):
        self.run_dir = tmp_path / "run"
        self.tmp = tmp_path
        env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1",
                   PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.err = open(tmp_path / "launcher.err", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen([sys.executable, "-m", "tianjax.cli", "train", ASYNC_CFG,
                                      f"run_dir={self.run_dir}", *overrides, "--no-progress"],
                                     cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=self.err,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
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

    def attack(self, kind: str, endpoints: dict, seconds: float, extra: int = 0) -> Path:
        out = self.tmp / f"{kind}-{len(self.attackers)}.json"
        p = subprocess.Popen([sys.executable, ATTACKER, kind, json.dumps(endpoints), str(seconds), str(out),
                              str(extra)], cwd=REPO, stdin=subprocess.DEVNULL, start_new_session=True)
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
    print(f"hostile peers: RSS {rss0 / 2**20:.0f} -> peak {peak_rss / 2**20:.0f} MiB, descriptors "
          f"{fds0} -> peak {peak_fds}")
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
    run = run_factory("runtime.restart_learner=true", "checkpoint.every=20", "total_env_steps=5000000")
    endpoints = run.actor_endpoints()
    run.wait_updates(30)
    # binds each port the moment it is free, while the run lasts (after it, they are anyone's)
    squat = run.attack("squat", endpoints, 20.0, run.proc.pid)
    time.sleep(0.5)
    learner = next(p for p in run.ps.children(recursive=True)
                   if "tianjax.launch.role" in p.cmdline() and "learner" in p.cmdline())
    learner.send_signal(signal.SIGKILL)
    run.sample_until_attackers_end()
    assert run.proc.poll() is None, "the run ended during the attack; " + run.stderr()
    run.proc.send_signal(signal.SIGTERM)
    assert run.wait() == 130, run.stderr()  # the CLI's stop by signal
    s = run.summary()
    assert s["learner_restarts"] == 1 and s["convergence_time_s"] is not None, s
    report = json.loads(squat.read_text())
    assert report == {"bound": [], "connections": 0, "bytes": 0}, report


def test_security_config_keys_are_checked():
    from tianjax.config import ConfigError, load_config

    config = load_config(ASYNC_CFG, ["runtime.security=curve", "runtime.allow_hosts=[10.0.0.5, '::1']"])
    assert config.runtime.security == "curve" and config.runtime.allow_hosts == ("10.0.0.5", "::1")
    with pytest.raises(ConfigError, match=r"runtime.allow_hosts\[1\]"):
        load_config(ASYNC_CFG, ["runtime.allow_hosts=[10.0.0.5, host0]"])
    with pytest.raises(ConfigError, match="runtime.security"):
        load_config(ASYNC_CFG, ["runtime.security=tls"])
    with pytest.raises(ConfigError, match="runtime.io_threads"):
        load_config(ASYNC_CFG, ["runtime.io_threads=0"])


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
    server, client = SecureContext(key, "mac", server=True), _client(key)
    try:
        assert stat.S_IMODE(os.stat(private.path).st_mode) == 0o700
        endpoint = ports.endpoints["traj"]
        if transport == "ipc":
            assert endpoint == f"ipc://{private.path}/traj.ipc"
        tx = TrajectorySender(key, endpoint, sender="actor-0", ctx=client.ctx, handshake=client.handshake)
        for version in (1, 2):  # two learner incarnations on the same held socket
            # (each learner process gets its own copy of the descriptor: so does this one)
            rx = TrajectoryReceiver(key, TREE, endpoint=endpoint, use_fd=os.dup(ports.fds["traj"]),
                                    ctx=server.ctx, handshake=server.handshake)
            # (a send racing the sender's noticing that the last receiver is gone is lost,
            # as with a dead learner: send until one arrives)
            msg, deadline = None, time.monotonic() + WAIT_MS / 1000
            while msg is None and time.monotonic() < deadline:
                tx.send(TREE, version, timeout_ms=100)
                msg = rx.recv(100)
            assert msg is not None and msg.version == version
            rx.close()
            if transport == "tcp":  # between incarnations, a squatter cannot bind the port
                host, port = endpoint[len("tcp://"):].rsplit(":", 1)
                with socket.socket() as squatter, pytest.raises(OSError):
                    squatter.bind((host, int(port)))
            else:
                assert os.path.exists(endpoint[len("ipc://"):])  # the path is the launcher's
    finally:
        client.close()
        server.close()
        ports.close()
        private.close()
    assert not os.path.exists(private.path)
