"""The runners: one per way of running a config, all with one shape.

    Runner = (config, logger, progress) -> RunOutcome

    fused      rollout and update in one jitted loop (JAX envs; several seeds vmapped)
    inprocess  host envs stepped in this process, the update beside them (num_actors: 0)
    local      a learner and `num_actors` actor processes on this machine (sync or async)
    groups     `groups.count` learner groups and their averager on this machine, each group
               a learner process with its share of the actors
    multihost  one role of a run across hosts (`tianjax launch`: a learner of a
               jax.distributed mesh, or an actor); not chosen by `runner_for`

`runner_for(config)` picks the runner of a config; `tianjax.train()` calls it. Beside them:
`preflight` and `dryrun` (what a run checks before it starts), `train_fn` (a fused run as
pure functions for jit and vmap: `tianjax.make_train`) and `sweep` (grids of fused runs).
Adding a mode is one runner here.
"""

from __future__ import annotations

from typing import Protocol

from tianjax.config import Config
from tianjax.runtime.record.outcome import RunOutcome


class Runner(Protocol):
    def __call__(self, config: Config, logger, progress) -> RunOutcome: ...


def runner_for(config: Config) -> Runner:
    """The runner of `config` (imported on first use: each pulls in what it needs)."""
    if config.mode == "fused":
        from tianjax.runtime.runners.fused import run_fused

        return run_fused
    if config.num_actors == 0:
        from tianjax.runtime.runners.inprocess import run_host

        return run_host
    if config.groups.enabled:
        from tianjax.runtime.runners.groups import run_groups

        return run_groups
    from tianjax.runtime.runners.local import run_local

    return run_local


# with the runner modules themselves, each imported when named (a benchmark sets
# fused.CHUNK_SECONDS, how long one chunk of a fused run aims to take)
__all__ = [
    "RunOutcome",
    "Runner",
    "runner_for",
    "fused",
    "inprocess",
    "local",
    "groups",
    "multihost",
    "group_roles",
]
