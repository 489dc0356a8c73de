"""The functional core: pure JAX, no sockets, threads, files or clocks.

A sample's way through it: `rollout` (the actor step and the lax.scan rollout, with
`episodes` bookkeeping) produces `types.Trajectory`; `staleness` and `returns` turn it into
weights and targets inside an algorithm's loss; `update` applies one guarded optimizer
step; `replay` holds off-policy samples; `fused_loop` runs it all in one jitted loop and
`evaluation` plays the greedy policy.

Import from here: `from tianjax.core import gae, Trajectory`, or a part as a namespace,
`from tianjax.core import staleness as S`. Each name is imported on first use, so one core
module does not pull in the others (`import tianjax` reads only the few it needs).
"""

_LAZY = {  # name -> the module that holds it
    # the arrays a rollout, a loss and the wire exchange
    "ActionSpec": "tianjax.core.types",
    "Env": "tianjax.core.types",  # the JAX env protocol: reset and step, key first
    "MAObs": "tianjax.core.types",
    "ParamsMessage": "tianjax.core.types",  # what the learner publishes: params and version
    "Sequences": "tianjax.core.types",
    "Trajectory": "tianjax.core.types",
    "Transition": "tianjax.core.types",
    # what an algorithm is, and what it learns from
    "ActOutput": "tianjax.core.algorithm",
    "Algorithm": "tianjax.core.algorithm",
    "BufferKind": "tianjax.core.buffer_kind",
    "ON_POLICY": "tianjax.core.buffer_kind",
    "SEQUENCES": "tianjax.core.buffer_kind",
    "TRANSITIONS": "tianjax.core.buffer_kind",
    # RL math for one trajectory, vmapped by the caller
    "VTraceOutput": "tianjax.core.returns",
    "gae": "tianjax.core.returns",
    "traced_gae": "tianjax.core.returns",
    "vtrace": "tianjax.core.returns",
    "admissible": "tianjax.core.staleness",  # the one "too stale" rule
    "staleness_weights": "tianjax.core.staleness",
    "truncated_ratio": "tianjax.core.staleness",
    # the optimizer step an algorithm's update is built from
    "LearnerState": "tianjax.core.update",
    "gradient_step": "tianjax.core.update",
    "guarded": "tianjax.core.update",
    "init_state": "tianjax.core.update",
    "make_optimizer": "tianjax.core.update",
    # acting, evaluating and the fused trainer, as pure functions
    "RolloutState": "tianjax.core.rollout",
    "make_rollout": "tianjax.core.rollout",
    "team_reward": "tianjax.core.episodes",  # a multi-agent env's reward as one team's
    "make_evaluator": "tianjax.core.evaluation",
    "play_episodes": "tianjax.core.evaluation",  # the same, pure: inside a jitted program
    "EvalOutput": "tianjax.core.evaluation",
    "FusedState": "tianjax.core.fused_loop",
    "make_fused": "tianjax.core.fused_loop",
}
# parts read as namespaces: their names are generic (sample, mode, constant, ...)
_SUBMODULES = ["distributions", "replay", "returns", "rollout", "staleness"]


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(_LAZY) + _SUBMODULES
