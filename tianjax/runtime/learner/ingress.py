"""The learner's ingress: who may send (credits, steered by the balance controller), what
is let in (admission), and the control conversation with actors (register, heartbeat,
lost slots; the evaluator's results), over the learner's trajectory and control sockets.

Credits are TianJi's flow control: an actor may have as many trajectories in flight or
waiting here as its share of the balance controller's window (one in sync mode), and no
more than the fresh-step budget still allows, so actors slow down exactly when the
learner falls behind and stop when the budget is spent.

An admitted trajectory goes to the pool (on-policy; the batch strategies take from it) or
to the replay buffer (off-policy), whose sender's credit is held back while the learner
owes more than a trajectory per actor in gradient steps. The trajectories themselves are
read, checked and decoded by the receiver thread (tianjax.runtime.learner.receiver).
"""

from __future__ import annotations

import collections
import math
import time
from typing import Callable

import jax
import numpy as np
import zmq

from tianjax.config import Config
from tianjax.core.staleness import step_versions_fault
from tianjax.errors import OrderBroken
from tianjax.runtime.actor.actor import TIME_KEYS
from tianjax.runtime.actor.shards import order_of
from tianjax.runtime.balance.controller import AdaptiveBalance
from tianjax.runtime.balance.limits import Limits
from tianjax.runtime.learner.batches.axes import batch_axis
from tianjax.runtime.learner.batches.replay import ReplayBatches
from tianjax.runtime.learner.lost import LOST_AFTER_BEATS, count, lost_trajectories
from tianjax.runtime.learner.pool import ActorLedger, Pool
from tianjax.runtime.learner.receiver import Receiver
from tianjax.runtime.modes import Mode
from tianjax.runtime.record.replay_log import ReplayLog
from tianjax.transport.channels import ControlServer

# an actor's heartbeat reports these (seconds since it registered)
ACTOR_TIME_KEYS = TIME_KEYS + ("wall", "cpu")


def actor_times(report) -> dict | None:
    """An actor's heartbeat `time_s` report as a dict of finite, non-negative seconds, or
    None when it is missing or malformed (it is then ignored, never trusted in part)."""
    if not isinstance(report, dict):
        return None
    out = {}
    for k in ACTOR_TIME_KEYS:
        v = report.get(k)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            return None
        out[k] = float(v)
    return out


