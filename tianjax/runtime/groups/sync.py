"""A group learner's link to the averager: `GroupSync`, called by the learner's loop at each
update boundary (tianjax.runtime.learner.learner). It never waits: it sends a delta
without blocking, and merges a newer average only at a boundary.

What it holds (tianjax.core.outer_step names the rule):

- the base: the newest average merged, and its round;
- the reference point rho: the base, or, while a delta is in flight, the parameters it
  was computed from (`sent`); before the first average, the parameters the group started
  (or resumed) with;
- at most one delta in flight: sent every groups.sync_every updates once the one before
  is settled, so each piece of progress goes to the averager once.

At a boundary, the newest average received is merged, theta <- average + (theta - rho),
when nothing of this group's is in flight, or when the average's body says the delta in
flight was settled (merged into a round, or dropped as too stale: its progress is the
average's to keep or leave), or when the average comes from another averager
incarnation (a restart: the delta was lost with its predecessor, so its progress stays
with the group, rho goes back to the base, and the next delta carries it). An average
that holds nothing new of the group waits while its delta is in flight; meanwhile the
group trains alone, as it does while the averager is away.

The delta is computed on the device at the boundary (after the update just dispatched)
and sent once its host copy is ready, at a later boundary; while it is prepared and not
yet sent it counts as in flight. A send refused at the high-water mark (the averager not
reading: away, or cut off) is dropped and tried again a second later, from the newest
parameters.
"""

from __future__ import annotations

import collections
import time
from typing import NamedTuple

import jax
import numpy as np

from tianjax.config import Config
from tianjax.core import outer_step
from tianjax.transport.deltas import AverageSubscriber, DeltaSender, group_topic

RETRY_S = 1.0  # after a send refused at the high-water mark
FINAL_WAIT_S = 5.0  # at the end, how long the final delta may wait for the one in flight


class GroupPlace(NamedTuple):
    """Which group a learner is, and where its averager is ({"deltas", "averages"})."""

    index: int
    endpoints: dict


class SentDelta(NamedTuple):
    seq: int  # the delta's sequence number (the sender's)
    to: str  # the averager incarnation it went to
    sent: object  # the parameters it was computed from (device)
    base_round: int
    at: float


# NOTE: copies in new buffers (x.copy() inside jit is never the input forwarded): the
# learner's next update donates its parameters, never these
_copy = jax.jit(lambda tree: jax.tree.map(lambda x: x.copy(), tree))
_delta_and_copy = jax.jit(
    lambda params, ref: (outer_step.delta(params, ref), jax.tree.map(lambda x: x.copy(), params))
)
_merge = jax.jit(outer_step.merge)


def _ready(tree) -> bool:
    return all(x.is_ready() for x in jax.tree.leaves(tree) if hasattr(x, "is_ready"))


def _on_device_like(tree, like):
    return jax.tree.map(lambda a, p: jax.device_put(a, p.sharding), tree, like)


