"""The parameter channel across a cut link (tianjax.transport.sockets.keep_alive), with a
real publisher and subscriber on two namespace hosts: after a 20 s cut, the subscriber
has a version published after the heal within 3 s of it.

Without heartbeats the publisher's connection keeps its queued versions in TCP's
retransmission back-off through the cut (its retries come 0.2, 0.6, 1.4, ... 12.6, 25.4 s
after the cut), so the first version after the heal waits for the retry 25 s in, about
5 s after the heal.
"""

from __future__ import annotations

import os
import sys
import textwrap
import time

import pytest

from .conftest import REPO, wait_for_lines

PORT = 7101
CUT_S = 20.0
# binds the parameter channel on its host's address; publishes a version (64 KiB of
# parameters) every 50 ms and serves subscriptions, until killed
PUBLISHER = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    from tianjax.transport.params import ParamPublisher
    key = bytes.fromhex(os.environ["KEY"])
    tree = {"w": np.zeros(16384, np.float32)}
    with ParamPublisher(key, endpoint=f"tcp://{sys.argv[1]}:{sys.argv[2]}") as pub:
        v = 0
        while True:
            pub.serve_subscriptions()
            pub.publish(v, {"w": tree["w"] + v})
            v += 1
            time.sleep(0.05)
""")
# prints "<time.time()> <version>" for each version it takes, until killed
SUBSCRIBER = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    from tianjax.transport.params import ParamSubscriber
    key = bytes.fromhex(os.environ["KEY"])
    tree = {"w": np.zeros(16384, np.float32)}
    with ParamSubscriber(key, f"tcp://{sys.argv[1]}:{sys.argv[2]}", tree) as sub:
        while True:
            got = sub.latest(100)
            if got is not None:
                print(f"{time.time():.3f} {got[0]}", flush=True)
""")


def _received(path: str) -> list[tuple[float, int]]:
    with open(path) as f:
        return [(float(t), int(v)) for t, v in (line.split() for line in f if line.strip())]


@pytest.mark.slow
def test_versions_reach_an_actor_within_seconds_of_a_cut_link_healing(make_cluster, tmp_path):
    cluster = make_cluster(["learner", "actor"])
    env = {**os.environ, "KEY": os.urandom(32).hex(), "PYTHONPATH": str(REPO)}
    out = str(tmp_path / "sub.out")
    addr = cluster.addr("learner")
    procs = [cluster.run("learner", [sys.executable, "-c", PUBLISHER, addr, str(PORT)], env=env)]
    with open(out, "w") as f:
        procs.append(
            cluster.run(
                "actor", [sys.executable, "-c", SUBSCRIBER, addr, str(PORT)], env=env, stdout=f
            )
        )
    try:
        wait_for_lines(lambda: len(_received(out)), 20, procs, "no versions reached the subscriber")
        cluster.cut("actor")
        time.sleep(CUT_S)
        cluster.heal("actor")
        healed = time.time()
        deadline = time.monotonic() + 15
        while not [t for t, _ in _received(out) if t > healed]:
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)
        after = [(t, v) for t, v in _received(out) if t > healed]
        assert after, "no version reached the subscriber within 15 s of the heal"
        waited = after[0][0] - healed
        assert after[0][1] > max(v for t, v in _received(out) if t <= healed)
        assert waited < 3.0, f"the first version after the heal took {waited:.1f} s"
    finally:
        for p in procs:
            p.kill()
            p.wait()
