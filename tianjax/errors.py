"""The ways a run fails that a user is told about in one line, caught by type.

    RunFailed            the run cannot go on; the CLI prints the message, exit code 1
      ActorFailure       an actor is out of restarts where the run needs it (sync, or none left)
      LearnerFailure     the learner process exited and is out of restarts
      LearnerStalled     no actor has delivered anything for longer than the timeout
      ReplayRefused      `tianjax replay` cannot redo a run bit for bit (said before it starts)

A bad config is `tianjax.config.ConfigError` (exit code 2), a bad checkpoint
`tianjax.checkpoint.CheckpointError`."""

from __future__ import annotations


class RunFailed(RuntimeError):
    """A run that cannot go on; the message says why and where to look."""


class ActorFailure(RunFailed):
    """An actor stopped and is out of restarts where the run cannot go on without it."""


class LearnerFailure(RunFailed):
    """The learner process exited and is out of restarts (or was stopped)."""


class OrderBroken(RunFailed):
    """The deterministic-lag mode lost what a round needs (a trajectory dropped as
    non-finite or with impossible versions, an update skipped): it cannot go on in order."""


class LearnerStalled(RunFailed):
    """No actor has delivered anything for longer than the configured timeout."""


class ReplayRefused(RunFailed):
    """A run that cannot be replayed bit for bit (tianjax.runtime.runners.rerun); the
    message says why."""


__all__ = [
    "ActorFailure",
    "LearnerFailure",
    "LearnerStalled",
    "OrderBroken",
    "ReplayRefused",
    "RunFailed",
]
