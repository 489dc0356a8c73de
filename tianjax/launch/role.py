"""Entry point of one role process: `python -m tianjax.launch.role actor ...`."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys


def _die_with_parent(parent_pid: int | None) -> None:
    """Linux: ask for SIGTERM when the launching process dies, so no actor is orphaned."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            PR_SET_PDEATHSIG = 1
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        except OSError:
            pass
    # NOTE: a launcher that died before the prctl above sends no signal: we already have
    # another parent, and would otherwise wait out connect_timeout_s for a dead learner.
    if parent_pid is not None and os.getppid() != parent_pid:
        sys.exit(143)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="tianjax-role")
    ap.add_argument("role", choices=["actor"])
    ap.add_argument("--actor-id", type=int, required=True)
    ap.add_argument("--config-json", required=True)
    ap.add_argument("--endpoints-json", required=True)
    ap.add_argument("--parent-pid", type=int, help="the launcher's pid: exit if it is gone")
    args = ap.parse_args(argv)
    _die_with_parent(args.parent_pid)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    from tianjax.config import load_config
    from tianjax.runtime.actor import Actor
    from tianjax.transport.auth import load_key

    config = load_config(json.loads(args.config_json))
    from tianjax.runtime import compile_cache

    compile_cache.enable(config.compile_cache)
    actor = Actor(config, args.actor_id, json.loads(args.endpoints_json), load_key())
    try:
        return actor.run()
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
