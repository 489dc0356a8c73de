"""The learner's on-policy batch strategies: which pooled trajectories the next update
learns from. One small class each; `next(version, busy)` gives a Choice or None:

    sync:  one trajectory from every actor, made with the current version (strict
           assignment dependencies); leftovers of older versions can never be used and
           are dropped;
    async: any `batch_trajectories` pooled trajectories still within max_staleness; one
           that aged past it while it waited is dropped, not learned from;
    reuse: (async) another pass over the last batch while nothing fresh waits and no
           update runs, within the balance controller's reuse budget.

The pool is the ingress's (tianjax.runtime.learner.ingress): a deque of (behaviour version, sender,
batch) items. A trajectory that leaves it, taken or dropped, hands its sender's credit
back (`release`). The off-policy strategy is tianjax.runtime.learner.batches.replay.
"""

from __future__ import annotations

import collections
from typing import Any, Callable, NamedTuple

import numpy as np

from tianjax.runtime.balance.limits import BalanceController
from tianjax.runtime.learner.batches.axes import concat_batches


class Choice(NamedTuple):
    """The next update's local batch, its behaviour versions, and whether it is a reuse
    pass. `batch` is None for a reuse pass of a split update (PPO's prepare/learn), which
    learns on the batch as prepared when it was first taken."""

    batch: Any
    behaviour: np.ndarray
    reuse: bool


def _joined(chosen: list) -> Choice:
    local = concat_batches([item[2] for item in chosen])
    return Choice(local, local.version, False)


class _PoolBatches:
    def __init__(self, pool: collections.deque, k: int, balance: BalanceController, traj_steps: int,
                 release: Callable[[bytes], None]):
        """`k` trajectories per batch; `traj_steps` env steps in one; `release(sender)`
        hands a credit back."""
        self.pool, self.k, self.balance = pool, k, balance
        self.traj_steps, self.release = traj_steps, release

    def _drop(self, item) -> None:
        self.pool.remove(item)
        self.balance.expire(self.traj_steps)
        self.release(item[1])

    def next(self, version: int, busy: bool = False) -> Choice | None:
        chosen = self.take(version)
        return None if chosen is None else _joined(chosen)

    def drained(self) -> bool:
        """The pool cannot make another batch."""
        return len(self.pool) < self.k


class SyncBatches(_PoolBatches):
    """One trajectory per actor, made with the current version."""

    def take(self, version: int) -> list | None:
        current = int(version)
        by_sender = {}
        for item in self.pool:
            if item[0] == current:
                by_sender.setdefault(item[1], item)
        if len(by_sender) < self.k:
            return None
        chosen = list(by_sender.values())[: self.k]
        for item in chosen:
            self.pool.remove(item)
        for item in [i for i in self.pool if i[0] < current]:
            self._drop(item)
        for item in chosen:
            self.release(item[1])  # its slot is free again
        return chosen


class AsyncBatches(_PoolBatches):
    """The oldest `k` pooled trajectories within max_staleness."""

    def take(self, version: int) -> list | None:
        # admission again at consumption: what aged past max_staleness in the pool goes
        for item in [i for i in self.pool if not self.balance.fresh_enough(i[0], version)]:
            self._drop(item)
        if len(self.pool) < self.k:
            return None
        chosen = [self.pool.popleft() for _ in range(self.k)]
        for item in chosen:
            self.release(item[1])  # its slot is free again
        return chosen


class ReuseBatches:
    """Fresh batches from `fresh`; while it has none, no update runs (`busy` false) and the
    balance controller's budget allows, another pass over the last one."""

    def __init__(self, fresh: AsyncBatches, balance: BalanceController, split: bool):
        self.fresh, self.balance, self.split = fresh, balance, split
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
            self.last, self.passes = (choice.batch, min(item[0] for item in chosen)), 0
            return choice
        # NOTE: only while no update runs (the device would idle): a reuse pass queued
        # behind a running update would make fresh data that arrives meanwhile wait
        if self.last is None or busy or not self.balance.may_reuse(self.passes, self.last[1], version):
            return None
        self.passes += 1
        local = self.last[0]
        return Choice(None if self.split else local, local.version, True)


__all__ = ["AsyncBatches", "Choice", "ReuseBatches", "SyncBatches"]
