"""The learner's watch on its actors' arrivals: while no actor has registered it says so
on stderr (every WAIT_NOTICE_S, or halfway through a shorter wait), and when nothing has
arrived for too long it ends the run with LearnerStalled: `connect_timeout_s` until the
session's first trajectory (actors may still be starting), `heartbeat_timeout_s` after.
Fed with `now`; it reads no clock itself.
"""

from __future__ import annotations

import sys

from tianjax.errors import LearnerStalled

WAIT_NOTICE_S = 30.0  # while no actor has registered, the learner says so this often


class ArrivalWatch:
    """`who` waits for its actors, started as `hint` says (both may change before use)."""

    def __init__(
        self,
        connect_timeout_s: float,
        heartbeat_timeout_s: float,
        who: str = "learner",
        hint: str = "its actors (tianjax launch --role actor ...)",
    ):
        self.connect_timeout_s, self.heartbeat_timeout_s = connect_timeout_s, heartbeat_timeout_s
        self.who, self.hint = who, hint
        self.notice_every = min(WAIT_NOTICE_S, connect_timeout_s / 2)
        self.last_arrival = 0.0
        self._notice_at = self.notice_every

    def start(self, now: float) -> None:
        self.last_arrival, self._notice_at = now, self.notice_every

    def check(self, now: float, received: int, actors: int, started: bool) -> None:
        """After a look at the sockets at `now` that took in `received` trajectories, with
        `actors` registered; `started`: env steps were admitted this session. Raises
        LearnerStalled when the wait is over."""
        if received:
            self.last_arrival = now
        waited = now - self.last_arrival
        limit = self.heartbeat_timeout_s if started else self.connect_timeout_s
        if not actors and waited > self._notice_at:
            print(
                f"tianjax: {self.who}: no actor has connected after {waited:.0f} s "
                f"(waiting up to {limit:.0f} s, runtime.connect_timeout_s): start {self.hint}",
                file=sys.stderr,
                flush=True,
            )
            self._notice_at += self.notice_every
        elif actors:
            self._notice_at = self.notice_every
        if waited > limit:
            raise LearnerStalled(
                f"no trajectory from any actor for {limit:.0f} s ({actors} registered)"
            )


__all__ = ["ArrivalWatch", "WAIT_NOTICE_S"]