class GroupSync:
    """`net`: the learner's SecureContext (its context and the run's handshake); `params`:
    the learner's parameters now (the reference point until the first average)."""

    def __init__(self, config: Config, place: GroupPlace, run_key, net, params):
        self.config, self.index = config, place.index
        self.sync_every = config.groups.sync_every
        template = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
        # (`limit`: the context's watcher caps the links' TCP back-off, so that a cut at
        # the averager's side is moving again within a second of its heal)
        net_kw = dict(ctx=net.ctx, handshake=net.handshake, limit=net.limit)
        # (same_version: a round's average published again may settle another delta)
        self.averages = AverageSubscriber(
            run_key,
            place.endpoints["averages"],
            template,
            same_version=True,
            topic=group_topic(place.index),
            **net_kw,
        )
        self.deltas = DeltaSender(
            run_key, place.endpoints["deltas"], sender=f"group-{place.index}", **net_kw
        )
        self.start = _copy(params)  # rho until the first average is merged
        self.base = None
        self.base_round = -1
        self.base_source: str | None = None  # the averager incarnation the base came from
        self.averager: str | None = None  # the newest averager incarnation heard: sent to
        self.in_flight: SentDelta | None = None
        self.prepared = None  # (delta on the device, parameters it was computed from, round)
        self.newest = None  # (round, host tree, source, body) received, not merged yet
        self.updates_at_send = 0
        self._retry_at = 0.0
        self.counts = collections.Counter()
        self.rounds_behind: list[int] = []  # rounds between the base and each average merged

    # ------------------------------------------------------------------ the hook
    def boundary(self, params, updates: int, now: float | None = None):
        """Called by the learner between updates. Returns the merged parameters when an
        average was merged (the learner's new params), else None."""
        now = time.perf_counter() if now is None else now
        self._receive()
        self._send_prepared(now)
        merged = self._merge(params)
        if merged is None and self._due(updates, now):
            self._prepare(params, updates)
        return merged

    def finish(self, params, updates: int) -> None:
        """The run's end: sends what was learned since the last delta as the final one
        (waiting at most FINAL_WAIT_S for the delta in flight to be settled)."""
        deadline = time.perf_counter() + FINAL_WAIT_S
        while time.perf_counter() < deadline and (
            self.prepared is not None or self.in_flight is not None or self.base is None
        ):
            merged = self.boundary(params, updates)
            if merged is not None:
                params = merged
            if self.base is None and self.newest is None:
                time.sleep(0.05)
            elif self.in_flight is not None or self.prepared is not None:
                time.sleep(0.02)
        if self.base is None or self.in_flight is not None or self.prepared is not None:
            self.counts["final_not_sent"] += 1
            return
        delta, _ = _delta_and_copy(params, self.base)
        if self._send(jax.tree.map(np.asarray, delta), self.base_round, updates, final=True):
            self.counts["final_sent"] += 1
        else:
            self.counts["final_not_sent"] += 1

    # ------------------------------------------------------------------ parts
    def _receive(self) -> None:
        got = self.averages.latest(0)
        if got is not None:
            self.newest = (got[0], got[1], self.averages.source, self.averages.body or {})
            self.averager = self.averages.source
            self.counts["averages_received"] += 1

    def _due(self, updates: int, now: float) -> bool:
        return (
            self.base is not None
            and self.in_flight is None
            and self.prepared is None
            and updates - self.updates_at_send >= self.sync_every
            and now >= self._retry_at
        )

    def _prepare(self, params, updates: int) -> None:
        delta, sent = _delta_and_copy(params, self.base)
        for leaf in jax.tree.leaves(delta):
            leaf.copy_to_host_async()
        self.prepared = (delta, sent, self.base_round, updates)

    def _send_prepared(self, now: float) -> None:
        if self.prepared is None or not _ready(self.prepared[0]):
            return
        delta, sent, base_round, updates = self.prepared
        self.prepared = None
        if self._send(jax.tree.map(np.asarray, delta), base_round, updates):
            self.in_flight = SentDelta(self.deltas.seq, self.averager, sent, base_round, now)
            self.updates_at_send = updates
        else:
            self._retry_at = now + RETRY_S

    def _send(self, tree, base_round: int, updates: int, final: bool = False) -> bool:
        self.deltas.to = self.averager
        body = {"group": self.index, "updates": int(updates), "final": final}
        if not self.deltas.send(tree, base_round, timeout_ms=0, body=body):
            self.counts["sends_refused"] += 1  # the averager is not reading: away or cut off
            return False
        self.counts["deltas_sent"] += 1
        self.counts["bytes_sent"] += sum(a.nbytes for a in jax.tree.leaves(tree))
        return True

    def _settlement(self, body: dict) -> str | None:
        """'merged' or 'dropped' if the average's body settles the delta in flight."""
        try:
            inc, seq, status = body["settled"][str(self.index)]
        except (KeyError, TypeError, ValueError):
            return None
        if inc == self.deltas.incarnation and seq == self.in_flight.seq:
            return status if status in ("merged", "dropped") else None
        return None

    def _merge(self, params):
        if self.newest is None or self.prepared is not None:
            return None
        r, tree, source, body = self.newest
        if self.base is None:  # the first average: from where this group started
            ref = self.start
        elif self.in_flight is None:
            if r <= self.base_round and source == self.base_source:
                self.newest = None  # nothing new
                return None
            ref = self.base
        elif source != self.in_flight.to:
            # another averager incarnation: the delta in flight was lost with the one before,
            # so its progress stays here and goes with the next delta
            self.counts["deltas_lost"] += 1
            ref = self.base
        else:
            status = self._settlement(body)
            if status is None:
                if r > self.base_round:
                    self.counts["averages_held"] += 1
                return None  # wait: it does not hold this group's delta yet
            self.counts[f"deltas_{status}"] += 1
            ref = self.in_flight.sent
        average = _on_device_like(tree, params)
        merged = _merge(average, params, ref)
        if self.base is not None:
            self.rounds_behind.append(max(r - self.base_round, 0))
        self.base, self.base_round, self.base_source = average, r, source
        self.start, self.in_flight, self.newest = None, None, None
        self.counts["averages_merged"] += 1
        self.counts["bytes_received"] += sum(np.asarray(a).nbytes for a in jax.tree.leaves(tree))
        return merged

    # ------------------------------------------------------------------ the record
    def fields(self) -> dict:
        """A metrics record's group fields."""
        return {
            "group_round": self.base_round,
            "group_merges": self.counts["averages_merged"],
            "group_deltas_sent": self.counts["deltas_sent"],
        }

    def summary(self) -> dict:
        c = self.counts
        return {
            "group": self.index,
            "group_round": self.base_round,
            "group_deltas_sent": c["deltas_sent"],
            # settled by the averager: merged into a round, or dropped as too stale; lost
            # with an averager that restarted (their progress went with the next delta)
            "group_deltas_merged": c["deltas_merged"],
            "group_deltas_dropped": c["deltas_dropped"],
            "group_deltas_lost": c["deltas_lost"],
            "group_sends_refused": c["sends_refused"],
            "group_final_delta_sent": bool(c["final_sent"]),
            "group_averages_merged": c["averages_merged"],
            "group_rounds_behind_mean": (
                float(np.mean(self.rounds_behind)) if self.rounds_behind else None
            ),
            "group_bytes_sent": c["bytes_sent"],
            "group_bytes_received": c["bytes_received"],
        }

    def close(self) -> None:
        self.averages.close()
        self.deltas.close()


__all__ = ["GroupPlace", "GroupSync"]