class Ingress:
    """`budget`: env steps the actors may produce in all; `version()`: the learner's
    current version; `publish()`: sends the current parameters; `episodes(returns,
    env_steps, now, wins)`: takes the episodes that finished; `replay`: the replay buffer
    admitted trajectories go to (None: the pool)."""

    def __init__(
        self,
        config: Config,
        mode: Mode,
        control: ControlServer,
        rx: Receiver,
        limits: Limits,
        controller: AdaptiveBalance,
        *,
        budget: int,
        version: Callable[[], int],
        publish: Callable[[], None],
        episodes: Callable,
        replay: ReplayBatches | None = None,
        evaluations: Callable | None = None,
        log: ReplayLog | None = None,
    ):
        self.config, self.mode, self.control, self.rx = config, mode, control, rx
        self.limits, self.measures = limits, limits.measures
        self.controller, self.replay = controller, replay
        self.budget, self.version, self.publish, self.episodes = budget, version, publish, episodes
        self.evaluations = evaluations  # (msg, now): the evaluator's results
        self.log = log  # the run's replay log (None: not kept)
        self.traj_steps = config.rollout_len * config.num_envs
        self.pool = Pool(limits, self.traj_steps, self.grant, log)
        self.held: collections.deque = collections.deque()  # replay: credits held back while behind
        self.actors: dict[bytes, ActorLedger] = {}  # connection identity -> what is known of it
        self.actor_time_s: dict[
            bytes, dict
        ] = {}  # identity -> where its time went (its newest heartbeat)
        self.env_steps = 0  # admitted
        self.act_steps = 0  # the global env-step count the newest admitted trajectory was acted at
        self.lag_max = 0  # since the last record: max (env steps admitted - that count) on arrival
        self.dropped_nonfinite = 0
        # trajectories whose per-step versions cannot be true, by reason
        # (tianjax.core.staleness.step_versions_fault)
        self.dropped_bad_versions: collections.Counter = collections.Counter()
        self.mixed_versions = 0  # trajectories that arrived with more than one version inside
        # deterministic-lag mode: trajectories whose (round, shard) cannot be learned from, by
        # reason (malformed, a round already learned, a second copy), and those seen
        self.dropped_order: collections.Counter = collections.Counter()
        self._orders: set[tuple[int, int]] = set()
        self.written_off = 0  # trajectories taken as lost on the way (their slots handed back)
        # admission by version (tianjax.runtime.balance.limits): the newest version published,
        # the base it counts from (a restarted learner's own), and whether it held credits back
        self.published_version = 0  # (the learner re-bases at its start: rebase)
        self.paced = False
        # actor id -> valid trajectories received from it (every process of that id, a
        # restarted one's too), and what its newest heartbeat said it had sent and stepped
        self.received_by_actor: collections.Counter = collections.Counter()
        self.reported_by_actor: dict[int, dict] = {}
        # actor id -> its trajectories that arrived and were never taken, counted at the stop
        # (count_unread): the per-actor line of the summary's trajectories_unread_at_stop
        self.unread_by_actor: collections.Counter = collections.Counter()
        # actor id -> when (time.time(), the clock every process shares) its newest
        # trajectory was admitted: how long an actor took to come back after a fault
        self.admitted_at: dict[int, float] = {}
        self._poller = None

    # ------------------------------------------------------------------ credits
    def credits_left(self) -> int:
        """Trajectories the budget still allows beyond those admitted and in flight. (An actor
        not heard from for the heartbeat timeout is gone: its slots no longer count.)"""
        now, limit = time.perf_counter(), self.config.runtime.heartbeat_timeout_s
        outstanding = sum(
            max(info.outstanding, 0)
            for info in self.actors.values()
            if info.silent_for(now) <= limit
        )
        return (self.budget - self.measures.produced) // self.traj_steps - outstanding

    def window(self, ident: bytes) -> int:
        """Trajectories this actor may have in flight or waiting here: in sync mode one (it
        waits for the next version after each); in async mode its share of the controller's
        window, by registration order."""
        rank = list(self.actors).index(ident) if ident in self.actors else 0
        return self.mode.window(self.controller.actions.credits(rank, len(self.actors)))

    def in_hand(self, ident: bytes) -> int:
        """This actor's trajectories in flight (credits out) or held here (pooled, or
        replay credits held back)."""
        info = self.actors.get(ident)
        out = max(info.outstanding, 0) if info is not None else 0
        return out + self.pool.held_by(ident) + self.held.count(ident)

    def grant(self, ident: bytes, n: int = 1) -> None:
        info = self.actors.get(ident)
        # NOTE: a window the controller shrank is reached by not re-granting freed slots
        n = min(n, self.credits_left(), self.window(ident) - self.in_hand(ident))
        room = None if self.replay is not None else self.limits.room(self.published_version)
        if room is not None and room < n:
            n = room
            self.paced = True  # admission by version held a credit back: given when V moves
        if n > 0 and info is not None and self.control.send(ident, {"type": "credit", "n": n}):
            info.outstanding += n
            self.limits.start(n)

    def rebase(self, version: int) -> None:
        """The learner starts (or restarts, from a checkpoint) at `version`: admission by
        version counts from there, nothing granted yet."""
        self.published_version = int(version)
        self.limits.rebase(version)

    def published(self, version: int) -> None:
        """The learner published `version`: admission by version may give the credits it
        held back (the actors act with this version from now on)."""
        self.published_version = int(version)
        if self.paced:
            self.paced = False
            for ident in list(self.actors):
                self.grant(ident, self.window(ident) - self.in_hand(ident))

    def release_held(self) -> None:
        """Replay: hands back the credits held while the learner was behind, once it owes
        at most a trajectory per actor."""
        slack = self.replay.ratio * self.traj_steps * max(len(self.actors), 1)
        while self.held and self.replay.owed() <= slack:
            self.grant(self.held.popleft())

    def steer(self, now: float, busy_s: float | None = None) -> None:
        """Hands back the replay credits held while the learner was behind, as far as it has
        caught up; then asks the controller for its actions (it moves at most once a
        period) and applies a move: the reuse budget at once, a larger window by granting
        the new slots. `busy_s`: the learner's seconds with an update running so far, which
        with the actors' credit waits (their heartbeats) says which side sets the pace."""
        if self.held:
            self.release_held()
        controller, measures = self.controller, self.measures
        moves, decided = controller.moves, controller.decisions
        throttled = self.replay is not None and self.replay.throttled
        times = self.actor_time_summary()["actor_time_s"] if self.actor_time_s else None
        actions = controller.decide(
            now,
            measures.production_rate(now),
            measures.consumption_rate(now),
            throttled=throttled,
            busy_s=busy_s,
            credit_wait_s=times and times["waiting_credit"],
            actor_wall_s=times and times["wall"],
        )
        if self.replay is not None and controller.decisions != decided:
            self.replay.throttled = False  # a new period
        if controller.moves == moves:
            return
        self.limits.max_reuse = actions.max_reuse
        for ident in list(self.actors):
            self.grant(ident, self.window(ident) - self.in_hand(ident))

    # ------------------------------------------------------------------ admission
    def ingest(self, msg, finite: bool, now: float) -> None:
        """Admits a trajectory the receiver has checked and decoded (`finite`: every
        floating field finite), and hands its sender's credit back when it is not kept."""
        batch, episodes, act_steps = msg.tree
        samples = self.traj_steps
        ident = msg.sender.encode()
        info = self.actors.get(ident)
        logged = self._logged(msg, info, batch, act_steps)
        if info is not None:
            info.accounted += 1
            info.outstanding -= 1
            info.last_traj = now
            if count(info.actor) is not None:
                self.received_by_actor[info.actor] += 1
        # every step carries the version that acted (several where an actor took a newer
        # one mid-rollout, runtime.param_refresh: step); the header names the oldest.
        # Stamps that cannot be true are dropped and counted, never learned from
        fault = step_versions_fault(
            batch.version,
            int(msg.version),
            int(self.version()),
            time_axis=1 - batch_axis("version", type(batch)),
        )
        if self.mode.fixed_order and (not finite or fault is not None):
            why = "non-finite" if not finite else f"stamped with impossible versions ({fault})"
            raise OrderBroken(
                f"runtime.deterministic: a trajectory from {msg.sender} was {why}; its round "
                "cannot be learned in order"
            )
        if not finite:
            self.dropped_nonfinite += 1
            logged("nonfinite")
            self.limits.discard()
            self.grant(ident)
            return
        if fault is not None:
            self.dropped_bad_versions[fault] += 1
            logged(f"bad_versions:{fault}")
            self.limits.discard()
            self.grant(ident)
            return
        self.mixed_versions += int(np.ptp(np.asarray(batch.version)) > 0)
        order = None
        if self.mode.fixed_order:
            order, why = self._order(msg.body)
            if why is not None:
                self.dropped_order[why] += 1
                logged(f"order:{why}")
                self.limits.discard()
                self.grant(ident)
                return
        if self.measures.produced + samples > self.budget:
            # beyond the budget: only a trajectory taken as lost that came after all (its
            # slot, handed back, let its actor make another). Dropped and counted, as a
            # trajectory too stale to admit is
            self.measures.refused(samples)
            logged("budget")
            self.limits.discard()
            return
        admitted = self.limits.admit(int(msg.version), int(self.version()), samples, now)
        if admitted:
            if info is not None and count(info.actor) is not None:
                self.admitted_at[info.actor] = time.time()
            self.act_steps = int(act_steps)
            self.lag_max = max(self.lag_max, self.env_steps - self.act_steps)
            self.env_steps += samples
        done = np.asarray(episodes.done)
        if done.any():
            won = None if getattr(episodes, "won", None) is None else np.asarray(episodes.won)[done]
            self.episodes(np.asarray(episodes.returns)[done], self.env_steps, now, won)
        if not admitted:
            logged("stale")
            self.grant(ident)
        elif self.replay is not None:
            # NOTE: one process only: every process of a multi-process run must take the same
            # number of (collective) updates, so there the ratio is the target's
            scale = self.controller.actions.replay_scale if jax.process_count() == 1 else 1.0
            logged("replay", scale=scale)
            self.replay.add(batch, samples, scale)
            self.held.append(ident)
            self.release_held()
            self.replay.throttled |= bool(self.held)
        else:
            self.pool.admit(int(msg.version), ident, batch, logged("pool"), order)

    def _logged(self, msg, info, batch, act_steps) -> Callable[..., int]:
        """What logs this trajectory, once its fate is known: `logged(to, **extra)` writes
        it to the replay log and returns its index there (-1 without a log)."""
        if self.log is None:
            return lambda to, **extra: -1
        actor = info.actor if info is not None and count(info.actor) is not None else None
        version = np.asarray(batch.version)
        # the versions along T of the first env (every env of a vector step has one)
        version_t = np.take(version, 0, axis=batch_axis("version", type(batch)))
        return lambda to, **extra: self.log.trajectory(
            msg, actor, version_t, int(act_steps), to, **extra
        )

    def _order(self, body) -> tuple:
        """(order, None) for a deterministic-lag trajectory the learner can still learn
        from, else (None, the reason it cannot): its body names no valid (round, shard),
        its round was learned already (resent by a restarted actor), or it is a copy."""
        order = order_of(body, self.config.batch_trajectories)
        if order is None:
            return None, "malformed"
        version = int(self.version())
        if order[0] < version:
            return None, "past_round"
        if order in self._orders:
            return None, "duplicate"
        self._orders = {o for o in self._orders if o[0] >= version}
        self._orders.add(order)
        return order, None

    # ------------------------------------------------------------------ control
    def handle_control(self, ident, msg: dict, now: float) -> None:
        kind = msg.get("type")
        if kind == "evaluation":  # the evaluator's (it is no actor: no credits, no ledger)
            if self.evaluations is not None:
                self.evaluations(msg, now)
            return
        if kind not in ("register", "heartbeat"):
            return
        sent = count(msg.get("sent"))
        # an earlier process of the same actor id (killed and restarted, in any launch
        # mode): the slots it held are gone with it. Left in, they would count against the
        # budget until its silence timed out, and near the end of a run the learner would
        # wait for trajectories no one can send
        replaced = (
            kind == "register"
            and count(msg.get("actor")) is not None
            and self._drop(msg.get("actor"), keep=ident)
        )
        new = ident not in self.actors
        info = self.actors.setdefault(ident, ActorLedger(actor=msg.get("actor"), last_traj=now))
        info.last_seen = now
        if new or kind == "register":
            # a new or restarted actor counts its trajectories from 0; one heard first by a
            # heartbeat (it worked for a learner that restarted) from what it says it sent
            info.accounted, info.claim = (sent or 0) if kind == "heartbeat" else 0, None
        if (times := actor_times(msg.get("time_s"))) is not None:
            self.actor_time_s[ident] = times
        # an actor's counts come with each heartbeat, and with its registration
        if count(info.actor) is not None and sent is not None:
            steps = count(msg.get("env_steps"))
            self.reported_by_actor[info.actor] = {
                "sent": sent,
                "env_steps": steps,
                # to earlier learner incarnations, and made for one replaced before they went
                "sent_before": count(msg.get("sent_before")),
                "unsent": count(msg.get("unsent")),
            }
        # a sync actor waits for the next version after each trajectory: one slot is all it
        # uses, and more would let the first actors take a small budget from the others
        if new or replaced:
            self.controller.actors_changed(len(self.actors))
        window = self.window(ident)
        if kind == "register" or new:
            # a new or restarted actor (or, heard first by a heartbeat, one that was working
            # for a learner that restarted): whatever it held before is gone
            self._write_off(info)
            self.grant(ident, window)
            self.publish()  # a late joiner gets the current parameters at once
            return
        lost, info.claim = lost_trajectories(
            info.claim,
            sent,
            info.accounted,
            now,
            LOST_AFTER_BEATS * self.config.runtime.heartbeat_s,
            self.rx.backlog_empty,
        )
        if lost:
            # trajectories it sent long ago that never came (rejected on the way, or a
            # connection that broke with them queued): hand their slots back
            info.outstanding -= lost
            info.accounted += lost
            self.written_off += lost
            self.limits.discard(lost)
            self.grant(ident, window)

    def actor_time_summary(self) -> dict:
        """Where the actors' time went, summed over every actor this learner heard from (as
        of each one's newest heartbeat, at most `runtime.heartbeat_s` old): seconds acting,
        waiting for a credit, waiting for parameters, sending, their wall and CPU time, and
        the share of wall time spent waiting (credits, parameters or a full socket)."""
        total = dict.fromkeys(ACTOR_TIME_KEYS, 0.0)
        for times in self.actor_time_s.values():
            for k in total:
                total[k] += times[k]
        waited = total["waiting_credit"] + total["waiting_params"] + total["sending"]
        return {
            "actor_time_s": total,
            "actor_wait_fraction": waited / total["wall"] if total["wall"] else None,
        }

    def count_unread(self, senders: list[str]) -> None:
        """Counts, per actor id, the trajectories the receiver held or read at the stop
        (tianjax.runtime.learner.receiver.Receiver.unread_at_stop): an actor's newest
        heartbeat may have counted them as sent."""
        for sender in senders:
            info = self.actors.get(sender.encode())
            if info is not None and count(info.actor) is not None:
                self.unread_by_actor[info.actor] += 1

    def actor_counts(self) -> dict:
        """Per actor id: trajectories received from it (and, counted at the stop, those that
        arrived and were never taken: unread_at_stop), and what its newest heartbeat (at most
        `runtime.heartbeat_s` old, from its current process) said it had sent and stepped."""
        ids = sorted(set(self.received_by_actor) | set(self.reported_by_actor))
        return {
            str(a): {
                "received": self.received_by_actor.get(a, 0),
                **({"unread_at_stop": n} if (n := self.unread_by_actor.get(a, 0)) else {}),
                **self.reported_by_actor.get(a, {}),
            }
            for a in ids
        }

    def pump(self, timeout_ms: int) -> int:
        """Waits up to timeout_ms for control messages and trajectories and takes in what
        the receiver thread has checked and decoded, the pool's room permitting: with a
        full pool the thread stops reading, so the high-water marks push back on actors.
        Returns the trajectories received."""
        if self._poller is None:
            self._poller = zmq.Poller()
            self._poller.register(self.control.socket, zmq.POLLIN)
            self._poller.register(self.rx.wake, zmq.POLLIN)
        self.rx.start()
        room = self.limits.accept_more(len(self.pool))
        self.rx.set_room(room)
        events = dict(self._poller.poll(timeout=0 if room and self.rx.ready else timeout_ms))
        now = time.perf_counter()
        if self.control.socket in events:
            self._drain_control(now)
        if self.rx.wake in events:
            self.rx.drain_wake()
        received = 0
        while (
            room
            and len(self.pool) < self.config.runtime.max_pool
            and (item := self.rx.take()) is not None
        ):
            self.ingest(*item, now)
            received += 1
        return received

    def _drain_control(self, now: float) -> None:
        while (item := self.control.poll(0)) is not None:
            self.handle_control(*item, now)

    def silent_actors(self, now: float) -> list[int]:
        """Registered actors not heard from (control or trajectories) for longer than the
        heartbeat timeout: hung, stopped, or cut off."""
        limit = self.config.runtime.heartbeat_timeout_s
        # NOTE: read what waits on the control socket first: after a long update the
        # heartbeats that arrived meanwhile are queued, not missing
        self._drain_control(now)
        return sorted(
            info.actor
            for info in self.actors.values()
            if isinstance(info.actor, int) and info.silent_for(now) > limit
        )

    def forget_actor(self, actor_id: int) -> None:
        """Drops an actor that is being replaced; its replacement registers afresh. What it
        already delivered stays in the pool."""
        if self._drop(actor_id):
            self.controller.actors_changed(len(self.actors))

    def _drop(self, actor_id, keep: bytes | None = None) -> bool:
        """Removes every identity of `actor_id` but `keep`; returns whether any was."""
        gone = [
            ident for ident, info in self.actors.items() if ident != keep and info.actor == actor_id
        ]
        for ident in gone:
            self._write_off(self.actors.pop(ident))
            self.control.forget(ident)
        return bool(gone)

    def _write_off(self, info: ActorLedger) -> None:
        """The credits an actor process held when it went (dropped, or restarted and
        registering afresh): their trajectories will never come, so admission by version
        stops counting them as started (left in, each restart would shrink its room for
        good, and enough of them would hold every credit back)."""
        self.limits.discard(max(info.outstanding, 0))
        info.outstanding = 0


__all__ = ["Ingress"]
