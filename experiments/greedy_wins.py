"""The greedy policy's win rate of saved SMAX runs, from their newest checkpoints.

    .venv/bin/python experiments/greedy_wins.py RUN_DIR [RUN_DIR ...] [--battles 200]

Plays `--battles` battles side by side with each run's greedy policy (tianjax.evaluation's
make_evaluator with wins=True: each env's first battle counts) and prints the win rate and
the mean return. A run trained with `eval_episodes` has the same figure in its summary.json
(`eval_win_rate`); this reads it off runs trained without.
"""

from __future__ import annotations

import argparse

import jax
import numpy as np

import tianjax.runs
from tianjax.envs.jax_env import make_jax_env
from tianjax.evaluation import make_evaluator
from tianjax.runtime.eval_runner import _as_tree_of


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--battles", type=int, default=200)
    ap.add_argument("--seed", type=int, default=123)
    args = ap.parse_args(argv)
    for path in args.runs:
        run = tianjax.runs.load(path)
        env = make_jax_env(run.config.env_backend, run.config.env, run.config.env_options)
        params = _as_tree_of(jax.eval_shape(run.algo.init, jax.random.key(0)).params, run.params)
        returns, won = make_evaluator(env, run.algo, args.battles, wins=True)(params, jax.random.key(args.seed))
        print(f"{path}: step {run.step}, greedy win rate {float(np.mean(won)):.3f} over {args.battles} battles, "
              f"mean return {float(np.mean(returns)):.2f}")


if __name__ == "__main__":
    main()
