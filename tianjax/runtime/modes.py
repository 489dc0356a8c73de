"""How sync and async differ, in one place: a strategy object chosen once per run (from
`config.mode`) and handed to the learner, its ingress and the actors, so that none of them
checks the mode's name.

    sync   strict assignment dependencies (the baseline TianJi beats): an actor holds one
           credit and, after each trajectory, waits for the version after the one it acted
           with; the learner waits for one trajectory from every actor made with its
           current version, and reads its version back after every update (the actors wait
           on it); every actor is needed for every round, so one lost for good ends the run.
    async  relaxed dependencies (TianJi's): an actor acts with the newest version it holds,
           takes a newer one whenever it can (before a rollout, while its send is blocked),
           and holds as many credits as the balance controller's window gives it; the
           learner learns from any pooled trajectories within max_staleness, and may take
           bounded reuse passes over its last batch while nothing fresh waits.

Fused mode has no actors, ingress or pool: it is its own runner (tianjax.runtime.runners).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tianjax.config import Config
from tianjax.runtime.learner.batches.onpolicy import AsyncBatches, ReuseBatches, SyncBatches


@dataclass(frozen=True)
class Mode:
    name: Literal["sync", "async"]
    # actors: take the newest version whenever one arrives, not only when they wait for one
    takes_newest: bool
    # actors: after each trajectory, wait for the version after the one they acted with
    waits_for_next_version: bool
    # learner: read the version back after every update (exact, for actors that wait on it)
    exact_versions: bool
    # learner: bounded reuse passes over the last batch (split updates prepare once per batch)
    reuses: bool
    # supervisor: an actor lost for good ends the run (every round needs every actor)
    needs_every_actor: bool

    def window(self, controller_credits: int) -> int:
        """Trajectories one actor may have in flight or pooled: one in sync mode (it waits
        for the next version after each), else its share of the controller's window."""
        return 1 if self.waits_for_next_version else controller_credits

    def batches(self, pool, k: int, limits, split: bool):
        """The learner's on-policy batch strategy over `pool`, `k` trajectories a batch
        (tianjax.runtime.learner.batches.onpolicy)."""
        if not self.reuses:
            return SyncBatches(pool, k)
        return ReuseBatches(AsyncBatches(pool, k), limits, split)


SYNC = Mode(
    "sync",
    takes_newest=False,
    waits_for_next_version=True,
    exact_versions=True,
    reuses=False,
    needs_every_actor=True,
)
ASYNC = Mode(
    "async",
    takes_newest=True,
    waits_for_next_version=False,
    exact_versions=False,
    reuses=True,
    needs_every_actor=False,
)
MODES = {m.name: m for m in (SYNC, ASYNC)}


def mode_of(config: Config) -> Mode:
    """The strategy of a config's distributed mode (sync or async)."""
    if config.mode not in MODES:
        raise ValueError(
            f"mode '{config.mode}' has no actors or learner process (it is its own runner)"
        )
    return MODES[config.mode]


__all__ = ["ASYNC", "MODES", "Mode", "SYNC", "mode_of"]
