"""Command line: `tianjax train CONFIG [key=value ...]`.

Every bad input (unknown key, wrong type, missing file, bad env id, impossible sizes) ends
with a one-line message and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys


def _train(args) -> int:
    from tianjax.train import train

    result = train(args.config, args.overrides, progress=None if not args.no_progress else False)
    return 0 if result.summary is not None else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="tianjax", description="Fast distributed RL training in JAX.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("train", help="train a config: tianjax train CONFIG [key=value ...]")
    p.add_argument("config", help="a YAML file under configs/ (or your own)")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. ppo.lr=1e-3 num_envs=8")
    p.add_argument("--no-progress", action="store_true", help="no live progress bar")
    args = parser.parse_args(argv)

    from tianjax.config import ConfigError

    try:
        if args.command == "train":
            return _train(args)
    except ConfigError as e:
        print(f"tianjax: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tianjax: interrupted", file=sys.stderr)
        return 130
    return 1


if __name__ == "__main__":
    sys.exit(main())
