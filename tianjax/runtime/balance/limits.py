"""The balance's hard limits: TianJi's production/consumption strategy, made explicit.

Actors produce samples at rate p, the learner consumes them at rate c (counting reuse).
With relaxed assignment dependencies nothing forces p and c to match, and a mismatch shows
up as staleness (p > c: samples queue and age) or idle learner time (p < c). The
set-point controller (tianjax.runtime.balance.controller) steers p and c; these limits
are the safety net under it:

- admission by version (AReaL's rule, Fu et al., arXiv 2505.24298): an actor may start a
  trajectory only while the trajectories started and not discarded since the learner's
  start stay within

      started - discarded <= (eta + (V - V_base) + 1) * k           (eta = max_staleness)

  with V the newest version published, V_base the version the learner (re)started from and
  k trajectories per update: the learner consumes k per update in arrival order, so the
  n-th trajectory is learned from at version V_base + floor(n / k) <= V + eta, and one
  started with version V is at most eta updates old when learned from. It paces the
  actors (no credit is granted beyond it) instead of dropping what they made; a learner
  restart re-bases it (`rebase`: the pool starts empty, the counts from 0). Reuse passes
  count as versions without consuming, so with `max_reuse` a trajectory may still come
  in over the bound;
- admission on arrival: a trajectory staler than `max_staleness` on arrival is dropped (and
  counted), by the one rule of tianjax.core.staleness.admissible, which the pool applies
  again when the learner takes a batch and the loss in its mask (the safety net under the
  rule above, for an actor that acted with parameters older than the newest published);
  the loss's staleness weights then handle what is admitted;
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
    batch_trajectories: int = 1  # k: trajectories per update (admission by version)
    version_base: int = 0  # the version this learner process started from
    started: int = 0  # trajectories granted (started by actors) since then
    discarded: int = 0  # of those, never to be learned from (dropped, expired, lost)

    def rebase(self, version: int) -> None:
        """A (re)started learner: admission by version counts from `version`, nothing out."""
        self.version_base, self.started, self.discarded = int(version), 0, 0

    def room(self, published_version: int) -> int | None:
        """Trajectories that may still be started under admission by version (None: no
        bound, max_staleness null)."""
        if self.max_staleness is None:
            return None
        k = max(self.batch_trajectories, 1)
        allowed = (self.max_staleness + (published_version - self.version_base) + 1) * k
        return max(allowed - (self.started - self.discarded), 0)

    def start(self, n: int) -> None:
        """`n` trajectories granted: actors may start them."""
        self.started += n

    def discard(self, n: int = 1) -> None:
        """`n` granted trajectories that will never be learned from (dropped on arrival,
        expired, refused past the budget, or written off as lost)."""
        self.discarded += n

    def admit(self, behaviour_version: int, learner_version: int, samples: int, now: float) -> bool:
        """Whether an arriving trajectory enters the pool (counted either way)."""
        tau = int(staleness(learner_version, behaviour_version))
        ok = bool(admissible(tau, self.max_staleness))
        self.measures.arrival(tau, samples, now, admitted=ok)
        if not ok:
            self.discard()
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
