"""The learner's on-policy batch strategies: which pooled trajectories the next update
learns from. One small class each; `next(version, busy)` gives a Choice or None:

    sync:  one trajectory from every actor, made with the current version (strict
           assignment dependencies); leftovers of older versions can never be used and
           are dropped;
    async: any `batch_trajectories` pooled trajectories still within max_staleness; one
           that aged past it while it waited is dropped, not learned from;
    reuse: (async) another pass over the last batch while nothing fresh waits and no
           update runs, within the balance controller's reuse budget.

The pool is tianjax.runtime.learner.pool's (filled by the ingress): PoolItems, oldest
first. A trajectory that leaves it, taken or expired, hands its sender's credit back.
The off-policy strategy is tianjax.runtime.learner.batches.replay.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from tianjax.runtime.balance.limits import Limits
from tianjax.runtime.learner.batches.axes import concat_batches
from tianjax.runtime.learner.pool import Pool, PoolItem


class Choice(NamedTuple):
    """The next update's local batch, its behaviour versions, and whether it is a reuse
    pass. `batch` is None for a reuse pass of a split update (PPO's prepare/learn), which
    learns on the batch as prepared when it was first taken."""

    batch: Any
    behaviour: np.ndarray
    reuse: bool
    items: tuple[int, ...] = ()  # the joined trajectories' indices in the replay log, in order


def _joined(chosen: list[PoolItem]) -> Choice:
    local = concat_batches([item.batch for item in chosen])
    return Choice(local, local.version, False, tuple(item.tag for item in chosen))


class _PoolBatches:
    def __init__(self, pool: Pool, k: int):
        """`k` trajectories per batch."""
        self.pool, self.k = pool, k

    def next(self, version: int, busy: bool = False) -> Choice | None:
        chosen = self.take(version)
        return None if chosen is None else _joined(chosen)

    def drained(self) -> bool:
        """The pool cannot make another batch."""
        return len(self.pool) < self.k


class SyncBatches(_PoolBatches):
    """One trajectory per actor, made with the current version."""

    def take(self, version: int) -> list[PoolItem] | None:
        current = int(version)
        by_sender = {}
        for item in self.pool:
            if item.version == current:
                by_sender.setdefault(item.sender, item)
        if len(by_sender) < self.k:
            return None
        self.pool.expire_older(current)  # leftovers of older versions can never be used
        return self.pool.take(list(by_sender.values())[: self.k])


class AsyncBatches(_PoolBatches):
    """The oldest `k` pooled trajectories within max_staleness."""

    def take(self, version: int) -> list[PoolItem] | None:
        self.pool.expire_stale(version)  # admission again at consumption
        if len(self.pool) < self.k:
            return None
        return self.pool.take_oldest(self.k)


class ReuseBatches:
    """Fresh batches from `fresh`; while it has none, no update runs (`busy` false) and the
    balance controller's budget allows, another pass over the last one."""

    def __init__(self, fresh: AsyncBatches, limits: Limits, split: bool):
        self.fresh, self.limits, self.split = fresh, limits, split
        self.last: tuple | None = None  # (the last fresh batch, its oldest behaviour version)
        self.passes = 0  # reuse passes over it so far

    def take(self, version: int) -> list | None:
        return self.fresh.take(version)

    def drained(self) -> bool:
        return self.fresh.drained()

    def next(self, version: int, busy: bool = False) -> Choice | None:
        chosen = self.fresh.take(version)
        if chosen is not None:
            choice = _joined(chosen)
            self.last, self.passes = (choice.batch, min(item.version for item in chosen)), 0
            return choice
        # NOTE: only while no update runs (the device would idle): a reuse pass queued
        # behind a running update would make fresh data that arrives meanwhile wait
        if (
            self.last is None
            or busy
            or not self.limits.may_reuse(self.passes, self.last[1], version)
        ):
            return None
        self.passes += 1
        local = self.last[0]
        return Choice(None if self.split else local, local.version, True)


__all__ = ["AsyncBatches", "Choice", "ReuseBatches", "SyncBatches"]
