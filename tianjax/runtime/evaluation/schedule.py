"""When the next evaluation is due: every `eval.every_updates` learner updates (at the
first version at or past each multiple: an evaluator that takes the newest version may
skip some), or `eval.every_s` seconds after the version it last evaluated was taken; with
neither, only at the end. A pure class fed with the version and the clock."""

from __future__ import annotations

from tianjax.config.eval_section import EvalConfig


class EvalSchedule:
    def __init__(self, eval_config: EvalConfig, version: int = 0, now: float = 0.0):
        """Counts from `version` taken at `now` (a resumed run's version: no evaluation of
        it again)."""
        self.every_updates, self.every_s = eval_config.every_updates, eval_config.every_s
        self.last_version, self.last_time = version, now

    def due(self, version: int, now: float) -> bool:
        """Whether `version`, held at `now`, is to be evaluated."""
        if version <= self.last_version:
            return False
        if self.every_updates is not None:
            return version // self.every_updates > self.last_version // self.every_updates
        if self.every_s is not None:
            return now - self.last_time >= self.every_s
        return False

    def done(self, version: int, now: float) -> None:
        """`version` was evaluated, taken at `now`."""
        self.last_version, self.last_time = version, now

    def updates_to_next(self, version: int) -> int | None:
        """With every_updates: updates from `version` to the next one due (None otherwise)."""
        if self.every_updates is None:
            return None
        return self.every_updates - version % self.every_updates


__all__ = ["EvalSchedule"]
