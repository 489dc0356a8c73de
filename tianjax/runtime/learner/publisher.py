"""The learner's parameter publisher: a thread that encodes, signs and sends parameter
messages, so that the MAC over every byte of the parameters is computed while the next
update runs.

The learner offers (version, tree); the tree may hold device arrays whose host copies
are under way (`snapshot` of tianjax.runtime.learner.inflight), and the version may be one
such 0-d array: the thread waits for them, so the loop never does. The thread holds one slot and sends
whatever is newest when it gets to it (latest-version-wins: an offer older than the one
held, or than the last sent, is ignored, so a version never goes backwards on the wire).
The thread owns the PUB socket while it runs; start() and stop() hand it over. stop()
sends what is still held first.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import numpy as np

from tianjax.runtime.learner.inflight import to_host
from tianjax.transport.channels import ParamPublisher


_SERVE_S = 0.1  # how often an idle publisher reads the subscriptions that arrived


class Publisher:
    """Sends `channel`'s parameter messages on its own thread (started by the first offer)."""

    def __init__(self, channel: ParamPublisher, stamp=None):
        """`stamp(tree) -> tree`, if given, is applied in the thread just before a send (the
        learner stamps the newest env-step count there: the wait for the host copy must not
        make the count older)."""
        self.channel = channel
        self._stamp = stamp
        self._cv = threading.Condition()
        self._slot: tuple[int, Any] | None = None
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
            self._slot = (version, tree)
            if self._thread is None:
                self._stop = False
                self._thread = threading.Thread(target=self._run, name="tianjax-publisher", daemon=True)
                self._thread.start()
            self._cv.notify()

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
                print(f"tianjax: warning: the parameter publisher thread did not stop within {timeout_s:g} s",
                      file=sys.stderr, flush=True)
                return False
        with self._cv:
            self._thread = None
        return True

    def _run(self) -> None:
        try:
            while True:
                with self._cv:
                    if self._slot is None and not self._stop:
                        self._cv.wait(_SERVE_S)
                    if self._slot is None:
                        if self._stop:
                            return
                        item = None
                    else:
                        item, self._slot = self._slot, None
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
                if version < self._sent_version:
                    continue
                self.channel.publish(version, tree)  # encode, MAC, send (PUB never blocks)
                self._sent_version = version
                self.sent += 1
        except BaseException as e:  # noqa: BLE001 - raised in the learner's thread by offer()
            self.error = e
