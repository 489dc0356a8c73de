"""The control channel across a cut link, with a real learner-side `ControlServer` (its
context's connection limit caps each connection's retransmission back-off:
tianjax.transport.retransmit) and an actor-side `ControlClient` on two namespace hosts.
The learner sends a credit-like message every 50 ms; after a 20 s cut of the actor's
host, the first message sent after the heal reaches the actor within 3 s of it, and none
sent during the cut is lost.

Without the cap, what the learner sent during the cut waits in TCP's back-off: its
retries come 0.2, 0.6, 1.4, ... 12.6, 25.4 s after the cut, so the connection moves again
about 5 s after the heal, and everything sent meanwhile queues behind it. (The actor's
own sends fail locally while its cable is out, and the kernel retries them every half
second: the learner's side is the one that waits.)
"""

from __future__ import annotations

import os
import sys
import textwrap
import time

import pytest

from tianjax.transport.retransmit import cap_backoff

from .conftest import REPO, wait_for_lines

PORT = 7111
CUT_S = 20.0
# the learner's side: binds on its host's address with the learner's context (plain
# security, a connection limit), and once the actor has said hello sends it
# {"type": "tick", "n": n, "t": time.time()} every 50 ms, printing how its connection's
# back-off was set ("backoff True 1"), until killed
SERVER = textwrap.dedent("""
    import os, sys, time
    from tianjax.transport.control import ControlServer
    from tianjax.transport.security import SecureContext
    key = bytes.fromhex(os.environ["KEY"])
    net = SecureContext(key, "plain", server=True, max_connections_per_host=4)
    srv = ControlServer(key, endpoint=f"tcp://{sys.argv[1]}:{sys.argv[2]}", ctx=net.ctx,
                        handshake=net.handshake, limit=net.limit, incarnation="0")
    peer, n, told = None, 0, False
    while True:
        got = srv.poll(50)
        if got is not None:
            peer = got[0]
        if peer is not None:
            srv.send(peer, {"type": "tick", "n": n, "t": time.time()})
            n += 1
        if not told and net.limit.backoff:
            print("backoff", *(f"{k} {v}" for k, v in net.limit.backoff.items()), flush=True)
            told = True
""")
# the actor's side: says hello, then prints "<time received> <n> <time sent>" per message
CLIENT = textwrap.dedent("""
    import os, sys, time
    from tianjax.transport.control import ControlClient
    from tianjax.transport.security import SecureContext
    key = bytes.fromhex(os.environ["KEY"])
    net = SecureContext(key, "plain", server=False)
    cli = ControlClient(key, f"tcp://{sys.argv[1]}:{sys.argv[2]}", identity="actor-0",
                        to="learner@0", ctx=net.ctx, handshake=net.handshake)
    cli.send({"type": "register"})
    while True:
        msg = cli.recv(100)
        if msg is not None:
            print(f"{time.time():.3f} {msg['n']} {msg['t']:.3f}", flush=True)
""")


def _supported() -> bool:
    import socket

    with socket.socket() as s:
        return cap_backoff(s)


def _received(path: str) -> list[tuple[float, int, float]]:
    with open(path) as f:
        rows = [line.split() for line in f if line.strip()]
    return [(float(t), int(n), float(sent)) for t, n, sent in rows]


@pytest.mark.slow
@pytest.mark.skipif(not _supported(), reason="the kernel has no TCP_RTO_MAX_MS (Linux < 6.15)")
def test_credits_reach_an_actor_within_seconds_of_a_cut_link_healing(make_cluster, tmp_path):
    cluster = make_cluster(["learner", "actor"])
    env = {**os.environ, "KEY": os.urandom(32).hex(), "PYTHONPATH": str(REPO)}
    out, server_out = str(tmp_path / "client.out"), str(tmp_path / "server.out")
    addr = cluster.addr("learner")
    with open(server_out, "w") as f:
        procs = [
            cluster.run(
                "learner", [sys.executable, "-c", SERVER, addr, str(PORT)], env=env, stdout=f
            )
        ]
    with open(out, "w") as f:
        procs.append(
            cluster.run("actor", [sys.executable, "-c", CLIENT, addr, str(PORT)], env=env, stdout=f)
        )
    try:
        wait_for_lines(lambda: len(_received(out)), 20, procs, "no messages reached the actor")
        with open(server_out) as f:
            assert f.read().split() == ["backoff", "True", "1"]  # its one connection, capped
        cluster.cut("actor")
        time.sleep(CUT_S)
        cluster.heal("actor")
        healed = time.time()
        deadline = time.monotonic() + 15
        while not [n for _, n, sent in _received(out) if sent > healed]:
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        rows = _received(out)
        after = [(t, n) for t, n, sent in rows if sent > healed]
        assert after, "nothing sent after the heal reached the actor within 15 s of it"
        waited = after[0][0] - healed
        assert waited < 3.0, f"the first message sent after the heal took {waited:.1f} s"
        # nothing was lost: the connection was never closed, only slow
        ns = [n for _, n, _ in rows]
        assert ns == list(range(ns[0], ns[0] + len(ns)))
    finally:
        for p in procs:
            p.kill()
            p.wait()
