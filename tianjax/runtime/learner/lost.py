"""Which trajectories an actor says it has sent count as lost on the way (a rejected
message, a connection that broke with messages queued), so that the learner can hand
their credit slots back. Pure: the learner's ingress (tianjax.runtime.learner.ingress)
supplies the counts and the clock.
"""

from __future__ import annotations

# a trajectory an actor has said it sent counts as lost when it has not come this many
# heartbeat periods after it was said
LOST_AFTER_BEATS = 10


def count(x) -> int | None:
    """`x` if it is a count (a non-negative int, not a bool), else None: what a heartbeat
    says is never trusted in part."""
    return x if isinstance(x, int) and not isinstance(x, bool) and x >= 0 else None


def lost_trajectories(claim, sent, accounted: int, now: float, grace: float, backlog_empty: bool):
    """(lost, claim): how many of the trajectories an actor said it had sent count as lost,
    and the claim to keep.

    `sent`: the count its newest heartbeat reports; `accounted`: its trajectories that have
    arrived or were written off before; `claim`: (time, count) of the oldest report not yet
    accounted for, or None. The trajectories of a claim made at least `grace` seconds ago
    that have still not come are lost, provided nothing is left unread here
    (`backlog_empty`). A malformed `sent` changes nothing. Counts cannot tell which
    trajectory is missing: while an actor keeps sending, later arrivals cover its claims,
    so a loss is seen once the actor has stopped, out of slots (the case that stalls it).

    NOTE: the heartbeat comes on another socket, so it often arrives before the
    trajectories sent just ahead of it; under load they can lag it by seconds. Handing out
    slots for trajectories that were late, not lost, let actors make more than the budget
    (and, in sync mode, run a version ahead). Counts cannot tell a late one that comes
    after all from the next: it counts as arrived (so this actor's claims are covered one
    sooner from then on), and one the budget has no room for is dropped (Ingress.ingest)."""
    if count(sent) is None:
        return 0, claim
    if claim is not None and accounted >= claim[1]:
        claim = None  # everything that claim covered has come
    lost = 0
    if claim is not None and now - claim[0] >= grace and backlog_empty:
        lost, claim = claim[1] - accounted, None
    if claim is None and sent > accounted + lost:
        claim = (now, sent)
    return lost, claim


__all__ = ["LOST_AFTER_BEATS", "count", "lost_trajectories"]
