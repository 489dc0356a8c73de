"""The runtime shell: loops that call the pure core and do the I/O around it.

By stage: `actor` (sources of rollouts, the actor process), `learner` (the learner
process, from ingress and pool to the update over the mesh and the publisher), `balance`
(measures, limits and the set-point controller), `modes` (how sync and async differ, one
strategy object), `runners` (fused, in-process, local, multi-host: one Runner shape),
`record` (episodes, records, checkpoints, results, saved runs), `evaluation` (evaluation
during training: schedule, episodes, videos, best params, the evaluator), `process` (shutdown,
resources, the compile cache).

Import from here; `runners` is a face of its own (each runner module, for a benchmark that
tunes one). Each name is imported on first use: `import tianjax` reads the runners' face,
not the sockets and threads of a multi-process run.
"""

_LAZY = {  # name -> the module that holds it
    # running a config: the runner of its mode, the shape every runner has, what it returns
    "Runner": "tianjax.runtime.runners",
    "runner_for": "tianjax.runtime.runners",
    "RunOutcome": "tianjax.runtime.record.outcome",
    # how sync and async differ, one strategy object
    "ASYNC": "tianjax.runtime.modes",
    "SYNC": "tianjax.runtime.modes",
    "Mode": "tianjax.runtime.modes",
    "mode_of": "tianjax.runtime.modes",
    # grids of fused runs (tianjax sweep), from Python
    "make_points": "tianjax.runtime.runners.sweep",
    "run_sweep": "tianjax.runtime.runners.sweep",
    "use_cpu_cores": "tianjax.runtime.runners.sweep",  # one XLA:CPU device per core
    # a multi-process run's stages, each usable alone (the scaling study times each)
    "batch_template": "tianjax.runtime.actor.sources",  # the trajectory an actor sends
    "make_source": "tianjax.runtime.actor.sources",  # an actor's rollouts, JAX or host env
    "batch_axis": "tianjax.runtime.learner.batches.axes",
    "concat_batches": "tianjax.runtime.learner.batches.axes",  # actor batches joined
    "check_finite": "tianjax.runtime.learner.receiver",  # the receiver's check on arrival
    "ShardedUpdate": "tianjax.runtime.learner.sharded_update",  # the update over a mesh
    "AdaptiveBalance": "tianjax.runtime.balance.controller",  # the staleness set-point
    # the replay log of an async run (tianjax replay redoes the run from it)
    "REPLAY_LOG": "tianjax.runtime.record.replay_log",
    "ReplayLog": "tianjax.runtime.record.replay_log",
    "params_sha256": "tianjax.runtime.record.replay_log",
    # evaluation during training: when one is due, and one evaluation of a pinned version
    "EvalSchedule": "tianjax.runtime.evaluation.schedule",
    "Evaluation": "tianjax.runtime.evaluation.play",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(_LAZY) + ["runners"]
