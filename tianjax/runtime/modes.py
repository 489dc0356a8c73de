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
    deterministic  (async with runtime.deterministic, Cleanba-like) the envs are
           `batch_trajectories` shards, seeded per shard and spread over the actor
           processes; rollout r of a shard acts with version max(0, r - k) (k =
           runtime.deterministic_lag), taken from a ring of the last k + 1 versions that
           every parameter message carries, and an actor starts it once it holds that
           version (the lag paces it: no credits); update u learns from rollout u of every
           shard, concatenated in shard order. No reuse, no drop by timing: the parameters
           are a function of the config, whatever the number of actor processes.

Fused mode has no actors, ingress or pool: it is its own runner (tianjax.runtime.runners).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tianjax.config import Config
from tianjax.runtime.learner.batches.onpolicy import AsyncBatches, ReuseBatches, SyncBatches
from tianjax.runtime.learner.batches.ordered import OrderedBatches


@dataclass(frozen=True)
class Mode:
    name: Literal["sync", "async", "deterministic"]
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
    # actors: rollout r of each env shard acts with version max(0, r - k), from the lag
    # ring the parameter messages carry; learner: update u takes rollout u of every shard,
    # in shard order, and publishes after every update (tianjax.runtime.learner.batches.ordered)
    fixed_order: bool = False

    def window(self, controller_credits: int) -> int:
        """Trajectories one actor may have in flight or pooled: one in sync mode (it waits
        for the next version after each), else its share of the controller's window."""
        return 1 if self.waits_for_next_version else controller_credits

    def batches(self, pool, k: int, limits, split: bool):
        """The learner's on-policy batch strategy over `pool`, `k` trajectories a batch
        (tianjax.runtime.learner.batches.onpolicy)."""
        if self.fixed_order:
            return OrderedBatches(pool, k)
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
DETERMINISTIC = Mode(
    "deterministic",
    takes_newest=False,
    waits_for_next_version=False,
    exact_versions=False,
    reuses=False,
    needs_every_actor=False,
    fixed_order=True,
)
MODES = {m.name: m for m in (SYNC, ASYNC, DETERMINISTIC)}


def mode_of(config: Config) -> Mode:
    """The strategy of a config's distributed mode (sync or async; async with
    runtime.deterministic: deterministic)."""
    if config.mode not in ("sync", "async"):
        raise ValueError(
            f"mode '{config.mode}' has no actors or learner process (it is its own runner)"
        )
    return DETERMINISTIC if config.runtime.deterministic else MODES[config.mode]


__all__ = ["ASYNC", "DETERMINISTIC", "MODES", "Mode", "SYNC", "mode_of"]
