"""How a failed checkpoint save reaches stderr (tianjax.checkpoint.failures)."""

from __future__ import annotations

import contextlib
import errno
import io
import sys

import pytest

from tianjax.checkpoint.failures import ErrorLinesOnly, HeldStderr


@contextlib.contextmanager
def own_stderr():
    # set in the test's body: pytest's capture sets sys.stderr again between the phases
    real, sys.stderr = sys.stderr, io.StringIO()
    try:
        yield sys.stderr
    finally:
        sys.stderr = real


def test_a_full_disk_leaves_stderr_filtered_with_no_bare_moment():
    with own_stderr() as stderr:
        # orbax's threads print tracebacks into a closed event loop after the failed save; the
        # one that grabs sys.stderr right after the block must find the filter, not the bare one
        with pytest.raises(OSError), HeldStderr():
            print("Traceback (most recent call last):", file=sys.stderr)
            raise OSError(errno.ENOSPC, "No space left on device")
        assert isinstance(sys.stderr, ErrorLinesOnly)
        print("Traceback (most recent call last):", file=sys.stderr)
        print("tianjax: error: no space left on the device", file=sys.stderr)
        assert stderr.getvalue() == "tianjax: error: no space left on the device\n"


def test_other_failures_and_success_give_back_what_was_held():
    with own_stderr() as stderr:
        with pytest.raises(ValueError), HeldStderr():
            print("a warning", file=sys.stderr)
            raise ValueError("not a resource")
        assert sys.stderr is stderr
        with HeldStderr():
            print("another", file=sys.stderr)
        assert sys.stderr is stderr and stderr.getvalue() == "a warning\nanother\n"
