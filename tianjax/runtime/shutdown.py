"""A process-wide stop request, set by the launchers' SIGTERM handlers.

NOTE: a handler that only raises KeyboardInterrupt can have its exception swallowed when
the signal lands inside a callback that ignores exceptions (JAX's garbage-collection
hook does), and the process would keep running; the loops therefore also poll this flag.
"""

from __future__ import annotations

import threading

requested = threading.Event()


def check() -> None:
    """Raises KeyboardInterrupt if a stop was requested (call it from long-running loops)."""
    if requested.is_set():
        raise KeyboardInterrupt("stop requested")
