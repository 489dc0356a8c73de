"""The learner's trajectory receiver: a thread that reads the trajectory socket, so that
checking, authenticating and decoding what actors send overlaps the running update.

The thread owns the socket while it runs (ZeroMQ sockets are used from one thread at a
time; starting and joining the thread are the memory barriers that hand it over). For
each message it verifies the MAC, decodes against the batch template (the channel counts
what it rejects), checks that every floating field is finite, and appends the result to a
short ready queue; an inproc socket wakes the learner's poller. Admission, credits and the
pool stay with the learner's loop, which takes from the queue only while its pool has
room. The queue is bounded (`max_ready`), and while the learner says it has no room the
thread stops reading, so the socket's high-water mark pushes back on the actors exactly
as before.

With `place` the thread also starts each finite trajectory's copy to the learner's device
(`jax.device_put`, which returns at once), so the copy overlaps the running update and
the pool holds device-resident batches.
"""

from __future__ import annotations

import collections
import itertools
import sys
import threading
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import zmq

from tianjax.transport.channels import TrajectoryReceiver

_POLL_MS = 50  # how often the thread looks at its stop flag while nothing arrives
JOIN_S = 10.0  # the thread sees its stop within a receive (a bounded one, see sockets.py)
_ids = itertools.count()


def check_finite(batch) -> bool:
    """Every floating field must be finite: observations and rewards, the behaviour
    log-probs, values and bootstrap values the losses use, and the episode returns the
    tracker averages (NaN/inf trajectories are dropped and counted, never learned from).
    Every inexact dtype counts, bfloat16 and the float8s too (numpy does not take them
    for floating) and complex ones."""
    for x in jax.tree.leaves(batch):
        x = np.asarray(x)
        if jnp.issubdtype(x.dtype, jnp.inexact) and not np.isfinite(x).all():
            return False
    return True


class Receiver:
    """Reads `channel` on its own thread between start() and stop(). `wake` is the socket
    (in the learner's thread) that becomes readable when something is ready; take() gives
    the next (message, finite) pair or None."""

    def __init__(
        self,
        channel: TrajectoryReceiver,
        ctx: zmq.Context,
        max_ready: int = 2,
        place: Callable[[Any], Any] | None = None,
    ):
        """`place(tree) -> tree` is applied to each finite message's tree in the thread."""
        self.channel = channel
        self.place = place
        self.max_ready = max(int(max_ready), 1)
        self._ready: collections.deque = collections.deque()
        self._room = threading.Event()  # the learner can take more
        self._room.set()
        self._space = threading.Event()  # the ready queue has space (set by take())
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.taken = 0  # messages the learner has taken
        self.drained = 0  # messages read from the socket only at the stop (unread_at_stop)
        self._idle = True  # the thread's last look found nothing waiting on the socket
        self.error: BaseException | None = None
        addr = f"inproc://tianjax-receiver-{next(_ids)}"
        self.wake = ctx.socket(zmq.PAIR)
        self.wake.linger = 0
        self.wake.bind(addr)
        self._signal = ctx.socket(zmq.PAIR)  # used only by the thread
        self._signal.linger = 0
        self._signal.sndhwm = 0
        self._signal.connect(addr)

    # ------------------------------------------------------------------ learner side
    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="tianjax-receiver", daemon=True)
            self._thread.start()

    def stop(self) -> bool:
        """Joins the thread (waiting at most JOIN_S); the socket belongs to the caller's
        thread again. False, with a warning, if the thread did not stop (it is a daemon: it
        ends with the process)."""
        if self._thread is not None:
            self._stop.set()
            self._room.set()
            self._space.set()
            self._thread.join(JOIN_S)
            if self._thread.is_alive():
                print(
                    f"tianjax: warning: the trajectory receiver thread did not stop within {JOIN_S:g} s",
                    file=sys.stderr,
                    flush=True,
                )
                return False
            self._thread = None
        return True

    @property
    def running(self) -> bool:
        return self._thread is not None

    def set_room(self, room: bool) -> None:
        """Whether the learner can take more: without room the thread stops reading."""
        if room:
            self._room.set()
        else:
            self._room.clear()

    @property
    def ready(self) -> bool:
        return bool(self._ready)

    def drain_wake(self) -> None:
        """Reads the wake-ups (call after each poll that had `wake` in it)."""
        while True:
            try:
                self.wake.recv(zmq.NOBLOCK)
            except zmq.Again:
                return

    def take(self):
        """The next (message, finite) the thread made ready, or None. Raises what stopped
        the thread, if something did."""
        if self.error is not None:
            raise self.error
        if not self._ready:
            return None
        item = self._ready.popleft()
        self.taken += 1
        self._space.set()
        return item

    @property
    def in_hand(self) -> int:
        """Messages the channel has accepted that the learner has not taken yet."""
        return self.channel.accepted - self.taken

    def unread_at_stop(self, settle_ms: int = 100, limit_ms: int = 1000) -> list[str]:
        """The senders of what arrived and was never taken, once the learner is done: the
        thread is stopped and the socket read to the end (until nothing more comes for
        settle_ms, within limit_ms: a trajectory an actor counted as sent may still be on its
        way). Every valid message, ready or read now, is named by its sender; those read now
        count as accepted and so in `in_hand`. Nothing is taken or learned from after this."""
        self.stop()
        senders = [msg.sender for msg, _ in self._ready]
        deadline = time.monotonic() + limit_ms / 1000
        while (left := deadline - time.monotonic()) > 0:
            if not self.channel.socket.poll(int(min(settle_ms, left * 1000))):
                break
            msg = self.channel.recv(0)
            if msg is not None:
                self.drained += 1
                senders.append(msg.sender)
        return senders

    @property
    def backlog_empty(self) -> bool:
        """The thread is reading, nothing is ready, and its last look found the socket
        empty (what is unread while the learner has no room is late, not lost)."""
        return self._room.is_set() and not self._ready and self._idle

    def close(self) -> None:
        if not self.stop():
            return  # its sockets stay with the thread (the context's end closes them)
        self.wake.close(linger=0)
        self._signal.close(linger=0)

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        socket = self.channel.socket
        try:
            while not self._stop.is_set():
                if not self._room.is_set():
                    self._room.wait(_POLL_MS / 1000)
                    continue
                if len(self._ready) >= self.max_ready:
                    self._space.clear()
                    if len(self._ready) >= self.max_ready:
                        self._space.wait(_POLL_MS / 1000)
                    continue
                if not socket.poll(_POLL_MS):
                    self._idle = True
                    continue
                self._idle = False
                msg = self.channel.recv(0)  # verifies, decodes; counts what it rejects
                if msg is None:
                    continue
                finite = check_finite(msg.tree)
                if finite and self.place is not None:
                    msg = msg._replace(tree=self.place(msg.tree))
                self._ready.append((msg, finite))
                try:
                    self._signal.send(b"", zmq.NOBLOCK)
                except zmq.Again:
                    pass
        except BaseException as e:  # noqa: BLE001 - handed to the learner's thread by take()
            self.error = e
            try:
                self._signal.send(b"", zmq.NOBLOCK)
            except zmq.ZMQError:
                pass


__all__ = ["JOIN_S", "Receiver", "check_finite"]
