"""A run's record, shared by every runner and the learner: episodes and their moving
average, metrics records, checkpoints and the result (`recorder`); what a runner hands
`train()` (`outcome`); and reading a finished run back to evaluate it (`saved_runs`)."""

from tianjax.runtime.record.outcome import RunOutcome

__all__ = ["RunOutcome"]
