"""The process-wide stop (runtime/shutdown.py).

- A SIGTERM that lands inside a destructor (a ZeroMQ frame's, once in CI) raises its
  KeyboardInterrupt where Python cannot pass it on. The run still stops at the loop's next
  check; the interrupt must not be printed as a traceback in the middle of a clean stop,
  and other errors there still are.
- A burst of SIGTERMs (a killed launcher's actors get one per exiting thread) stops a
  process once: no hang inside the handler, no second exception into the clean-up."""

import os
import signal
import subprocess
import sys
import time

import pytest

SCRIPT = """
from tianjax.runtime.process import shutdown

class Raises:
    def __init__(self, exc):
        self.exc = exc
    def __del__(self):
        raise self.exc

Raises(KeyboardInterrupt("before"))   # no stop requested: printed as Python does
with shutdown.critical():             # as a signal handler asks for the stop
    shutdown.request("SIGTERM")
Raises(KeyboardInterrupt("SIGTERM"))  # the stop's own: dropped
Raises(ValueError("other"))           # anything else: printed
try:
    shutdown.check()
except KeyboardInterrupt:
    print("check raised")
"""


def test_a_stop_raised_in_a_destructor_is_not_printed_but_still_stops():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "KeyboardInterrupt: before" in out.stderr
    assert "SIGTERM" not in out.stderr
    assert "ValueError: other" in out.stderr
    assert out.stdout.strip() == "check raised"


def test_importing_tianjax_changes_no_interpreter_hook():
    script = (
        "import sys; hooks = (sys.unraisablehook, sys.excepthook, sys.breakpointhook)\n"
        "import tianjax, tianjax.train, tianjax.runtime.process.shutdown, tianjax.cli\n"
        "print((sys.unraisablehook, sys.excepthook, sys.breakpointhook) == hooks)"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert out.stdout.strip() == "True", out.stderr


BURST = """
import signal, sys, time
from tianjax.launch.role import stop_actor

signal.signal(signal.SIGTERM, stop_actor)
try:
    print("ready", flush=True)
    while True:
        time.sleep(0.001)
finally:
    # clean-up that takes a while (closing sockets, a ZeroMQ context): the rest of the
    # burst lands here and inside the handler itself
    t = time.monotonic()
    while time.monotonic() - t < 0.5:
        pass
    print("cleaned up", flush=True)
"""


def test_an_actor_stops_once_on_a_burst_of_sigterms():
    # a SIGKILLed launcher's threads each send its actors their parent-death SIGTERM as they
    # exit: a burst, whose later signals land inside the first one's handler and clean-up.
    # The handler once took a lock there (threading.Event.set) and the actor hung for good.
    p = subprocess.Popen([sys.executable, "-c", BURST], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline and p.poll() is None:
            for _ in range(200):
                try:
                    os.kill(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    break
        # 143 from the handler, or the default action of a signal that lands after Python
        # has put its handlers away on the way out
        assert p.wait(timeout=20) in (143, -signal.SIGTERM)
        assert p.stdout.read().strip() == "cleaned up"  # the clean-up ran once, to its end
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_a_repeated_stop_request_does_not_raise_again():
    from tianjax.runtime.process import shutdown

    shutdown.requested.clear()
    try:
        with pytest.raises(KeyboardInterrupt):
            shutdown.request("SIGTERM")
        shutdown.request("SIGTERM")  # the stop is under way: its clean-up is not cut into
        assert shutdown.requested.is_set()
    finally:
        shutdown.requested.clear()
