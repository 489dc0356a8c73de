"""Bounded ends for the learner processes of a multi-host run.

In a `jax.distributed` run the learners meet in every update's collective, so one lost
learner process can leave the others blocked where no Python runs: a SIGTERM handler
never gets to run, and JAX's own heartbeat ends the process minutes later with SIGABRT
and a C++ stack trace. Two threads bound this:

- `SigtermWatchdog`: the signal module writes each caught signal to a wakeup pipe at C
  level, whatever the main thread is doing; a thread reading that pipe gives the normal
  handler `grace_s` to end the process (final checkpoint and all), then prints one line
  and ends it with os._exit.
- `PeerWatch`: each learner bumps a counter in the coordination service's key-value store
  every `period_s`; a learner whose counter stays still for `timeout_s` (by this
  process's own clock: no clock is compared across hosts), or a coordination service
  that stops answering (its host, learner 0, is gone), is reported in one line, and the
  process exits with code 1 before JAX's heartbeat (set longer) would abort it.

- `exit_on_abort`: when learner 0, which hosts JAX's coordination service, is lost, the
  other learners' JAX clients abort at once (LOG(FATAL) from a gRPC thread, before any
  heartbeat could report it). A C-level SIGABRT handler turns that abort into this
  module's one line and exit code 1 (JAX's own log lines stay above it).

`exit_now` is the common end: one line on stderr, then os._exit, skipping the interpreter's
exit handlers (jax.distributed.shutdown would wait for the lost process).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

FAILED_KEY = "tianjax/failed"  # set by a learner that is ending the run on an error


def exit_now(line: str, code: int) -> None:
    print(line, file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(code)


_ABORT_HANDLER = ctypes.CFUNCTYPE(None, ctypes.c_int)
_abort_handler = None  # the installed handler, kept alive for the life of the process


def exit_on_abort(line: str) -> None:
    """Ends the process with `line` and exit code 1 instead of a SIGABRT core dump. The
    handler runs Python (ctypes takes the GIL for it) in whatever thread called abort();
    it only writes one line and calls os._exit, and is meant for aborts from JAX's
    distributed client, whose gRPC threads hold no Python state."""
    global _abort_handler

    def on_abort(signum: int) -> None:
        exit_now(line, 1)

    _abort_handler = _ABORT_HANDLER(on_abort)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = [ctypes.c_int, _ABORT_HANDLER]
    libc.signal(signal.SIGABRT, _abort_handler)


class SigtermWatchdog:
    """Ends the process `grace_s` after a SIGTERM or SIGINT that the main thread did not
    act on. Install from the main thread, after the Python-level handlers."""

    def __init__(self, grace_s: float = 5.0, code: int = 143, what: str = "learner"):
        self.grace_s, self.code, self.what = grace_s, code, what
        self._r, w = os.pipe()
        os.set_blocking(w, False)
        signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        threading.Thread(target=self._watch, name="tianjax-sigterm", daemon=True).start()

    def _watch(self) -> None:
        while True:
            try:
                data = os.read(self._r, 16)
            except OSError:
                return
            if any(b in (signal.SIGTERM, signal.SIGINT) for b in data):
                time.sleep(self.grace_s)
                exit_now(
                    f"tianjax: error: the {self.what} did not stop within {self.grace_s:g} s of a "
                    "signal (blocked in a collective with a lost learner?); ended it; the last "
                    "checkpoint stands",
                    self.code,
                )


class PeerWatch:
    """Watches the other learner processes of a jax.distributed run (see module doc)."""

    def __init__(
        self, client, index: int, count: int, timeout_s: float, period_s: float = 1.0, on_lost=None
    ):
        self.client, self.index, self.count = client, index, count
        self.timeout_s, self.period_s = timeout_s, period_s
        self.on_lost = on_lost or (lambda line: exit_now(line, 1))
        self.lost: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="tianjax-peers", daemon=True)
        self._thread.start()

    def _key(self, i: int) -> str:
        return f"tianjax/alive/{i}"

    def announce_failure(self, why: str) -> None:
        """Tells the other learners this one is failing, so they end with that line rather
        than with JAX's abort when this process (maybe the coordination service's host)
        exits; then waits a moment for them to read it."""
        self._stop.set()  # this learner's own watch must not report its own failure
        try:
            self.client.key_value_set(FAILED_KEY, why, allow_overwrite=True)
        except Exception:  # noqa: BLE001 - the service may be gone already
            return
        time.sleep(2 * self.period_s + 0.5)

    def _try_get(self, key: str) -> str | None:
        try:
            return self.client.key_value_try_get(key)
        except Exception as e:  # noqa: BLE001
            if "NOT_FOUND" in str(e):
                return None  # that learner has not beaten yet
            raise

    def _watch(self) -> None:
        beat = 0
        seen: dict[int, tuple[str, float]] = {}
        start = time.monotonic()
        while not self._stop.wait(self.period_s):
            beat += 1
            now = time.monotonic()
            try:
                self.client.key_value_set(self._key(self.index), str(beat), allow_overwrite=True)
                failed = self._try_get(FAILED_KEY)
                if failed is not None:
                    self._report(failed)
                    return
                for j in range(self.count):
                    if j == self.index:
                        continue
                    value = self._try_get(self._key(j))
                    if j not in seen or seen[j][0] != value:
                        seen[j] = (value, now)
            except Exception as e:  # noqa: BLE001 - the service is gone with its host
                if self._stop.is_set():
                    return
                self._report(
                    f"the coordination service (learner 0) stopped answering "
                    f"({type(e).__name__}: {str(e).splitlines()[0][:120]})"
                )
                return
            for j in range(self.count):
                if j == self.index:
                    continue
                last = seen.get(j, (None, start))[1]
                if now - last > self.timeout_s:
                    self._report(
                        f"learner process {j} sent no heartbeat for {self.timeout_s:g} s "
                        "(runtime.heartbeat_timeout_s)"
                    )
                    return

    def _report(self, why: str) -> None:
        self.lost = why
        self.on_lost(
            f"tianjax: error: learner {self.index}/{self.count}: {why}; stopping; "
            "the last checkpoint stands"
        )

    def close(self) -> None:
        self._stop.set()


__all__ = ["PeerWatch", "SigtermWatchdog", "exit_now", "exit_on_abort"]
