"""A process-wide stop request, set by the launchers' SIGTERM (and the CLI's Ctrl-C)
handlers, and the critical sections a stop must not cut into.

NOTE: a handler that only raises KeyboardInterrupt can have its exception swallowed when
the signal lands inside a callback that ignores exceptions (JAX's garbage-collection
hook does), and the process would keep running; the loops therefore also poll this flag.
A handler must not raise inside a critical section either: between a jitted update that
donates the state's buffers and the assignment of its result, an exception would leave
the process with no valid state to checkpoint. There it only sets the flag, and the
loop's next check() stops the run.
"""

from __future__ import annotations

import contextlib
import sys
import threading

requested = threading.Event()
_critical = 0
_prior_unraisable_hook = sys.unraisablehook


def _unraisable(unraisable) -> None:
    """The stop's KeyboardInterrupt, raised where Python cannot pass it on (the signal
    landed in a destructor, such as a ZeroMQ frame's), is dropped: the flag is set, and the
    loop's next check() raises it again where it unwinds. Python would print it as a
    traceback in the middle of a clean stop."""
    if requested.is_set() and isinstance(unraisable.exc_value, KeyboardInterrupt):
        return
    _prior_unraisable_hook(unraisable)


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


def request(reason: str = "SIGTERM") -> None:
    """What a signal handler calls: asks the run to stop, at once unless in a critical
    section (then at the loop's next check)."""
    requested.set()
    if _critical == 0:
        raise KeyboardInterrupt(reason)
