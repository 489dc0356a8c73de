"""Finished-episode bookkeeping and the convergence time (the TianJi paper's metric).

Convergence time is the first wall-clock time, from the start of training (compilation
included), at which the moving average of the last `window` finished episodes' returns,
across all envs and actors, reaches the target return. For envs that report wins (SMAX)
the tracker also keeps the win rate of the last `window` episodes, and a target win rate,
where one is set, is what convergence means instead.
"""

from __future__ import annotations

import collections
import math
from typing import Iterable

import numpy as np


class EpisodeTracker:
    def __init__(
        self, target_return: float | None, window: int = 100, target_win_rate: float | None = None
    ):
        self.target = target_return
        self.target_win_rate = target_win_rate
        self.window = window
        self._recent: collections.deque[float] = collections.deque(maxlen=window)
        self._wins: collections.deque[bool] = collections.deque(maxlen=window)
        self.reports_wins = False  # set once any episode came with a win flag
        self.episodes = 0
        self.convergence_time_s: float | None = None
        self.convergence_env_steps: int | None = None

    def add(
        self,
        returns: Iterable[float],
        env_steps: Iterable[int] | int,
        wall_time_s: float,
        wins: Iterable[bool] | None = None,
    ) -> None:
        """Adds finished episodes in the order they ended.

        `env_steps` is, per episode (or one number for all), the run's env-step count when
        it ended; `wall_time_s` is the time at which they were observed; `wins`, for envs
        that report them, whether each episode was won.
        """
        returns = [float(r) for r in returns]
        steps = (
            [int(env_steps)] * len(returns)
            if isinstance(env_steps, (int, float))
            else [int(s) for s in env_steps]
        )
        won = [None] * len(returns) if wins is None else [bool(w) for w in wins]
        if wins is not None:
            self.reports_wins = True
        for r, s, w in zip(returns, steps, won):
            if not math.isfinite(r):
                continue  # never let a corrupt return poison the average
            self._recent.append(r)
            if w is not None:
                self._wins.append(w)
            self.episodes += 1
            if (
                self.convergence_time_s is None
                and len(self._recent) == self.window
                and self._reached()
            ):
                self.convergence_time_s = float(wall_time_s)
                self.convergence_env_steps = s

    def _reached(self) -> bool:
        if self.target_win_rate is not None:
            return len(self._wins) == self.window and self.win_rate >= self.target_win_rate
        return self.target is not None and self.moving_average >= self.target

    @property
    def win_rate(self) -> float:
        """Share of the last `window` episodes won (fewer at the start); NaN before any."""
        return sum(self._wins) / len(self._wins) if self._wins else float("nan")

    @property
    def moving_average(self) -> float:
        """Mean return of the last `window` episodes (fewer at the start); NaN before any."""
        return sum(self._recent) / len(self._recent) if self._recent else float("nan")

    @property
    def converged(self) -> bool:
        return self.convergence_time_s is not None

    def state_dict(self) -> dict:
        """Plain JSON-able state (for checkpoints); `load_state_dict` restores it."""
        return {
            "recent": list(self._recent),
            "wins": list(self._wins),
            "episodes": self.episodes,
            "convergence_time_s": self.convergence_time_s,
            "convergence_env_steps": self.convergence_env_steps,
        }

    def load_state_dict(self, state: dict) -> None:
        self._recent.clear()
        self._recent.extend(float(r) for r in state["recent"])
        self._wins.clear()
        self._wins.extend(bool(w) for w in state.get("wins", []))
        self.reports_wins = self.reports_wins or bool(self._wins)
        self.episodes = int(state["episodes"])
        self.convergence_time_s = state["convergence_time_s"]
        self.convergence_env_steps = state["convergence_env_steps"]


def finished_episodes(done, returns, base_steps: int, won=None):
    """Episodes that ended in a batch of steps, in the order they ended.

    `done` and `returns` are [..., B] per env step (e.g. [T, B] or [K, T, B], time-major);
    returns (returns of the finished episodes, the run's env-step count at each end), where
    the first step of the batch ends at env step base_steps + B; with `won` ([..., B]) also
    whether each was won.
    """
    done = np.asarray(done)
    B = done.shape[-1]
    done2 = done.reshape(-1, B)
    steps = base_steps + (np.arange(done2.shape[0])[:, None] + 1) * B
    out = np.asarray(returns).reshape(-1, B)[done2], np.broadcast_to(steps, done2.shape)[done2]
    if won is None:
        return out
    return (*out, np.asarray(won).reshape(-1, B)[done2])


__all__ = ["EpisodeTracker", "finished_episodes"]
