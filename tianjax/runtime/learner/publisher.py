"""The learner's parameter publisher: a thread that encodes, signs and sends parameter
messages, so that the MAC over every byte of the parameters is computed while the next
update runs.

The learner offers (version, tree); the tree may hold device arrays whose host copies
are under way (`snapshot` of tianjax.runtime.learner.inflight), and the version may be one
such 0-d array: the thread waits for them, so the loop never does. Offers are sent in the
order they came, except that one a later offer supersedes is skipped: an offer whose
arrays are computed (host arrays always are) supersedes every one before it, and an int
version older than one offered before is ignored, so a version never goes backwards on the
wire. A snapshot still being computed never displaces an earlier one: with an update
queued behind the running one, the learner offers the parameters of both, and the running
one's go out as soon as it ends, not one update later with the queued one's.
`wait_sent` lets the learner hand credits back only after the parameters of the update
that just ended have gone out, so that what those credits make is acted with them.

The thread owns the PUB socket while it runs; start() and stop() hand it over. stop()
sends what is still held first.
"""

from __future__ import annotations

import collections
import sys
import threading
import time
from typing import Any

import jax
import numpy as np

from tianjax.runtime.learner.inflight import to_host
from tianjax.transport.channels import ParamPublisher

_SERVE_S = 0.1  # how often an idle publisher reads the subscriptions that arrived
_HELD = 4  # offers held at most (the oldest goes first: a later one supersedes it)


def _computed(item) -> bool:
    """Whether an offer's arrays are all computed (jax.Array.is_ready; host values always are)."""
    return all(
        x.is_ready() for x in jax.tree.leaves(item) if callable(getattr(x, "is_ready", None))
    )


class Publisher:
    """Sends `channel`'s parameter messages on its own thread (started by the first offer)."""

    def __init__(self, channel: ParamPublisher, stamp=None):
        """`stamp(tree) -> tree`, if given, is applied in the thread just before a send (the
        learner stamps the newest env-step count there: the wait for the host copy must not
        make the count older)."""
        self.channel = channel
        self._stamp = stamp
        self._cv = threading.Condition()
        self._held: collections.deque = collections.deque()  # (version, tree) offers, oldest first
        self._newest = -1  # the newest version offered (as a number)
        self._sent_version = -1  # the newest version sent
        self._stop = False
        self._thread: threading.Thread | None = None
        self.sent = 0
        self.error: BaseException | None = None

    def offer(self, version, tree: Any) -> None:
        """Queues `tree` as `version` (the same version again is a re-send for late
        joiners); raises what stopped the thread, if something did."""
        if self.error is not None:
            raise self.error
        with self._cv:
            if isinstance(version, int):
                if version < self._newest:
                    return
                self._newest = version
            self._held.append((version, tree))
            while len(self._held) > _HELD:
                self._held.popleft()
            if self._thread is None:
                self._stop = False
                self._thread = threading.Thread(
                    target=self._run, name="tianjax-publisher", daemon=True
                )
                self._thread.start()
            self._cv.notify()

    def wait_sent(self, version: int, timeout_s: float) -> bool:
        """Waits, at most `timeout_s`, until `version` (or a newer one) has been sent. True
        if it has; False at the timeout, or at once with no thread to send it."""
        deadline = time.monotonic() + timeout_s
        with self._cv:
            while self._sent_version < version:
                left = deadline - time.monotonic()
                if left <= 0 or self._thread is None or self.error is not None:
                    return False
                self._cv.wait(left)
        return True

    def stop(self, timeout_s: float = 60.0) -> bool:
        """Sends what is held, then joins the thread (waiting at most timeout_s: a send
        never blocks, but the host copy of what is held may still be under way). False,
        with a warning, if the thread did not stop (a daemon: it ends with the process)."""
        with self._cv:
            thread, self._stop = self._thread, True
            self._cv.notify()
        if thread is not None:
            thread.join(timeout_s)
            if thread.is_alive():
                print(
                    f"tianjax: warning: the parameter publisher thread did not stop within {timeout_s:g} s",
                    file=sys.stderr,
                    flush=True,
                )
                return False
        with self._cv:
            self._thread = None
        return True

    def _run(self) -> None:
        try:
            while True:
                with self._cv:
                    if not self._held and not self._stop:
                        self._cv.wait(_SERVE_S)
                    if not self._held:
                        if self._stop:
                            return
                        item = None
                    else:
                        # the newest offer already computed supersedes those before it
                        last = max(
                            (i for i, it in enumerate(self._held) if _computed(it)), default=0
                        )
                        for _ in range(last):
                            self._held.popleft()
                        item = self._held.popleft()
                if item is None:
                    # NOTE: the socket takes only the subscriptions this thread approves
                    # (XPUB_MANUAL), queued until it reads them: read them while idle too
                    self.channel.serve_subscriptions()
                    continue
                version, tree = item
                tree = to_host(tree)  # waits for the device-to-host copies, if any
                if self._stamp is not None:
                    tree = self._stamp(tree)
                version = int(np.asarray(to_host(version)))
                if version >= self._sent_version:
                    self.channel.publish(version, tree)  # encode, MAC, send (PUB never blocks)
                    self._sent_version = version
                    self.sent += 1
                with self._cv:
                    self._cv.notify_all()  # (wait_sent)
        except BaseException as e:  # noqa: BLE001 - raised in the learner's thread by offer()
            with self._cv:
                self.error = e
                self._cv.notify_all()


__all__ = ["Publisher"]
