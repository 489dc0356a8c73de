"""A peer without the run key, attacking a learner's ports: run as its own process by
tests/transport/test_hostile_peers.py (`python tests/transport/hostile_peer.py ATTACK ENDPOINTS_JSON SECONDS OUT`).

Attacks (each until SECONDS have passed, then a JSON report is written to OUT):

- flood: holds up to `--connections` TCP connections to every port, half of them silent
  and half opening the ZMTP 3.0 handshake as a NULL-mechanism peer (what any ZeroMQ
  socket without credentials does); reopens each one the learner closes. Reports how
  many were opened and the longest any stayed open.
- frames: ZeroMQ PUSH and DEALER sockets without credentials, and raw TCP peers that
  announce a 1 GiB frame, sending 64 MiB frames at the trajectory and control ports.
- subscribe: SUB sockets (no credentials, a guessed PLAIN token, a CURVE key pair of its
  own with a guessed server key) subscribing with 64 KiB topics to the parameter port;
  counts what they receive.
- squat: binds the given ports the moment they are free and records what arrives.
- hold: holds as many connections to every port as it can, `--connections` of each kind
  per port: ZeroMQ sockets with the PLAIN token (env HOSTILE_PLAIN_TOKEN: they pass the
  handshake and stay; libzmq reconnects one the learner ends, every 100 ms), and, from
  a moment later, raw silent TCP connections (reopened as the learner closes them).
  Reports how many raw ones it opened and the learner closed.
- badflood: with the PLAIN token (env HOSTILE_PLAIN_TOKEN, as read off a network under
  `security: plain`) but not the run key, floods the trajectory and control ports with
  messages that fail their checks: unsigned ones of 64 small frames (each under any
  frame cap), and tiny ones; until SECONDS have passed or the run (pid EXTRA, if given)
  has ended.
- replay: sends messages recorded off the wire, byte for byte, holding what an observer of
  a network under `security: plain` holds (the PLAIN token, never the run key): to a
  learner's port (`push`, `dealer`), or, as a peer an actor connects to (`router`), to the
  first peer that writes to it. ENDPOINTS_JSON is then the path of a JSON spec:
  {"socket", "endpoint" (push, dealer), "token", "messages": [[hex frame, ...], ...],
  "endpoint_out" (router: where the bound endpoint is written)}.
"""

from __future__ import annotations

import json
import os
import resource
import selectors
import socket
import sys
import time

import zmq

# ZMTP 3.0 greeting of a client with the NULL mechanism (RFC 23): signature, version 3.0,
# mechanism name padded to 20 bytes, as-server 0, 31 bytes of filler
GREETING = (
    b"\xff" + bytes(8) + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\0") + b"\x00" + bytes(31)
)
FRAME_MIB = 64


def _hostport(endpoint: str) -> tuple[str, int]:
    host, port = endpoint[len("tcp://") :].rsplit(":", 1)
    return host.strip("[]"), int(port)


