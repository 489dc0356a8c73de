"""What ZeroMQ's frame cap bounds: each frame, not each message (docs/security.md).

A PULL socket with ZMQ_MAXMSGSIZE = 1000 bytes (every frame over it drops its sender) and
a high-water mark of 4 messages receives, from a PUSH peer in another process, one message
of FRAMES frames of 900 bytes each. The table shows how much the receiving process grew
while the message arrived (its RSS, peak minus start), and what it could then read:

- complete: the message ends (its last frame has no MORE flag). libzmq buffers it whole
  before the receiver can see any of it, then delivers it, every frame under the cap.
- unfinished: the message never ends. libzmq's own sender keeps an unfinished message on
  its side, so here the receiver stays small; a peer writing ZMTP frames itself is not
  held back that way.

So one frame per message (as the parameters travel) does not bound a message: a peer past
the handshake can make the receiver hold as much as it sends in one message.

    .venv/bin/python experiments/benchmarks/zmq_message_bound.py [--frames 100000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import psutil
import zmq

CAP, FRAME = 1000, 900


def _send(endpoint: str, frames: int, complete: bool) -> None:
    ctx = zmq.Context()
    s = ctx.socket(zmq.PUSH)
    s.connect(endpoint)
    data = os.urandom(FRAME)
    for _ in range(frames - 1):
        s.send(data, zmq.SNDMORE)
    s.send(data, 0 if complete else zmq.SNDMORE)
    time.sleep(3)  # let the I/O thread write it out
    s.close(linger=0)
    ctx.term()


def _trial(frames: int, complete: bool) -> tuple[float, int]:
    ctx = zmq.Context()
    r = ctx.socket(zmq.PULL)
    r.setsockopt(zmq.MAXMSGSIZE, CAP)
    r.rcvhwm = 4
    endpoint = f"tcp://127.0.0.1:{r.bind_to_random_port('tcp://127.0.0.1')}"
    me = psutil.Process()
    rss0 = peak = me.memory_info().rss
    p = subprocess.Popen(
        [sys.executable, __file__, "--send", endpoint, "--frames", str(frames)]
        + (["--complete"] if complete else [])
    )
    while p.poll() is None:
        peak = max(peak, me.memory_info().rss)
        time.sleep(0.05)
    got = 0
    while r.poll(500):
        r.recv(copy=False)
        got += 1
        while r.getsockopt(zmq.RCVMORE):
            r.recv(copy=False)
            got += 1
    r.close(linger=0)
    ctx.term()
    return (peak - rss0) / 2**20, got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=100_000)
    ap.add_argument("--send")
    ap.add_argument("--complete", action="store_true")
    args = ap.parse_args()
    if args.send:
        _send(args.send, args.frames, args.complete)
        return 0
    print(
        f"one message of {args.frames} frames of {FRAME} B ({args.frames * FRAME / 2**20:.0f} MiB), "
        f"frame cap {CAP} B, receive HWM 4 messages"
    )
    print(f"{'message':<12} {'receiver RSS growth MiB':>24} {'frames it read':>15}")
    for complete in (True, False):
        growth, got = _trial(args.frames, complete)
        print(f"{'complete' if complete else 'unfinished':<12} {growth:>24.1f} {got:>15}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
