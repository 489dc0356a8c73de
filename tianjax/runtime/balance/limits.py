"""The balance's hard limits: TianJi's production/consumption strategy, made explicit.

Actors produce samples at rate p, the learner consumes them at rate c (counting reuse).
With relaxed assignment dependencies nothing forces p and c to match, and a mismatch shows
up as staleness (p > c: samples queue and age) or idle learner time (p < c). The
set-point controller (tianjax.runtime.balance.controller) steers p and c; these limits
are the safety net under it:

- admission: a trajectory staler than `max_staleness` on arrival is dropped (and counted),
  by the one rule of tianjax.core.staleness.admissible, which the pool applies again when
  the learner takes a batch and the loss in its mask; the loss's staleness weights then
  handle what is admitted;
- flow control: while the pool holds `max_pool` trajectories the learner stops reading its
  socket, so ZeroMQ's high-water marks push back and actors block in send (they slow down
  instead of producing samples that would only age);
- bounded reuse (on-policy): when the learner is ready and no fresh trajectory is waiting,
  it may take another pass over its last batch, at most `max_reuse` times per batch.

What these decisions do is counted in `measures` (tianjax.runtime.balance.measures). No
sockets, no clock: the caller passes `now`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tianjax.core.staleness import admissible, staleness
from tianjax.runtime.balance.measures import Measures


@dataclass
class Limits:
    max_staleness: int | None
    max_pool: int
    max_reuse: int  # the controller lowers it within its bound (balance.max_reuse = ...)
    measures: Measures = field(default_factory=Measures)

    def admit(self, behaviour_version: int, learner_version: int, samples: int, now: float) -> bool:
        """Whether an arriving trajectory enters the pool (counted either way)."""
        tau = int(staleness(learner_version, behaviour_version))
        ok = bool(admissible(tau, self.max_staleness))
        self.measures.arrival(tau, samples, now, admitted=ok)
        return ok

    def fresh_enough(self, behaviour_version: int, learner_version: int) -> bool:
        """Admission again, at consumption: a pooled trajectory may still be learned from."""
        return bool(
            admissible(int(staleness(learner_version, behaviour_version)), self.max_staleness)
        )

    def accept_more(self, pool_size: int) -> bool:
        """Flow control: read the trajectory socket only while the pool has room."""
        if pool_size >= self.max_pool:
            self.measures.throttle()
            return False
        return True

    def may_reuse(self, reuse_count: int, batch_version: int, learner_version: int) -> bool:
        """Bounded reuse of the last batch while no fresh data is waiting."""
        if reuse_count >= self.max_reuse:
            return False
        return self.fresh_enough(batch_version, learner_version)


__all__ = ["Limits"]
