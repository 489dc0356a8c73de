"""Transport throughput against raw ZeroMQ (TianJi, arXiv 2502.20190: the transport should
cost little next to the sockets it runs on).

For pytrees of 1, 4, 16 and 64 MiB (four float32 arrays), over tcp loopback and ipc,
measures bytes/s of
  (a) trajectory ingest: TrajectorySender (PUSH, peer process) -> TrajectoryReceiver (PULL,
      this process), every message authenticated, checked and rebuilt;
  (b) parameter broadcast: ParamPublisher (PUB, this process) -> ParamSubscriber (SUB, peer
      process), measured at the subscriber until it holds the last version (latest-version-
      wins: it verifies the newest message it finds queued, not the ones behind it);
against raw ZeroMQ PUSH/PULL and PUB/SUB moving the same bytes as one frame with
copy=False. "ours" is a run's default (`runtime.security: plain`: per-message MACs, a PLAIN
handshake token); "curve" adds CurveZMQ encryption (`runtime.security: curve`, the
default off loopback); "noauth" rows use auth.InsecureNoAuth and no handshake
(measurement only) to show what the MAC costs. Raw and ours alternate within each repeat; the
table shows medians. It also shows
CPU seconds per GB (both processes, all threads): on a machine shared with other work,
wall-clock rates swing with the load, the CPU a byte costs much less.

Sender and receiver are separate processes (spawned; only endpoint strings and sizes are
passed). Both socket sides use the same high-water marks, sized so that nothing is dropped.

    .venv/bin/python experiments/benchmarks/bench_transport.py            # ~1 minute
    .venv/bin/python experiments/benchmarks/bench_transport.py --sizes 1 64 --repeats 5
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import statistics
import sys
import tempfile
import time

import numpy as np
import zmq

WARMUP = 2
TIMED_VERSION = 1_000_000  # parameter versions at or above this are timed
SYNC_TIMEOUT_MS = 120_000
TRAJ_HWM = 4


def _tree(mib: int) -> dict:
    n = (mib << 20) // 16  # four float32 arrays of mib/4 MiB each
    return {f"w{i}": np.full(n, i, np.float32) for i in range(4)}


def _template(mib: int) -> dict:
    n = (mib << 20) // 16  # shapes and dtypes only: a broadcast scalar allocates nothing
    return {f"w{i}": np.broadcast_to(np.float32(0), (n,)) for i in range(4)}


def _cpu() -> float:
    """CPU seconds of this process so far, all threads (ZeroMQ's I/O thread included)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _auth(mode: str):
    from tianjax.transport import InsecureNoAuth, RunKey

    # a fixed key is fine for a benchmark; a run uses new_run_key()
    return InsecureNoAuth() if mode == "noauth" else RunKey(bytes(range(32)))


def _net(mode: str, server: bool, io_threads: int | None = None):
    """The handshake side of a mode: None (noauth) or a SecureContext (its .ctx, .handshake)."""
    from tianjax.transport import SecureContext

    if mode == "noauth":
        return None
    return SecureContext(
        _auth(mode), "curve" if mode == "curve" else "plain", server=server, io_threads=io_threads
    )


def _with(net, ctx) -> dict:
    return {"ctx": ctx} if net is None else {"ctx": net.ctx, "handshake": net.handshake}


def _recv_json(sock: zmq.Socket) -> dict:
    if not sock.poll(SYNC_TIMEOUT_MS):
        raise TimeoutError("benchmark peer went silent")
    return sock.recv_json()


def _n_messages(mib: int, mib_per_trial: int) -> int:
    return int(min(256, max(6, mib_per_trial // mib)))


# ------------------------------------------------------------------------------ peer process
def _peer(sync_endpoint: str) -> None:
    ctx = zmq.Context()
    sync = ctx.socket(zmq.PAIR)
    sync.linger = 0
    sync.connect(sync_endpoint)
    try:
        while (cmd := _recv_json(sync))["op"] != "quit":
            if cmd["op"] == "traj_send":
                sync.send_json(_push(ctx, sync, cmd))
            else:
                sync.send_json(_subscribe(ctx, sync, cmd))
    finally:
        sync.close()
        ctx.destroy(linger=0)


def _push(ctx, sync, cmd) -> dict:
    from tianjax.transport import TrajectorySender

    mib, n, mode = cmd["mib"], cmd["n"], cmd["mode"]
    if mode == "raw":
        s = ctx.socket(zmq.PUSH)
        s.linger, s.sndhwm = 0, TRAJ_HWM
        s.connect(cmd["endpoint"])
        flat = np.full((mib << 20) // 4, 1, np.float32)
        cpu = _cpu()
        for _ in range(WARMUP + n):
            s.send(flat, copy=False)
    else:
        tree = _tree(mib)
        net = _net(mode, server=False)
        s = TrajectorySender(
            _auth(mode),
            cmd["endpoint"],
            sender="bench",
            to=cmd["to"],
            hwm=TRAJ_HWM,
            **_with(net, ctx),
        )
        cpu = _cpu()
        for i in range(WARMUP + n):
            assert s.send(tree, i, timeout_ms=SYNC_TIMEOUT_MS)
    _recv_json(sync)  # the receiver has everything (and our I/O thread is done)
    cpu = _cpu() - cpu
    s.close()
    if mode != "raw" and net is not None:
        net.close()
    return {"cpu": cpu}


def _subscribe(ctx, sync, cmd) -> dict:
    from tianjax.transport import ParamSubscriber

    mib, n, mode, hwm = cmd["mib"], cmd["n"], cmd["mode"], cmd["hwm"]
    size = mib << 20
    if mode == "raw":
        s = ctx.socket(zmq.SUB)
        s.linger, s.rcvhwm = 0, hwm
        s.setsockopt(zmq.SUBSCRIBE, b"")
        s.connect(cmd["endpoint"])
        if not s.poll(SYNC_TIMEOUT_MS):
            raise TimeoutError("raw publisher went silent")
        s.recv(copy=False)
        cpu = _cpu()
        sync.send_json({"ready": True})
        got, t0 = 0, None
        while got < n:
            if not s.poll(SYNC_TIMEOUT_MS):
                raise TimeoutError("raw publisher went silent")
            if len(s.recv(copy=False)) == size:  # warm-up messages are 8 bytes
                got += 1
                t0 = t0 or time.perf_counter()
        dt, moved, verified = time.perf_counter() - t0, (n - 1) * size, n
    else:
        net = _net(mode, server=False)
        s = ParamSubscriber(_auth(mode), cmd["endpoint"], _template(mib), **_with(net, ctx))
        if s.latest(SYNC_TIMEOUT_MS) is None:
            raise TimeoutError("publisher went silent")
        cpu = _cpu()
        sync.send_json({"ready": True})
        first = verified = 0
        while True:
            got = s.latest(SYNC_TIMEOUT_MS)
            if got is None:
                raise TimeoutError("publisher went silent")
            if got[0] >= TIMED_VERSION:
                verified += 1
                if not first:
                    first, t0 = got[0], time.perf_counter()
                if got[0] == TIMED_VERSION + n - 1:
                    break
        dt, moved = time.perf_counter() - t0, (got[0] - first) * size
    cpu = _cpu() - cpu
    s.close()
    if mode != "raw" and net is not None:
        net.close()
    return {"rate": moved / dt if dt > 0 else float("nan"), "verified": verified, "cpu": cpu}


# ------------------------------------------------------------------------------ this process
_private: list[str] = []


def _ipc_dir() -> str:
    """A private directory (mode 0700) for the channels' ipc sockets, removed at exit."""
    if not _private:
        import atexit
        import shutil

        _private.append(tempfile.mkdtemp(prefix="tianjax-bench-"))
        atexit.register(shutil.rmtree, _private[0], True)
    return _private[0]


def _bind(sock: zmq.Socket, transport: str, tag: str) -> str:
    if transport == "tcp":
        return f"tcp://127.0.0.1:{sock.bind_to_random_port('tcp://127.0.0.1')}"
    ep = f"ipc://{tempfile.gettempdir()}/tianjax-bench-{os.getpid()}-{tag}.ipc"
    sock.bind(ep)
    return ep


def _traj_trial(ctx, sync, transport: str, mode: str, mib: int, n: int) -> tuple[float, float, int]:
    """(bytes/s, CPU seconds of both processes, bytes the CPU was spent on)."""
    from tianjax.transport import TrajectoryReceiver

    size = mib << 20
    if mode == "raw":
        r = ctx.socket(zmq.PULL)
        r.linger, r.rcvhwm = 0, TRAJ_HWM
        endpoint = _bind(r, transport, "traj")
        recv = lambda: r.recv(copy=False) if r.poll(SYNC_TIMEOUT_MS) else None  # noqa: E731
    else:
        net = _net(mode, server=True)
        r = TrajectoryReceiver(
            _auth(mode),
            _template(mib),
            hwm=TRAJ_HWM,
            transport=transport,
            max_bytes=2 * size,
            ipc_dir=_ipc_dir(),
            **_with(net, ctx),
        )
        endpoint = r.endpoint
        recv = lambda: r.recv(SYNC_TIMEOUT_MS)  # noqa: E731
    cpu = _cpu()
    sync.send_json(
        {
            "op": "traj_send",
            "mode": mode,
            "endpoint": endpoint,
            "mib": mib,
            "n": n,
            "to": "" if mode == "raw" else r.address,
        }
    )
    for i in range(WARMUP + n):
        if recv() is None:
            raise TimeoutError("trajectory sender went silent")
        if i == WARMUP - 1:
            t0 = time.perf_counter()
    dt = time.perf_counter() - t0
    cpu = _cpu() - cpu
    if mode != "raw":
        assert r.accepted == WARMUP + n and not r.rejected, r.rejected
    sync.send_json({"op": "done"})
    peer = _recv_json(sync)
    r.close()
    if mode != "raw" and net is not None:
        net.close()
    return n * size / dt, cpu + peer["cpu"], (WARMUP + n) * size


def _params_trial(
    ctx, sync, transport: str, mode: str, mib: int, n: int
) -> tuple[float, float, int, int]:
    """(bytes/s, CPU seconds of both processes, bytes, versions the subscriber verified)."""
    from tianjax.transport import ParamPublisher

    hwm = n + 64  # room for every timed message and stray warm-ups: nothing dropped
    if mode == "raw":
        p = ctx.socket(zmq.PUB)
        p.linger, p.sndhwm = 0, hwm
        endpoint = _bind(p, transport, "params")
        flat = np.full((mib << 20) // 4, 1, np.float32)
        warm = lambda i: p.send(b"warm-up!")  # noqa: E731
        timed = lambda i: p.send(flat, copy=False)  # noqa: E731
    else:
        tree = _tree(mib)
        net = _net(mode, server=True)
        p = ParamPublisher(
            _auth(mode), transport=transport, hwm=hwm, ipc_dir=_ipc_dir(), **_with(net, ctx)
        )
        endpoint = p.endpoint
        warm = lambda i: p.publish(i + 1, tree)  # noqa: E731
        timed = lambda i: p.publish(TIMED_VERSION + i, tree)  # noqa: E731
    sync.send_json(
        {"op": "params_recv", "mode": mode, "endpoint": endpoint, "mib": mib, "n": n, "hwm": hwm}
    )
    # subscriptions reach a PUB a moment after connecting: publish until the peer hears one
    i = 0
    while not sync.poll(20):
        warm(i)
        i += 1
    assert sync.recv_json()["ready"]
    cpu = _cpu()
    for i in range(n):
        timed(i)
    result = _recv_json(sync)
    cpu = _cpu() - cpu
    p.close()
    if mode != "raw" and net is not None:
        net.close()
    return result["rate"], cpu + result["cpu"], n * (mib << 20), result["verified"]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 16, 64], help="MiB per message")
    ap.add_argument("--transports", nargs="+", default=["tcp", "ipc"], choices=["tcp", "ipc"])
    ap.add_argument("--patterns", nargs="+", default=["traj", "params"], choices=["traj", "params"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--mib-per-trial", type=int, default=256, help="bytes moved per measurement")
    ap.add_argument("--no-noauth", action="store_true", help="skip the auth-off rows")
    ap.add_argument("--no-curve", action="store_true", help="skip the CurveZMQ rows")
    args = ap.parse_args(argv)
    modes = (
        ["raw", "ours"]
        + ([] if args.no_curve else ["curve"])
        + ([] if args.no_noauth else ["noauth"])
    )

    rows = []
    t_start = time.perf_counter()
    spawn = mp.get_context("spawn")
    for transport in args.transports:
        ctx = zmq.Context()
        sync = ctx.socket(zmq.PAIR)
        sync.linger = 0
        port = sync.bind_to_random_port("tcp://127.0.0.1")
        peer = spawn.Process(target=_peer, args=(f"tcp://127.0.0.1:{port}",), daemon=True)
        peer.start()
        try:
            for pattern in args.patterns:
                for mib in args.sizes:
                    n = _n_messages(mib, args.mib_per_trial)
                    rates = {m: [] for m in modes}
                    cpu = {m: [] for m in modes}
                    verified = []
                    for _ in range(args.repeats):
                        for mode in modes:  # alternate raw and ours within each repeat
                            if pattern == "traj":
                                rate, secs, nbytes = _traj_trial(ctx, sync, transport, mode, mib, n)
                            else:
                                rate, secs, nbytes, v = _params_trial(
                                    ctx, sync, transport, mode, mib, n
                                )
                                if mode == "ours":
                                    verified.append(v)
                            rates[mode].append(rate)
                            cpu[mode].append(secs / nbytes * 1e9)
                    row = (
                        transport,
                        pattern,
                        mib,
                        n,
                        {m: statistics.median(r) for m, r in rates.items()},
                        {m: statistics.median(c) for m, c in cpu.items()},
                        verified,
                    )
                    rows.append(row)
                    print(_row(row, modes), file=sys.stderr, flush=True)  # progress
        finally:
            sync.send_json({"op": "quit"})
            peer.join(timeout=10)
            if peer.is_alive():
                peer.terminate()
            sync.close()
            ctx.destroy(linger=0)
    print(_header(modes))
    for row in rows:
        print(_row(row, modes))
    print(
        f"{len(rows) * args.repeats * len(modes)} trials in {time.perf_counter() - t_start:.0f} s on "
        f"{os.cpu_count()} CPUs (load average {os.getloadavg()[0]:.1f}); GB/s = 1e9 bytes/s; "
        f"cpu s/GB = CPU seconds of both processes per 1e9 bytes; medians of {args.repeats} repeats; "
        "verified = versions the subscriber verified and took, of those published"
    )


def _header(modes) -> str:
    cols = f"{'transport':9} {'pattern':7} {'MiB':>4} {'msgs':>4} {'raw GB/s':>8} {'ours GB/s':>9} {'ours/raw':>8}"
    if "curve" in modes:
        cols += f" {'curve GB/s':>10} {'curve/raw':>9} {'curve/ours':>10}"
    if "noauth" in modes:
        cols += f" {'noauth GB/s':>11} {'noauth/raw':>10}"
    cols += "  cpu s/GB: raw  ours"
    if "curve" in modes:
        cols += " curve"
    if "noauth" in modes:
        cols += " noauth"
    return cols + "  verified"


def _row(row, modes) -> str:
    transport, pattern, mib, n, med, cpu, verified = row
    out = (
        f"{transport:9} {pattern:7} {mib:>4} {n:>4} {med['raw'] / 1e9:>8.2f} {med['ours'] / 1e9:>9.2f} "
        f"{med['ours'] / med['raw']:>8.2f}"
    )
    if "curve" in modes:
        out += f" {med['curve'] / 1e9:>10.2f} {med['curve'] / med['raw']:>9.2f} {med['curve'] / med['ours']:>10.2f}"
    if "noauth" in modes:
        out += f" {med['noauth'] / 1e9:>11.2f} {med['noauth'] / med['raw']:>10.2f}"
    out += f"  {'':9}{cpu['raw']:>4.2f}  {cpu['ours']:>4.2f}"
    if "curve" in modes:
        out += f"  {cpu['curve']:>4.2f}"
    if "noauth" in modes:
        out += f"   {cpu['noauth']:>4.2f}"
    return out + (f"  {min(verified)}-{max(verified)}/{n}" if verified else "  all")


if __name__ == "__main__":
    main()
