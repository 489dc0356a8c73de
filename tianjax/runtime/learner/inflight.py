"""Updates in flight: the learner's loop dispatches an update and goes on (taking in
trajectories, building the next batch) while a watcher thread waits for the update's
results, so that the loop never blocks on a device-to-host read per update.

JAX dispatches a jitted update asynchronously: the call returns futures at once and the
device runs the updates in the order they were dispatched. The loop hands each update's
metrics (whose `update_skipped` flag says whether the non-finite guard kept the old
state) to `InFlight.add`; the thread reads them back in order, at most `limit` updates
behind, and records when each finished. The loop takes the finished ones with `take()`
without waiting; `settle()` waits for all of them where the loop needs exact counts (sync
mode, a checkpoint, the end of the run).

Busy time: updates run one after another, so update i runs from max(its dispatch, the end
of update i-1) to its end; their sum over the training time is `learner_busy_fraction`.
The thread sees an end as soon as the read returns, so the figure does not depend on how
often the loop looks.
"""

from __future__ import annotations

import collections
import sys
import threading
import time
from typing import Any

import jax
import numpy as np


def to_host(tree):
    """numpy copies of replicated arrays (works when other processes hold parts of the
    mesh); waits for the arrays to be computed."""
    return jax.tree.map(
        lambda x: np.asarray(x.addressable_data(0)) if isinstance(x, jax.Array) else x, tree
    )


class InFlight:
    """Dispatched updates whose results the loop has not read yet (see the module doc)."""

    def __init__(self, limit: int = 2):
        self.limit = max(int(limit), 1)
        self._cv = threading.Condition()
        self._waiting: collections.deque = (
            collections.deque()
        )  # (metrics, t_dispatch), oldest first
        self._done: collections.deque = collections.deque()  # host metrics, oldest first
        self._unresolved = 0  # added, not yet taken by the thread's read
        self._stop = False
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None
        self.busy_s = 0.0  # wall time with an update running, over the finished updates
        self._last_end = 0.0
        self.finished = 0  # updates the thread has read back

    def add(self, metrics: dict, t_dispatch: float) -> None:
        """Hands over a dispatched update's metrics; waits while `limit` updates are still
        unread (which bounds the batches held on the device)."""
        self._raise()
        with self._cv:
            if self._thread is None:
                self._stop = False
                self._thread = threading.Thread(
                    target=self._run, name="tianjax-inflight", daemon=True
                )
                self._thread.start()
            self._waiting.append((metrics, t_dispatch))
            self._unresolved += 1
            self._cv.notify_all()
            while self._unresolved > self.limit and self.error is None:
                self._cv.wait(0.05)
        self._raise()

    def take(self) -> list[dict]:
        """The host metrics of the updates finished since the last call, oldest first."""
        self._raise()
        with self._cv:
            out = list(self._done)
            self._done.clear()
        return out

    def settle(self) -> list[dict]:
        """Waits for every dispatched update, then take()."""
        with self._cv:
            while self._unresolved and self.error is None:
                self._cv.wait(0.05)
        return self.take()

    @property
    def pending(self) -> int:
        return self._unresolved

    def close(self, timeout_s: float = 300.0) -> None:
        """Reads back what is in flight, then joins the thread, waiting at most timeout_s
        (the updates in flight must finish first: a large model's may take long); a thread
        still reading then is left to end with the process, with a warning."""
        with self._cv:
            thread, self._stop = self._thread, True
            self._cv.notify_all()
        if thread is not None:
            thread.join(timeout_s)
            if thread.is_alive():
                print(
                    f"tianjax: warning: the update read-back thread did not stop within {timeout_s:g} s",
                    file=sys.stderr,
                    flush=True,
                )
        self._thread = None

    def _raise(self) -> None:
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        try:
            while True:
                with self._cv:
                    while not self._waiting and not self._stop:
                        self._cv.wait()
                    if not self._waiting:
                        return
                    metrics, t_dispatch = self._waiting[0]
                host = to_host(metrics)  # waits for the update to finish
                end = time.perf_counter()
                with self._cv:
                    self._waiting.popleft()
                    self.busy_s += max(end - max(t_dispatch, self._last_end), 0.0)
                    self._last_end = end
                    self._done.append(host)
                    self._unresolved -= 1
                    self.finished += 1
                    self._cv.notify_all()
        except BaseException as e:  # noqa: BLE001 - raised in the loop's thread by add()/take()
            with self._cv:
                self.error = e
                self._cv.notify_all()


def snapshot(tree: Any):
    """A copy of `tree`'s arrays in new device buffers, with their host copies started
    (`copy_to_host_async`): a later update may donate the originals, never these."""
    copy = _copy(tree)
    for leaf in jax.tree.leaves(copy):
        if isinstance(leaf, jax.Array):
            leaf.copy_to_host_async()
    return copy


_copy = jax.jit(lambda tree: jax.tree.map(lambda x: x.copy() if hasattr(x, "copy") else x, tree))


__all__ = ["InFlight", "snapshot", "to_host"]