def flood(endpoints: dict, seconds: float, connections: int) -> dict:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    targets = [_hostport(e) for e in endpoints.values()]
    sel = selectors.DefaultSelector()
    opened_at: dict[socket.socket, float] = {}
    # NOTE: a connection can wait in the kernel's listen backlog before the learner takes it
    # (and a descriptor with it); the learner's greeting marks that moment
    greeted_at: dict[socket.socket, float] = {}
    stats = {
        "opened": 0,
        "closed_by_learner": 0,
        "longest_open_s": 0.0,
        "longest_held_s": 0.0,
        "refused": 0,
    }
    end = time.monotonic() + seconds
    k = 0

    def open_one():
        nonlocal k
        host, port = targets[k % len(targets)]
        s = socket.socket()
        s.setblocking(True)
        s.settimeout(0.1)  # a full backlog must not stall the reading of closes below
        try:
            s.connect((host, port))
        except OSError:
            s.close()
            stats["refused"] += 1
            return
        if k % 2:
            try:
                s.sendall(GREETING)  # a NULL-mechanism ZeroMQ peer
            except OSError:
                pass
        s.setblocking(False)
        k += 1
        opened_at[s] = time.monotonic()
        sel.register(s, selectors.EVENT_READ)
        stats["opened"] += 1

    while time.monotonic() < end:
        for _ in range(min(20, connections - len(opened_at))):
            open_one()
        for key, _ in sel.select(timeout=0.05):
            s = key.fileobj
            try:
                data = s.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if data:
                greeted_at.setdefault(s, time.monotonic())
                continue  # the learner's greeting; it closes the connection after it
            now = time.monotonic()
            stats["longest_open_s"] = max(stats["longest_open_s"], now - opened_at.pop(s))
            stats["longest_held_s"] = max(stats["longest_held_s"], now - greeted_at.pop(s, now))
            stats["closed_by_learner"] += 1
            sel.unregister(s)
            s.close()
    now = time.monotonic()
    # still open at the end: how long they had been
    stats["open_at_end"] = len(opened_at)
    stats["oldest_open_at_end_s"] = max((now - t for t in opened_at.values()), default=0.0)
    stats["oldest_held_at_end_s"] = max((now - t for t in greeted_at.values()), default=0.0)
    for s in list(opened_at):
        s.close()
    return stats


def frames(endpoints: dict, seconds: float) -> dict:
    ctx = zmq.Context()
    big = bytes(FRAME_MIB << 20)
    stats = {"frames_sent": 0, "raw_bytes_sent": 0}
    socks = []
    for name, kind in (("traj", zmq.PUSH), ("control", zmq.DEALER)):
        for creds in ("null", "plain"):
            s = ctx.socket(kind)
            s.linger = 0
            s.sndhwm = 4
            if creds == "plain":
                s.plain_username, s.plain_password = b"tianjax", os.urandom(16).hex().encode()
            s.connect(endpoints[name])
            socks.append(s)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for s in socks:
            try:
                s.send_multipart([os.urandom(16), b"{}", big], flags=zmq.NOBLOCK, copy=False)
                stats["frames_sent"] += 1
            except zmq.Again:
                pass
        # a raw peer: greeting, then a long frame header announcing 1 GiB, then bytes
        host, port = _hostport(endpoints["traj"])
        r = None
        try:
            r = socket.create_connection((host, port), timeout=1.0)
            r.sendall(GREETING + b"\x02" + (1 << 30).to_bytes(8, "big"))
            r.settimeout(0.5)
            for _ in range(64):
                r.sendall(big[: 1 << 20])
                stats["raw_bytes_sent"] += 1 << 20
        except OSError:
            pass
        finally:
            if r is not None:
                r.close()
        time.sleep(0.05)
    for s in socks:
        s.close(linger=0)
    ctx.destroy(linger=0)
    return stats


def subscribe(endpoints: dict, seconds: float, topics: int) -> dict:
    ctx = zmq.Context()
    got = {"null": 0, "plain": 0, "curve": 0}
    socks = {}
    guess_server = zmq.curve_keypair()[0]
    own_public, own_secret = zmq.curve_keypair()
    for creds in got:
        s = ctx.socket(zmq.SUB)
        s.linger = 0
        s.rcvhwm = 4
        if creds == "plain":
            s.plain_username, s.plain_password = b"tianjax", os.urandom(16).hex().encode()
        elif creds == "curve":
            s.curve_serverkey, s.curve_publickey, s.curve_secretkey = (
                guess_server,
                own_public,
                own_secret,
            )
        s.setsockopt(zmq.SUBSCRIBE, b"")
        for i in range(topics):
            s.setsockopt(zmq.SUBSCRIBE, i.to_bytes(4, "big") + bytes((64 << 10) - 4))
        s.connect(endpoints["params"])
        socks[creds] = s
    poller = zmq.Poller()
    for s in socks.values():
        poller.register(s, zmq.POLLIN)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for s, _ in poller.poll(100):
            s.recv_multipart()
            got[next(c for c, x in socks.items() if x is s)] += 1
    for s in socks.values():
        s.close(linger=0)
    ctx.destroy(linger=0)
    return {"received": got}


