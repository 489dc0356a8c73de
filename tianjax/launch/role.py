"""Entry point of one role process: `python -m tianjax.launch.role actor ...`."""

from __future__ import annotations

import argparse
import json
import signal
import sys


def _die_with_parent() -> None:
    """Linux: ask for SIGTERM when the launching process dies, so no actor is orphaned."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="tianjax-role")
    ap.add_argument("role", choices=["actor"])
    ap.add_argument("--actor-id", type=int, required=True)
    ap.add_argument("--config-json", required=True)
    ap.add_argument("--endpoints-json", required=True)
    args = ap.parse_args(argv)
    _die_with_parent()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    from tianjax.config import load_config
    from tianjax.runtime.actor import Actor
    from tianjax.transport.auth import load_key

    config = load_config(json.loads(args.config_json))
    actor = Actor(config, args.actor_id, json.loads(args.endpoints_json), load_key())
    try:
        return actor.run()
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
