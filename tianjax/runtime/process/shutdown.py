"""A process-wide stop request, set by the launchers' SIGTERM (and the CLI's Ctrl-C)
handlers, and the critical sections a stop must not cut into.

NOTE: a handler that only raises KeyboardInterrupt can have its exception swallowed when
the signal lands inside a callback that ignores exceptions (JAX's garbage-collection
hook does), and the process would keep running; the loops therefore also poll this flag.
A handler must not raise inside a critical section either: between a jitted update that
donates the state's buffers and the assignment of its result, an exception would leave
the process with no valid state to checkpoint. There it only sets the flag, and the
loop's next check() stops the run.

The distributed learner's whole loop is such a section: its main thread shares locks and
conditions with the receiver, publisher and read-back threads, starts actor processes and
owns ZeroMQ sockets, and an exception raised between any two bytecodes there (inside a
`with lock:` just acquired, or a Popen half done) can leave a lock held or a process
untracked, and the stop itself hung. The loop polls the flag every pass instead.
"""

from __future__ import annotations

import contextlib
import sys


class _Flag:
    """The stop flag: set by signal handlers, read by loops in any thread.

    NOTE: not a threading.Event. Event.set() takes a lock, and a handler runs in the main
    thread between two bytecodes, so a signal landing while that thread is inside Event.set()
    (in the handler of an earlier signal: a killed launcher's threads each send its actors
    their parent-death SIGTERM as they exit) waits forever for a lock its own thread holds.
    One attribute, read and written under the GIL, needs no lock."""

    __slots__ = ("_value",)

    def __init__(self):
        self._value = False

    def is_set(self) -> bool:
        return self._value

    def set(self) -> None:
        self._value = True

    def clear(self) -> None:
        self._value = False


requested = _Flag()
_critical = 0
_prior_unraisable_hook = None


def _unraisable(unraisable) -> None:
    """The stop's KeyboardInterrupt, raised where Python cannot pass it on (the signal
    landed in a destructor, such as a ZeroMQ frame's), is dropped: the flag is set, and the
    loop's next check() raises it again where it unwinds. Python would print it as a
    traceback in the middle of a clean stop."""
    if requested.is_set() and isinstance(unraisable.exc_value, KeyboardInterrupt):
        return
    _prior_unraisable_hook(unraisable)


def _install_unraisable_hook() -> None:
    """Installs `_unraisable` once, when the first stop is requested: importing tianjax
    leaves the interpreter's hooks alone."""
    global _prior_unraisable_hook
    if sys.unraisablehook is not _unraisable:
        _prior_unraisable_hook = sys.unraisablehook
        sys.unraisablehook = _unraisable


def check() -> None:
    """Raises KeyboardInterrupt if a stop was requested (call it from long-running loops)."""
    if requested.is_set():
        raise KeyboardInterrupt("stop requested")


@contextlib.contextmanager
def critical():
    """A section that a signal handler must not interrupt (see the module's note)."""
    global _critical
    _critical += 1
    try:
        yield
    finally:
        _critical -= 1


def request(reason: str = "SIGTERM", exit_code: int | None = None) -> None:
    """What a signal handler calls: asks the run to stop, at once unless in a critical
    section (then at the loop's next check), by KeyboardInterrupt, or with `exit_code`
    by SystemExit (an actor). A repeated signal does nothing: the stop is under way, and a
    second exception would cut into its clean-up (closing sockets, the final checkpoint).
    The flag is set first: an exception raised inside a callback that swallows it is lost,
    and the loops' checks stop the run instead."""
    if requested.is_set():
        return
    _install_unraisable_hook()  # before the flag: the KeyboardInterrupt below may land in a destructor
    requested.set()
    if _critical == 0:
        raise KeyboardInterrupt(reason) if exit_code is None else SystemExit(exit_code)


__all__ = ["check", "critical", "request", "requested"]