def _running(pid: int) -> bool:
    """Whether `pid` runs (a zombie, exited but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def squat(endpoints: dict, seconds: float, run_pid: int = 0) -> dict:
    """Binds every port of `endpoints` as soon as it can, accepts, and counts bytes; stops
    when the run (`run_pid`, if given) has ended, whose ports are then free to anyone."""
    todo = {name: _hostport(e) for name, e in endpoints.items()}
    bound: dict[str, socket.socket] = {}
    sel = selectors.DefaultSelector()
    stats = {"bound": [], "connections": 0, "bytes": 0}
    end = time.monotonic() + seconds
    while time.monotonic() < end and (not run_pid or _running(run_pid)):
        for name, (host, port) in list(todo.items()):
            s = socket.socket()
            try:
                s.bind((host, port))
                s.listen(64)
                s.setblocking(False)
            except OSError:
                s.close()
                continue
            if run_pid and not _running(run_pid):  # free because the run just ended
                s.close()
                break
            bound[name] = s
            sel.register(s, selectors.EVENT_READ, "listen")
            stats["bound"].append(name)
            del todo[name]
        for key, _ in sel.select(timeout=0.01):
            s = key.fileobj
            if key.data == "listen":
                try:
                    c, _ = s.accept()
                except OSError:
                    continue
                c.setblocking(False)
                sel.register(c, selectors.EVENT_READ, "conn")
                stats["connections"] += 1
                continue
            try:
                data = s.recv(65536)
            except OSError:
                data = b""
            if data:
                stats["bytes"] += len(data)
            else:
                sel.unregister(s)
                s.close()
    return stats


def _admit_anyone(ctx: zmq.Context, stop) -> None:
    """A ZAP handler that admits every handshake (a PLAIN server without one refuses all)."""
    zap = ctx.socket(zmq.REP)
    zap.linger = 0
    zap.bind("inproc://zeromq.zap.01")
    while not stop.is_set():
        if zap.poll(50):
            version, request_id, *_ = zap.recv_multipart()
            zap.send_multipart([version, request_id, b"200", b"OK", b"", b""])
    zap.close(linger=0)


def replay(spec: dict, seconds: float) -> dict:
    import threading

    ctx = zmq.Context()
    stop = threading.Event()
    handler = threading.Thread(target=_admit_anyone, args=(ctx, stop), daemon=True)
    handler.start()
    kinds = {"push": zmq.PUSH, "dealer": zmq.DEALER, "router": zmq.ROUTER}
    s = ctx.socket(kinds[spec["socket"]])
    s.linger = 2000  # what it queued still goes out after the last send
    messages = [[bytes.fromhex(f) for f in m] for m in spec["messages"]]
    stats = {"sent": 0}
    try:
        if spec["socket"] == "router":
            s.plain_server = True  # (its ZAP handler admits anyone)
            port = s.bind_to_random_port("tcp://127.0.0.1")
            tmp = spec["endpoint_out"] + ".tmp"
            with open(tmp, "w") as f:
                f.write(f"tcp://127.0.0.1:{port}")
            os.replace(tmp, spec["endpoint_out"])
            if not s.poll(int(seconds * 1000)):
                return {"sent": 0, "error": "no peer wrote"}
            route = s.recv_multipart()[0]
            for m in messages:
                s.send_multipart([route, *m])
                stats["sent"] += 1
        else:
            s.plain_username, s.plain_password = b"tianjax", spec["token"].encode()
            s.connect(spec["endpoint"])
            for m in messages:
                s.send_multipart(m)
                stats["sent"] += 1
        time.sleep(0.5)
    finally:
        s.close(linger=2000)
        stop.set()
        handler.join(5)
        ctx.term()
    return stats


def hold(endpoints: dict, seconds: float, connections: int) -> dict:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    ctx = zmq.Context()
    token = os.environ["HOSTILE_PLAIN_TOKEN"].encode()
    kinds = {"params": zmq.SUB, "traj": zmq.PUSH, "control": zmq.DEALER}
    socks = []
    for name, endpoint in endpoints.items():
        for _ in range(connections):
            z = ctx.socket(kinds[name])
            z.linger = 0
            z.plain_username, z.plain_password = b"tianjax", token
            if kinds[name] == zmq.SUB:
                z.setsockopt(zmq.SUBSCRIBE, b"")
            z.connect(endpoint)
            socks.append(z)
    time.sleep(min(1.0, seconds / 4))  # they take the slots first; the raw ones try for them after
    targets = [_hostport(e) for e in endpoints.values()]
    raw: dict[socket.socket, tuple] = {}  # open raw connection -> its target
    sel = selectors.DefaultSelector()
    stats = {"zmq_sockets": len(socks), "raw_opened": 0, "raw_closed_by_learner": 0}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for target in targets:
            for _ in range(connections - sum(t == target for t in raw.values())):
                r = socket.socket()
                r.settimeout(0.1)
                try:
                    r.connect(target)
                except OSError:
                    r.close()
                    continue
                r.setblocking(False)
                raw[r] = target
                sel.register(r, selectors.EVENT_READ)
                stats["raw_opened"] += 1
        for key, _ in sel.select(timeout=0.05):
            r = key.fileobj
            try:
                if r.recv(65536):
                    continue  # the learner's greeting
            except BlockingIOError:
                continue
            except OSError:
                pass
            stats["raw_closed_by_learner"] += 1
            sel.unregister(r)
            del raw[r]
            r.close()
    for r in raw:
        r.close()
    for z in socks:
        z.close(linger=0)
    ctx.destroy(linger=0)
    return stats


def badflood(endpoints: dict, seconds: float, run_pid: int = 0) -> dict:
    """(Stops when the run, `run_pid` if given, has ended.)"""
    ctx = zmq.Context()
    token = os.environ["HOSTILE_PLAIN_TOKEN"].encode()
    socks = []
    for name, kind in (("traj", zmq.PUSH), ("control", zmq.DEALER)):
        s = ctx.socket(kind)
        s.linger = 0
        s.sndhwm = 1000
        s.plain_username, s.plain_password = b"tianjax", token
        s.connect(endpoints[name])
        socks.append(s)
    small = [os.urandom(900) for _ in range(64)]
    stats = {"sent": 0}
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += 1
        if run_pid and n % 64 == 0 and not _running(run_pid):
            break
        for s in socks:
            for parts in (small, [os.urandom(16), b'{"m":"tianjax"}'], [b"x"]):
                try:
                    s.send_multipart(parts, flags=zmq.NOBLOCK)
                    stats["sent"] += 1
                except zmq.Again:
                    time.sleep(0.001)
    for s in socks:
        s.close(linger=0)
    ctx.destroy(linger=0)
    return stats


def main() -> int:
    attack, seconds, out = sys.argv[1], float(sys.argv[3]), sys.argv[4]
    extra = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    endpoints = {} if attack == "replay" else json.loads(sys.argv[2])
    if attack == "replay":
        with open(sys.argv[2]) as f:
            report = replay(json.load(f), seconds)
    elif attack == "flood":
        report = flood(endpoints, seconds, extra or 1000)
    elif attack == "hold":
        report = hold(endpoints, seconds, extra or 20)
    elif attack == "badflood":
        report = badflood(endpoints, seconds, extra)
    elif attack == "frames":
        report = frames(endpoints, seconds)
    elif attack == "subscribe":
        report = subscribe(endpoints, seconds, extra or 1000)
    elif attack == "squat":
        report = squat(endpoints, seconds, extra)
    else:
        raise SystemExit(f"unknown attack {attack}")
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(report, f)
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
