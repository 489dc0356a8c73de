"""The deterministic-lag mode's batch strategy (runtime.deterministic): update u learns from
rollout u of every env shard, in shard order (tianjax.runtime.actor.shards).

Nothing is chosen by arrival time: the batch waits until each of its trajectories is
pooled, and a pooled one is never reused or dropped for its age. What could not be learned
from (a round the learner has passed, after an actor or learner restart) is expired and
counted as the async strategies' leftovers are.
"""

from __future__ import annotations

from tianjax.runtime.learner.batches.onpolicy import _PoolBatches
from tianjax.runtime.learner.pool import PoolItem


class OrderedBatches(_PoolBatches):
    """Rollout `version` of shards 0 .. k - 1 (k = batch_trajectories), in that order."""

    def take(self, version: int) -> list[PoolItem] | None:
        current = int(version)
        for item in [i for i in self.pool if i.order is not None and i.order[0] < current]:
            self.pool.expire(item, "past_round")  # a round already learned (resent after a restart)
        by_shard = {}
        for item in self.pool:
            if item.order is not None and item.order[0] == current:
                by_shard.setdefault(item.order[1], item)
        if len(by_shard) < self.k:
            return None
        return self.pool.take([by_shard[s] for s in range(self.k)])


__all__ = ["OrderedBatches"]
