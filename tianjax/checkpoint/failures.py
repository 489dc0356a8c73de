"""How a checkpoint's failures reach the user: one `tianjax: error:` line for a full disk or
an exhausted descriptor limit, not the tracebacks orbax's and tensorstore's threads print
for each. Used by tianjax.checkpoint.store."""

from __future__ import annotations

import contextlib
import errno
import logging
import sys


@contextlib.contextmanager
def quiet_loggers(names):
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def resource_errno(e: BaseException) -> int | None:
    """ENOSPC or EMFILE if that is what failed under `e` (orbax reports OS errors inside
    ValueErrors from tensorstore), else None."""
    while e is not None:
        if isinstance(e, OSError) and e.errno in (
            errno.ENOSPC,
            errno.EDQUOT,
            errno.EMFILE,
            errno.ENFILE,
        ):
            return e.errno
        text = str(e)
        if "No space left on device" in text or "os_error_code='28'" in text:
            return errno.ENOSPC
        if "Too many open files" in text:
            return errno.EMFILE
        e = e.__cause__ or e.__context__
    return None


class ErrorLinesOnly:
    """A stderr that passes only `tianjax:` lines (and the newline that ends each)."""

    def __init__(self, out):
        self._out, self._passing = out, False

    def write(self, text: str) -> int:
        if text.startswith("tianjax:") or (self._passing and text == "\n"):
            self._passing = text != "\n"
            return self._out.write(text)
        self._passing = False
        return len(text)

    def flush(self) -> None:
        self._out.flush()

    def __getattr__(self, name):
        return getattr(self._out, name)


class HeldStderr:
    """Holds what is written to sys.stderr inside the block and writes it out at the end,
    unless the block failed for want of space or descriptors: then its threads' tracebacks
    are dropped, and sys.stderr goes straight from the buffer to ErrorLinesOnly, so a thread
    of orbax's printing into its closed event loop finds no moment with the bare stderr."""

    def __enter__(self):
        import io

        self._real, self._buf = sys.stderr, io.StringIO()
        sys.stderr = self._buf
        return self

    def __exit__(self, *exc):
        if exc[0] is not None and resource_errno(exc[1]) is not None:
            only_error_lines(self._real)
            return False
        sys.stderr = self._real
        text = self._buf.getvalue()
        if text:
            self._real.write(text)
        return False


def only_error_lines(out=None) -> None:
    """Makes sys.stderr pass only `tianjax:` lines to `out` (sys.stderr by default), in one
    assignment. NOTE: after a full disk or descriptor limit the run ends with one line;
    closing orbax's manager then lets tensorstore's threads call into its closed event loop,
    and each prints a traceback. Nothing this process writes to stderr afterwards is news."""
    out = sys.stderr if out is None else out
    sys.stderr = out if isinstance(out, ErrorLinesOnly) else ErrorLinesOnly(out)


__all__ = ["ErrorLinesOnly", "HeldStderr", "only_error_lines", "quiet_loggers", "resource_errno"]
