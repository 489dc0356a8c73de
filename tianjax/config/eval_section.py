"""The `eval` section: evaluation during training (RLlib's evaluation workers, Sample
Factory's and Stoix's evaluators): `episodes` episodes of one parameter version, every
`every_updates` learner updates or every `every_s` seconds, and once at the end.

Where it runs is the mode's: in fused mode inside the jitted chunk program (the episodes
vmapped); in sync and async mode in a process of its own that takes the newest parameters
as an actor does and never holds the learner up; with host envs in one process
(num_actors 0) between two iterations of that process's loop."""

from __future__ import annotations

from dataclasses import dataclass

from tianjax.config.checks import check_key


@dataclass(frozen=True)
class EvalConfig:
    episodes: int = 0  # episodes per evaluation (0: no evaluation; alone: one, at the end)
    every_updates: int | None = None  # learner updates between evaluations (null: every_s)
    every_s: float | None = None  # seconds of training between evaluations (null: only at the end)
    greedy: bool = True  # the policy's most likely action; false: sampled, as the actors act
    # One episode per evaluation as an mp4 under RUN_DIR/videos, also to TensorBoard and W&B
    # when those loggers are on (pip install "tianjax[video]")
    video: bool = False
    # The parameters of the best evaluation so far kept as RUN_DIR/best, a run directory of
    # their own (tianjax eval RUN_DIR/best, tianjax.load)
    keep_best: bool = False

    def __post_init__(self):
        check_key(self.episodes >= 0, "eval.episodes", f"must be >= 0, got {self.episodes}")
        check_key(
            self.every_updates is None or self.every_updates >= 1,
            "eval.every_updates",
            f"must be >= 1 or null, got {self.every_updates}",
        )
        check_key(
            self.every_s is None or self.every_s > 0,
            "eval.every_s",
            f"must be > 0 or null, got {self.every_s}",
        )
        check_key(
            self.every_updates is None or self.every_s is None,
            "eval.every_s",
            "set either eval.every_updates or eval.every_s, not both",
        )
        for key, asked in (
            ("every_updates", self.every_updates is not None),
            ("every_s", self.every_s is not None),
            ("video", self.video),
            ("keep_best", self.keep_best),
        ):
            check_key(
                not asked or self.episodes >= 1,
                f"eval.{key}",
                "needs eval.episodes >= 1 (0 turns evaluation off)",
            )

    @property
    def on(self) -> bool:
        """Whether the run evaluates at all."""
        return self.episodes > 0

    @property
    def periodic(self) -> bool:
        """Whether it evaluates during training (not only at the end)."""
        return self.every_updates is not None or self.every_s is not None


__all__ = ["EvalConfig"]
