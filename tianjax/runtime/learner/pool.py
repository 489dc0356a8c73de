"""The pool: admitted trajectories waiting to be learned from, and the ledger of the actors
that sent them. TianJi's heart: the learner never waits for a particular actor, it takes
whatever is pooled.

    PoolItem     one admitted trajectory: (behaviour version, sender, batch);
    Pool         the items, oldest first: admit, expire, take (take_oldest), release. An
                 item that leaves, taken or expired, hands its sender's credit back
                 (`release`), so an actor has at most its window in flight or pooled;
    ActorLedger  what the learner knows of one actor connection: its id, credits out,
                 when it was last heard from, what it sent and what arrived.

Which items an update takes is the batch strategies' (tianjax.runtime.learner.batches);
whether a trajectory is admitted, and whether a pooled one may still be learned from, is
the one staleness rule (tianjax.core.staleness.admissible, through the balance limits).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any, Callable, Iterator, NamedTuple

from tianjax.runtime.balance.limits import Limits


class PoolItem(NamedTuple):
    version: int  # the behaviour version the trajectory was acted with
    sender: bytes  # the actor connection's identity (its credit comes back on release)
    batch: Any  # the trajectory, device-resident ([T, B] leaves)
    tag: int = -1  # its index in the run's replay log (-1: none kept)
    # (round, shard) of the deterministic-lag mode (tianjax.runtime.actor.shards); else None
    order: tuple[int, int] | None = None


@dataclass
class ActorLedger:
    """One actor connection, as the learner's ingress sees it."""

    actor: Any  # the actor id it registered with (an int; anything else is not trusted)
    last_traj: float  # when its last trajectory arrived (or it registered)
    last_seen: float = 0.0  # when its last control message arrived
    outstanding: int = 0  # credits granted whose trajectory has not arrived
    accounted: int = 0  # trajectories of this process received or written off as lost
    claim: Any = None  # a pending claim of lost trajectories (tianjax.runtime.learner.lost)

    def silent_for(self, now: float) -> float:
        """Seconds since it was last heard from, by control message or trajectory."""
        return now - max(self.last_seen, self.last_traj)


class Pool:
    """Admitted trajectories, oldest first. `release(sender)` hands a credit back;
    `traj_steps` env steps make one trajectory (what an expired one costs)."""

    def __init__(self, limits: Limits, traj_steps: int, release: Callable[[bytes], None], log=None):
        """`log`: the run's replay log (tianjax.runtime.record.replay_log), told of expiries."""
        self.limits, self.traj_steps, self.release_credit = limits, traj_steps, release
        self.log = log
        self._items: collections.deque[PoolItem] = collections.deque()

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[PoolItem]:
        return iter(self._items)

    def admit(
        self, version: int, sender: bytes, batch, tag: int = -1, order: tuple | None = None
    ) -> None:
        """Stores a trajectory the limits admitted (`tag`: its index in the replay log;
        `order`: its round and shard, in the deterministic-lag mode)."""
        self._items.append(PoolItem(int(version), sender, batch, tag, order))

    def _remove(self, item: PoolItem) -> None:
        # NOTE: by identity: deque.remove compares with ==, which for two items of one
        # sender and version goes on to their arrays (and fails on device arrays)
        for i, held in enumerate(self._items):
            if held is item:
                del self._items[i]
                return
        raise ValueError("not in the pool")

    def held_by(self, sender: bytes) -> int:
        """Trajectories of this sender waiting here."""
        return sum(item.sender == sender for item in self._items)

    def release(self, item: PoolItem) -> None:
        """Hands the item's credit back to its sender (its slot is free again)."""
        self.release_credit(item.sender)

    def expire(self, item: PoolItem, why: str) -> None:
        """Drops a pooled item that can no longer be learned from, counted as expired."""
        self._remove(item)
        if self.log is not None:
            self.log.write({"e": "expire", "i": item.tag, "why": why})
        self.limits.measures.expire(self.traj_steps)
        self.limits.discard()
        self.release(item)

    def expire_stale(self, version: int) -> None:
        """Drops what aged past max_staleness while it waited (admission at consumption)."""
        for item in [i for i in self._items if not self.limits.fresh_enough(i.version, version)]:
            self.expire(item, "stale")

    def expire_older(self, version: int) -> None:
        """Drops what was made with a version older than `version` (sync mode)."""
        for item in [i for i in self._items if i.version < version]:
            self.expire(item, "older")

    def take(self, items: list[PoolItem]) -> list[PoolItem]:
        """Removes `items` (taken by an update) and hands their credits back."""
        for item in items:
            self._remove(item)
        for item in items:
            self.release(item)
        return items

    def take_oldest(self, k: int) -> list[PoolItem]:
        """The `k` items of the oldest behaviour versions (in arrival order among equals),
        taken: a trajectory that arrived late is learned from before newer ones overtake it
        further, which keeps admission by version's bound (tianjax.runtime.balance.limits)."""
        chosen = sorted(self._items, key=lambda item: item.version)[:k]  # (sorted is stable)
        for item in chosen:
            self._remove(item)
        for item in chosen:
            self.release(item)
        return chosen


__all__ = ["ActorLedger", "Pool", "PoolItem"]
