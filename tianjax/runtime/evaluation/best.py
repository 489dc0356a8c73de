"""The parameters of the best evaluation so far, kept as RUN_DIR/best (`eval.keep_best`).

RUN_DIR/best is a run directory of its own: the run's config.yaml and one checkpoint,
labelled by the version it holds, of the learner's parameters only (not resumable: the
optimizer state, the envs and the counters stay in RUN_DIR/checkpoints). So `tianjax eval
RUN_DIR/best` and `tianjax.load(RUN_DIR/best)` play it as they play any run. Its meta says
which version and env steps it is and the evaluation that chose it. A newer best replaces
it; a restarted evaluator or a resumed run reads what is there and keeps the better.
NOTE: two processes may offer at once (the evaluator and, at the end, the learner's final
evaluation): an offer holds an exclusive lock on RUN_DIR/best.lock and compares with what
is on disk under it.
"""

from __future__ import annotations

import fcntl
import os
import shutil

import jax
import numpy as np

from tianjax.checkpoint import store as ckpt

BEST_DIR = "best"


class BestParams:
    def __init__(self, run_dir: str):
        self.root = os.path.join(os.path.abspath(run_dir), BEST_DIR)
        self.best_return: float | None = self._on_disk()

    def _on_disk(self) -> float | None:
        if not ckpt.has_checkpoint(self.root):
            return None
        try:
            return float(ckpt.read_meta(self.root)["eval_return"])
        except (ckpt.CheckpointError, KeyError, TypeError, ValueError):
            return None

    def better(self, eval_return: float) -> bool:
        return self.best_return is None or eval_return > self.best_return

    def offer(self, params, version: int, env_steps: int, eval_return: float) -> bool:
        """Keeps `params` (of `version`) if `eval_return` beats the kept one; returns whether."""
        if not self.better(eval_return):
            return False
        run_dir = os.path.dirname(self.root)
        with open(self.root + ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self.best_return = self._on_disk()  # another process's offer may have come first
            if not self.better(eval_return):
                return False
            self._write(run_dir, params, version, env_steps, eval_return)
        self.best_return = float(eval_return)
        return True

    def _write(self, run_dir: str, params, version: int, env_steps: int, eval_return: float):
        os.makedirs(self.root, exist_ok=True)
        config = os.path.join(run_dir, "config.yaml")
        if os.path.exists(config):
            shutil.copyfile(config, os.path.join(self.root, "config.yaml"))
        saver = ckpt.Checkpointer(self.root, keep=1)
        try:
            host = jax.tree.map(np.asarray, jax.device_get(params))
            saver.save(
                int(version),
                {"learner": {"params": host}},
                {
                    "updates": int(version),
                    "env_steps": int(env_steps),
                    "eval_return": float(eval_return),
                },
            )
        finally:
            saver.close()


__all__ = ["BEST_DIR", "BestParams"]
