"""The control channel across a cut link, with a real learner-side `ControlServer` and an
actor-side `ControlClient`, each with its role's context (whose connection watcher caps
each connection's retransmission back-off: tianjax.transport.retransmit), on two
namespace hosts. One side sends a message every 50 ms; the other side's host is cut for
20 s; the first message sent after the heal arrives within 3 s of it, and none sent
during the cut is lost. Both ways: the learner's credits to a cut actor (the accepted
connection's back-off), and an actor's messages to a cut learner (the connection the
actor made).

Without the cap, what the sender sent during the cut waits in TCP's back-off: its
retries come 0.2, 0.6, 1.4, ... 12.6, 25.4 s after the cut, so the connection moves again
about 5 s after the heal, and everything sent meanwhile queues behind it. (The cut
side's own sends fail locally while its cable is out, and the kernel retries them every
half second: the side that waits is the one whose peer was cut.)
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
# what both sides do, by argv[3]: "send" (once the peer is known, {"type": "tick", "n": n,
# "t": time.time()} every 50 ms) or "recv" (prints "<time received> <n> <time sent>" per
# tick); either prints how its context's watcher set its connection's back-off
# ("backoff True 1") once it has; until killed
_REPORT = """
        if not told and net.limit.backoff:
            print("backoff", *(f"{k} {v}" for k, v in net.limit.backoff.items()), flush=True)
            told = True
"""  # (the last lines of the loop of either)
# the learner's side: binds on its host's address with the learner's context (plain
# security, a connection limit); it knows the actor once it has said hello
SERVER = textwrap.dedent(
    """
    import os, sys, time
    from tianjax.transport.control import ControlServer
    from tianjax.transport.security import SecureContext
    key = bytes.fromhex(os.environ["KEY"])
    net = SecureContext(key, "plain", server=True, max_connections_per_host=4)
    srv = ControlServer(key, endpoint=f"tcp://{sys.argv[1]}:{sys.argv[2]}", ctx=net.ctx,
                        handshake=net.handshake, limit=net.limit, incarnation="0")
    peer, n, told, sending = None, 0, False, sys.argv[3] == "send"
    while True:
        got = srv.poll(50)
        if got is not None:
            peer, msg = got
            if msg["type"] == "tick":
                print(f"{time.time():.3f} {msg['n']} {msg['t']:.3f}", flush=True)
        if sending and peer is not None:
            srv.send(peer, {"type": "tick", "n": n, "t": time.time()})
            n += 1
"""
    + _REPORT
)
# the actor's side: its context and channel as the actor makes them; says hello first
CLIENT = textwrap.dedent(
    """
    import os, sys, time
    from tianjax.transport.control import ControlClient
    from tianjax.transport.security import SecureContext
    key = bytes.fromhex(os.environ["KEY"])
    net = SecureContext(key, "plain", server=False)
    cli = ControlClient(key, f"tcp://{sys.argv[1]}:{sys.argv[2]}", identity="actor-0",
                        to="learner@0", ctx=net.ctx, handshake=net.handshake, limit=net.limit)
    cli.send({"type": "register"})
    n, told, sending = 0, False, sys.argv[3] == "send"
    while True:
        msg = cli.recv(50)
        if msg is not None and msg["type"] == "tick":
            print(f"{time.time():.3f} {msg['n']} {msg['t']:.3f}", flush=True)
        if sending:
            cli.send({"type": "tick", "n": n, "t": time.time()})
            n += 1
"""
    + _REPORT
)


def _supported() -> bool:
    import socket

    with socket.socket() as s:
        return cap_backoff(s)


def _received(path: str) -> list[tuple[float, int, float]]:
    with open(path) as f:
        rows = [line.split() for line in f if line.strip() and line[0].isdigit()]
    return [(float(t), int(n), float(sent)) for t, n, sent in rows]


@pytest.mark.slow
@pytest.mark.skipif(not _supported(), reason="the kernel has no TCP_RTO_MAX_MS (Linux < 6.15)")
@pytest.mark.parametrize(
    "sender, cut",
    [("learner", "actor"), ("actor", "learner")],
    ids=["credits-to-a-cut-actor", "actor-messages-to-a-cut-learner"],
)
def test_messages_arrive_within_seconds_of_a_cut_link_healing(make_cluster, tmp_path, sender, cut):
    cluster = make_cluster(["learner", "actor"])
    env = {**os.environ, "KEY": os.urandom(32).hex(), "PYTHONPATH": str(REPO)}
    outs = {role: str(tmp_path / f"{role}.out") for role in ("learner", "actor")}
    receiver = "actor" if sender == "learner" else "learner"
    addr = cluster.addr("learner")
    procs = []
    for role, script in (("learner", SERVER), ("actor", CLIENT)):
        mode = "send" if role == sender else "recv"
        with open(outs[role], "w") as f:
            procs.append(
                cluster.run(
                    role, [sys.executable, "-c", script, addr, str(PORT), mode], env=env, stdout=f
                )
            )
    out = outs[receiver]
    try:
        wait_for_lines(
            lambda: len(_received(out)), 20, procs, f"no messages reached the {receiver}"
        )
        with open(outs[sender]) as f:
            # the sender's one connection, capped
            assert [line.split() for line in f] == [["backoff", "True", "1"]]
        cluster.cut(cut)
        time.sleep(CUT_S)
        cluster.heal(cut)
        healed = time.time()
        deadline = time.monotonic() + 15
        while not [n for _, n, sent in _received(out) if sent > healed]:
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        rows = _received(out)
        after = [(t, n) for t, n, sent in rows if sent > healed]
        assert after, f"nothing sent after the heal reached the {receiver} within 15 s of it"
        waited = after[0][0] - healed
        assert waited < 3.0, f"the first message sent after the heal took {waited:.1f} s"
        # nothing was lost: the connection was never closed, only slow
        ns = [n for _, n, _ in rows]
        assert ns == list(range(ns[0], ns[0] + len(ns)))
    finally:
        for p in procs:
            p.kill()
            p.wait()
