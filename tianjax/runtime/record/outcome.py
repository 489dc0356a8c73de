"""`RunOutcome`: what a runner (fused, host, local, a learner process) hands `train()`.

The trained parameters, the objects they belong to, and the run's figures, which
`train()` writes into summary.json. A learner run in its own process reports the figures
as JSON (`to_json`, `from_json`) and its parameters through its final checkpoint."""

from __future__ import annotations

from typing import Any, NamedTuple


class RunOutcome(NamedTuple):
    params: Any  # the final parameters (leading seed axis with several seeds)
    algo: Any  # the Algorithm (None when the learner ran in another process)
    env: Any  # the JAX env of a fused run (None elsewhere)
    env_steps: int  # env steps of every seed together
    updates: int  # gradient steps (the learner's version)
    skipped_updates: int  # updates skipped for a non-finite loss or gradient
    train_time_s: float  # this session's training time
    compile_time_s: float
    env_steps_per_s: float  # this session's env steps over its training time
    episodes: int
    final_return: float | None  # moving average of the last 100 episodes' returns
    convergence_time_s: float | None  # when the target was reached (slowest seed); None: never
    convergence_env_steps: int | None
    extra_summary: dict  # runner-specific figures summary.json also holds (rates, restarts, ...)
    final_win_rate: float | None = None  # envs that report wins (SMAX)
    final_return_per_seed: list | None = None  # several seeds side by side
    resumed_from_step: int | None = None  # the checkpoint a resumed run started from
    interrupted: bool = False  # stopped by Ctrl-C / SIGTERM
    wall_offset_s: float = 0.0  # wall time of the run being resumed, before this session

    def to_json(self) -> dict:
        """The figures (no parameters or objects), as JSON holds them."""
        return {k: v for k, v in self._asdict().items() if k not in _OBJECTS}

    @classmethod
    def from_json(cls, figures: dict, *, params: Any = None) -> RunOutcome:
        return cls(params=params, algo=None, env=None, **figures)


_OBJECTS = ("params", "algo", "env")

__all__ = ["RunOutcome"]
