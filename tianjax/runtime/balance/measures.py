"""What the balance measures: production rate p (samples per second arriving from actors),
consumption rate c (samples per second learned from, reuse counted), the fresh samples,
the samples dropped and why, and the staleness of arriving and consumed samples.

TianJi balances p against c; tianjax also corrects the loss for the staleness that
relaxed dependencies leave. The decisions are elsewhere: the hard limits (admission by
staleness, flow control, bounded reuse) in tianjax.runtime.balance.limits, the set-point
controller in tianjax.runtime.balance.controller. This class only counts.

It holds no sockets and reads no clock: the caller passes `now` (seconds), so the
measurements are testable with hand-made timelines. Its state is reported as metrics and
saved in checkpoints.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Measures:
    window_s: float = 10.0  # rates are measured over this sliding window

    produced: int = 0  # samples (env steps) admitted
    consumed: int = 0  # samples learned from, reuse counted
    fresh: int = 0  # samples learned from for the first time (consumed less reuse)
    dropped: int = (
        0  # samples refused at admission (too stale, or past the budget) or expired in the pool
    )
    expired: int = 0  # of those, admitted samples that aged past max_staleness in the pool
    reused_batches: int = 0
    throttled: int = 0  # times the pool was full and the socket left unread
    _arrivals: collections.deque = field(default_factory=collections.deque)
    _consumptions: collections.deque = field(default_factory=collections.deque)
    # staleness counts {tau: samples}: bounded memory however long the run
    _tau_consumed: collections.Counter = field(default_factory=collections.Counter)
    _tau_arrival: collections.Counter = field(default_factory=collections.Counter)
    _tau_interval: collections.Counter = field(
        default_factory=collections.Counter
    )  # since the last take

    # ------------------------------------------------------------------ counting
    def arrival(self, tau: int, samples: int, now: float, admitted: bool) -> None:
        """A trajectory of `samples` at staleness `tau` arrived, and was admitted or not."""
        self._tau_arrival[tau] += samples
        if not admitted:
            self.dropped += samples
            return
        self.produced += samples
        self._arrivals.append((now, samples))

    def refused(self, samples: int) -> None:
        """Arrived samples not admitted for another reason than their staleness (a late
        trajectory the budget has no room for)."""
        self.dropped += samples

    def expire(self, samples: int) -> None:
        """Admitted samples that aged past max_staleness before they were consumed (or, in
        sync mode, were made with an older version than the learner's)."""
        self.dropped += samples
        self.expired += samples

    def throttle(self) -> None:
        """The pool was full: the trajectory socket was left unread this pass."""
        self.throttled += 1

    # ------------------------------------------------------------------ measurements
    def consumed_batch(
        self,
        taus: np.ndarray,
        samples: int,
        now: float,
        reuse: bool = False,
        fresh: int | None = None,
    ) -> None:
        """`samples` learned from, `fresh` of them for the first time (default: all of them
        unless `reuse`)."""
        self.consumed += samples
        self.fresh += (0 if reuse else samples) if fresh is None else fresh
        self.reused_batches += int(reuse)
        self._consumptions.append((now, samples))
        values, counts = np.unique(np.asarray(taus, np.int64), return_counts=True)
        self._tau_consumed.update(dict(zip(values.tolist(), counts.tolist())))
        self._tau_interval.update(dict(zip(values.tolist(), counts.tolist())))

    def _rate(self, events: collections.deque, now: float) -> float:
        while events and events[0][0] < now - self.window_s:
            events.popleft()
        if len(events) < 2:
            return 0.0
        # samples that arrived after the first event, over the time since it
        span = max(now - events[0][0], 1e-3)
        return (sum(n for _, n in events) - events[0][1]) / span

    def production_rate(self, now: float) -> float:
        return self._rate(self._arrivals, now)

    def consumption_rate(self, now: float) -> float:
        return self._rate(self._consumptions, now)

    def staleness_stats(self) -> dict:
        """Mean and max tau of the consumed samples."""
        n = sum(self._tau_consumed.values())
        if n == 0:
            return {"staleness_mean": 0.0, "staleness_max": 0}
        mean = sum(t * c for t, c in self._tau_consumed.items()) / n
        return {"staleness_mean": float(mean), "staleness_max": int(max(self._tau_consumed))}

    def staleness_histogram(self) -> dict:
        """{tau: count} of consumed samples."""
        return {int(t): int(c) for t, c in sorted(self._tau_consumed.items())}

    def take_interval_histogram(self) -> list[int]:
        """Consumed samples per tau (index = tau) since the last call; resets the interval."""
        hist = [0] * (max(self._tau_interval, default=-1) + 1)
        for t, c in self._tau_interval.items():
            hist[int(t)] = int(c)
        self._tau_interval.clear()
        return hist

    def state_dict(self) -> dict:
        """The counters and staleness counts, JSON-able (checkpoints); rates start afresh."""
        return {
            "produced": self.produced,
            "consumed": self.consumed,
            "fresh": self.fresh,
            "dropped": self.dropped,
            "expired": self.expired,
            "reused_batches": self.reused_batches,
            "throttled": self.throttled,
            "tau_consumed": {str(t): c for t, c in self._tau_consumed.items()},
            "tau_arrival": {str(t): c for t, c in self._tau_arrival.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        for k in (
            "produced",
            "consumed",
            "fresh",
            "dropped",
            "expired",
            "reused_batches",
            "throttled",
        ):
            setattr(self, k, int(state.get(k, 0)))
        self._tau_consumed = collections.Counter(
            {int(t): int(c) for t, c in state["tau_consumed"].items()}
        )
        self._tau_arrival = collections.Counter(
            {int(t): int(c) for t, c in state["tau_arrival"].items()}
        )

    def arrival_histogram(self) -> dict:
        """{tau: count} of arriving samples (admitted or not)."""
        return {int(t): int(c) for t, c in sorted(self._tau_arrival.items())}

    def metrics(self, now: float) -> dict:
        return {
            "production_rate": self.production_rate(now),
            "consumption_rate": self.consumption_rate(now),
            "samples_produced": self.produced,
            "samples_consumed": self.consumed,
            "samples_fresh": self.fresh,
            "dropped_samples": self.dropped,
            # the share of the samples that arrived which were dropped (too stale, expired in
            # the pool, or past the budget): admission by version paces instead, so it stays ~0
            "dropped_fraction": self.dropped / max(self.produced + self.dropped - self.expired, 1),
            "expired_samples": self.expired,
            "reused_batches": self.reused_batches,
            "throttled": self.throttled,
            **self.staleness_stats(),
        }


__all__ = ["Measures"]
