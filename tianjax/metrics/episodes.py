"""Finished-episode bookkeeping and the convergence time (the TianJi paper's metric).

Convergence time is the first wall-clock time, from the start of training (compilation
included), at which the moving average of the last `window` finished episodes' returns,
across all envs and actors, reaches the target return.
"""

from __future__ import annotations

import collections
import math
from typing import Iterable


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
