"""The learner groups' two channels, to and from the averager (tianjax.runtime.groups):

- deltas: each group's `DeltaSender` (PUSH, connects) to the averager's `DeltaReceiver`
  (PULL, binds). A delta is a parameter tree (the group's change since its reference
  point, tianjax.core.outer_step), its version the round of the average it was computed
  against, its body {"group", "updates", "final"}; it is addressed to the averager
  incarnation whose averages the group follows, so a restarted averager takes none meant
  for its predecessor.
- averages: the averager's `AveragePublisher` (PUB, binds) to the groups'
  `AverageSubscriber`s (SUB, connect, conflating: the newest round wins), the version
  the round, the body {"round", "settled"}: per group, the newest delta the averager has
  taken in (its sender's incarnation, its sequence number, and "merged" or "dropped").
  Each group subscribes to its own topic (`group_topic`), and an average goes only to
  the groups it concerns (those whose delta it settles, and one that has just
  subscribed): a slow group is not sent every round the others close.

They are the parameter and trajectory channels with the codec's kinds "average" and
"delta": the same framing, authentication, recipient binding, replay guard and size caps
(an exact-shape template: a delta or average of any other size or structure is refused
and counted), so nothing here is pickled and nothing a peer without the run key sends is
taken.
"""

from __future__ import annotations

from tianjax.transport.params import ParamPublisher, ParamSubscriber
from tianjax.transport.trajectories import TrajectoryReceiver, TrajectorySender


def group_topic(group: int) -> bytes:
    """The topic group `group` subscribes to (terminated: group 1's is no prefix of 10's)."""
    return f"group-{group}".encode() + b"\0"


class DeltaSender(TrajectorySender):
    """A group's deltas to the averager (see the module doc)."""

    KIND = "delta"


class DeltaReceiver(TrajectoryReceiver):
    """The averager's deltas from the groups (see the module doc)."""

    KIND = "delta"


class AveragePublisher(ParamPublisher):
    """The averager's averages to the groups (see the module doc)."""

    KIND = "average"


class AverageSubscriber(ParamSubscriber):
    """A group's view of the averages: the newest round, and its body (see the module doc)."""

    KIND = "average"


__all__ = ["AveragePublisher", "AverageSubscriber", "DeltaReceiver", "DeltaSender", "group_topic"]
