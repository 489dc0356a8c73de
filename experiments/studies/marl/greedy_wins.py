"""The greedy policy's win rate of saved SMAX runs, from their newest checkpoints.

    .venv/bin/python experiments/studies/marl/greedy_wins.py RUN_DIR [RUN_DIR ...] [--battles 200]

Plays `--battles` battles side by side with each run's greedy policy (`tianjax.evaluate`,
as `tianjax eval` does: each env's first battle counts) and prints the win rate and the
mean return. A run trained with `eval.episodes` has the same figure in its summary.json
(`eval_win_rate`); this reads it off runs trained without.
"""

from __future__ import annotations

import argparse

import numpy as np

import tianjax


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--battles", type=int, default=200)
    ap.add_argument("--seed", type=int, default=123)
    args = ap.parse_args(argv)
    for path in args.runs:
        ev = tianjax.evaluate(path, episodes=args.battles, seed=args.seed)
        if ev.won is None:
            raise SystemExit(f"{path}: its env reports no wins (not SMAX)")
        print(
            f"{path}: step {ev.step}, greedy win rate {ev.win_rate:.3f} over {args.battles} battles, "
            f"mean return {float(np.mean(ev.returns)):.2f}"
        )


if __name__ == "__main__":
    main()
