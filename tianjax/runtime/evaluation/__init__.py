"""Evaluation during training (the `eval` section): when an evaluation is due
(`schedule`), the episodes of one pinned parameter version on the config's env and what an
evaluation leaves besides its record (`play`: returns, the video, the best params),
one episode as a video (`recording`), the best parameters kept as a run directory (`best`),
and the evaluator process of a sync or async run (`evaluator`). The records themselves
are the run's record's (tianjax.runtime.record.evaluations)."""
