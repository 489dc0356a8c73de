"""File descriptors for a learner that others can connect to, and resource errors as one line.

Every TCP connection to a learner's ports is a descriptor in the learner process, taken
by ZeroMQ's I/O thread before any handshake; the same per-process limit must also cover
the checkpoints orbax writes and the metrics files. So at start the soft limit is raised
to the hard one (`raise_fd_limit`), and a `FdReserve` holds a few descriptors that are
handed back just for the moment a checkpoint is written: if peers have taken every other
descriptor, the checkpoint still gets the reserve's.

`describe_os_error` turns what the OS says when a run directory's disk is full, the
descriptors are exhausted or a port is taken into the one line the CLI prints.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import sys

RESERVE_FDS = 64  # what one orbax save and the log files need at once, with room to spare


def raise_fd_limit() -> int:
    """Raises this process's soft RLIMIT_NOFILE to its hard limit; returns the new soft
    limit (the old one where the hard limit is unlimited or cannot be read)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return target
        except (ValueError, OSError):
            pass
    return soft


def open_fds() -> int:
    """Descriptors this process holds now (Linux; -1 where /proc is missing)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return -1


class FdReserve:
    """Holds `n` descriptors (of /dev/null) and lends them back for a block:

        with reserve.released():
            write_checkpoint()

    NOTE: after the block the reserve is taken again as far as it can be; descriptors a
    flood took in the meantime shrink it until they are freed, never below zero.
    """

    def __init__(self, n: int = RESERVE_FDS):
        self.n = n
        self._fds: list[int] = []
        self._fill()

    def _fill(self) -> None:
        while len(self._fds) < self.n:
            try:
                self._fds.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
            except OSError:
                return

    def __len__(self) -> int:
        return len(self._fds)

    @contextlib.contextmanager
    def released(self):
        self._release()
        try:
            yield
        finally:
            self._fill()

    def _release(self) -> None:
        for fd in self._fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds = []

    def close(self) -> None:
        self._release()
        self.n = 0


def describe_os_error(e: OSError) -> str | None:
    """One line for a resource error a run cannot go on from, or None for any other. The
    error's filename (the run's checkpoint directory, a port) says where."""
    where = f" ({e.filename})" if e.filename else ""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        run = os.path.dirname(os.path.normpath(e.filename)) if e.filename else "RUN_DIR"
        return (
            f"no space left on the device{where}; the checkpoints before it are intact: free "
            f"some and continue with resume={run}"
        )
    if e.errno in (errno.EMFILE, errno.ENFILE):
        return (
            f"out of file descriptors{where}: {open_fds()} open, limit "
            f"{resource.getrlimit(resource.RLIMIT_NOFILE)[0]}; raise the hard limit (ulimit -Hn)"
        )
    if e.errno == errno.EADDRINUSE:
        return f"address already in use{where}: another process holds the port; pick another (--base-port)"
    return None


def warn(line: str) -> None:
    print(f"tianjax: warning: {line}", file=sys.stderr, flush=True)


__all__ = ["FdReserve", "RESERVE_FDS", "describe_os_error", "open_fds", "raise_fd_limit"]
