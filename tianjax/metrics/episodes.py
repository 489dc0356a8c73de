"""Finished-episode bookkeeping and the convergence time (the TianJi paper's metric).

Convergence time is the first wall-clock time, from the start of training (compilation
included), at which the moving average of the last `window` finished episodes' returns,
across all envs and actors, reaches the target return.
"""

from __future__ import annotations

import collections
import math
from typing import Iterable

import numpy as np


class EpisodeTracker:
    def __init__(self, target_return: float | None, window: int = 100):
        self.target = target_return
        self.window = window
        self._recent: collections.deque[float] = collections.deque(maxlen=window)
        self.episodes = 0
        self.convergence_time_s: float | None = None
        self.convergence_env_steps: int | None = None

    def add(self, returns: Iterable[float], env_steps: Iterable[int] | int, wall_time_s: float) -> None:
        """Adds finished episodes in the order they ended.

        `env_steps` is, per episode (or one number for all), the run's env-step count when
        it ended; `wall_time_s` is the time at which they were observed.
        """
        returns = [float(r) for r in returns]
        steps = [int(env_steps)] * len(returns) if isinstance(env_steps, (int, float)) else [int(s) for s in env_steps]
        for r, s in zip(returns, steps):
            if not math.isfinite(r):
                continue  # never let a corrupt return poison the average
            self._recent.append(r)
            self.episodes += 1
            if (self.convergence_time_s is None and self.target is not None
                    and len(self._recent) == self.window and self.moving_average >= self.target):
                self.convergence_time_s = float(wall_time_s)
                self.convergence_env_steps = s

    @property
    def moving_average(self) -> float:
        """Mean return of the last `window` episodes (fewer at the start); NaN before any."""
        return sum(self._recent) / len(self._recent) if self._recent else float("nan")

    @property
    def converged(self) -> bool:
        return self.convergence_time_s is not None

    def state_dict(self) -> dict:
        """Plain JSON-able state (for checkpoints); `load_state_dict` restores it."""
        return {"recent": list(self._recent), "episodes": self.episodes,
                "convergence_time_s": self.convergence_time_s,
                "convergence_env_steps": self.convergence_env_steps}

    def load_state_dict(self, state: dict) -> None:
        self._recent.clear()
        self._recent.extend(float(r) for r in state["recent"])
        self.episodes = int(state["episodes"])
        self.convergence_time_s = state["convergence_time_s"]
        self.convergence_env_steps = state["convergence_env_steps"]


def finished_episodes(done, returns, base_steps: int):
    """Episodes that ended in a batch of steps, in the order they ended.

    `done` and `returns` are [..., B] per env step (e.g. [T, B] or [K, T, B], time-major);
    returns (returns of the finished episodes, the run's env-step count at each end), where
    the first step of the batch ends at env step base_steps + B.
    """
    done = np.asarray(done)
    B = done.shape[-1]
    done2 = done.reshape(-1, B)
    steps = base_steps + (np.arange(done2.shape[0])[:, None] + 1) * B
    return np.asarray(returns).reshape(-1, B)[done2], np.broadcast_to(steps, done2.shape)[done2]
