"""The actor role: act with the newest parameters it holds, push stamped trajectories.

    async: never waits for parameters. Before each rollout it drains the parameter socket
           and keeps the newest version (latest-version-wins); if nothing new arrived it
           acts again with what it has. With runtime.param_refresh step (host envs) it also
           looks, without waiting, before every vector step, and acts with a newer version
           from that step on: each step is stamped with the version that acted, and the
           trajectory goes out under its oldest.
    sync:  after sending a trajectory made with version v it waits for version v + 1
           (strict assignment dependencies: the baseline).

With `staleness.forced_lag` K (async) it keeps the last K + 1 versions it received and acts
with the one K behind the newest: a lag forced in the runtime, exact as long as the
parameter channel delivered every version (publish_every 1 and an actor that drains its
socket each rollout; the channel keeps only the newest, so a skipped version makes the
lag larger, never smaller).

In the deterministic-lag mode (runtime.deterministic) an actor process steps its env
shards (tianjax.runtime.actor.shards) round by round: round r of each, in shard order, acted
with version max(0, r - k) from the ring of versions each parameter message carries, once
it holds a version >= r - k (that wait paces it, not credits). It keeps its shards' rollout
states before the last rounds, and rewinds to the round of a restarted learner's version,
so that the learner's resume is exact.

Flow control is by credits: the learner grants each actor a few trajectory slots and
returns one whenever it consumes (or drops) a trajectory of that actor. An actor starts a
rollout only with a credit in hand, so it slows down exactly when the learner falls behind,
and nothing piles up unseen in socket buffers to be learned from later at high staleness.
(ZeroMQ's high-water marks alone cannot do this: the kernel's TCP buffers hold hundreds of
small messages behind them.) Every wait is a poll with a timeout, during which heartbeats
continue and a stop is noticed.

Each heartbeat also says where the actor's time went since it registered: acting (the
rollout: policy and env steps), waiting for a credit (the learner is behind), waiting for
parameters (sync: the next version), sending (the learner's socket full), and the CPU time
of its process, so that a run can show whether its actors or its learner set the pace.
"""

from __future__ import annotations

import collections
import os
import sys
import time
from typing import Callable

import jax
import numpy as np
import zmq

from tianjax.config import Config
from tianjax.core import lag
from tianjax.core.types import ParamsMessage
from tianjax.runtime.actor.shards import shard_seed, shards_of, tag
from tianjax.runtime.actor.sources import make_source
from tianjax.runtime.modes import Mode, mode_of
from tianjax.runtime.process import shutdown
from tianjax.transport.channels import ControlClient, ParamSubscriber, TrajectorySender
from tianjax.transport.security import secure_context

# the exit code of an actor whose learner is gone or failed: restarting it cannot help
LEARNER_GONE = 3
# where an actor's wall time goes (seconds), as its heartbeats report it
TIME_KEYS = ("acting", "waiting_credit", "waiting_params", "sending")


def actor_seed(config: Config, actor_id: int) -> int:
    """The seed of an actor's envs and action sampling: every process of that actor id (a
    restarted one too) starts from it, so its rollouts can be acted again in order (the
    replay log, tianjax.runtime.runners.rerun)."""
    return shard_seed(config.seed, actor_id)


def lagged_version(held: list[int], lag: int) -> int:
    """The version an actor with a forced lag acts with, of the versions it holds (ascending):
    the newest at most `lag` below the newest held, or the oldest held when none is (the
    first K versions of a run, or after the channel skipped versions)."""
    newest = held[-1]
    within = [v for v in held if v <= newest - lag]
    return within[-1] if within else held[0]


class ActorStopped(Exception):
    """The learner said stop (or went away for longer than the heartbeat timeout)."""


class LearnerPresence:
    """Whether the learner's process is there before it has said anything: a connection
    to its control port comes up. A starting learner (joining the other learners,
    compiling) holds its ports; one that never came, or ended, does not. It reads the
    control channel's `link`, which its context's connection watcher keeps from the
    socket's monitor (tianjax.transport.connections: a socket has one monitor only, and
    the watcher's also caps the connection's TCP back-off)."""

    def __init__(self, channel):
        if channel.link is None:
            raise ValueError("the control channel needs a connection watcher (limit=)")
        self._link = channel.link

    def absent_for(self, now: float) -> float:
        """Seconds (`now`: monotonic) since the learner's port last held a connection (0
        while it does)."""
        return 0.0 if self._link.connected else max(0.0, now - self._link.since)


class Actor:
    def __init__(
        self,
        config: Config,
        actor_id: int,
        endpoints: dict,
        run_key: bytes,
        mode: Mode | None = None,
        before_connecting: Callable[[], None] | None = None,
    ):
        """`mode`: the run's sync or async strategy (default: the config's).
        `before_connecting`: called once the actor is built and compiled, before it opens a
        socket (a warm standby waits there for its turn: tianjax.launch.supervisor)."""
        self.config = config
        self.mode = mode if mode is not None else mode_of(config)
        self.actor_id = actor_id
        # the source's own env gives the spaces (building a second env to read them costs
        # start-up time that every run pays)
        self.seed = actor_seed(config, actor_id)
        self.source = make_source(config, seed=self.seed)
        self.rollouts = 0  # made by this process, sent or not (each trajectory names its own)
        self.algo = self.source.algo
        self._params_template = jax.eval_shape(self.algo.init, jax.random.key(0)).params
        # compiled before connecting, so that the learner sees the actor register only when
        # it is ready to act (its subscriber conflates: it holds the newest version whenever
        # it reads, however long it did not)
        self.source.compile(self._params_template)
        published = self._params_template
        # the deterministic-lag mode: this process's env shards, one source each (one
        # compiled rollout), and the ring of versions every parameter message carries
        self.shards: dict[int, object] = {}
        if self.mode.fixed_order:
            k = config.runtime.deterministic_lag
            mine = shards_of(actor_id, config.num_actors, config.batch_trajectories)
            self.shards = {
                s: self.source if s == actor_id else make_source(config, shard_seed(config.seed, s))
                for s in mine
            }
            for source in self.shards.values():
                source.share_compiled(self.source)
            published = jax.eval_shape(lambda p: lag.init(p, k + 1, k).ring, published)
            self._behaviour = jax.jit(lambda ring, r: lag.behaviour(lag.LagState(ring, k), r)[0])
        params_template = ParamsMessage(published, np.zeros((), np.int64))
        if before_connecting is not None:
            before_connecting()
        rt = config.runtime
        # the run's handshake: under curve the actor only talks to a learner holding its key
        self.net = secure_context(run_key, rt, server=False)
        # (`limit`: the context's connection watcher, which caps each connection's TCP
        # back-off: after a cut at the learner's side, what the actor sent during it is
        # moving again within a second of the heal)
        net = dict(ctx=self.net.ctx, handshake=self.net.handshake, limit=self.net.limit)
        # actor-side schedules follow the global count, which moves on between versions
        self.params_in = ParamSubscriber(
            run_key,
            endpoints["params"],
            params_template,
            same_version=self.algo.schedules is not None,
            max_bytes=int(rt.max_message_mb * 2**20),
            **net,
        )
        self.traj_out = TrajectorySender(
            run_key, endpoints["traj"], sender=f"actor-{actor_id}", hwm=rt.send_hwm, **net
        )
        self.control = ControlClient(
            run_key, endpoints["control"], identity=f"actor-{actor_id}", **net
        )
        self.presence = LearnerPresence(self.control)
        self.version = -1
        self.params = None
        self.credits = 0
        self.sent = 0  # trajectories sent since it (last) registered: heartbeats report it
        # trajectories sent to earlier learner incarnations (a learner restarted), and those
        # made for a learner that was replaced before they went out: what a restart cost
        self.sent_before = 0
        self.unsent = 0
        self.env_steps = 0  # stepped by this actor
        self.global_steps = 0  # admitted by the learner, as of the newest parameters
        self._last_beat = 0.0
        self._last_heard = time.monotonic()
        self._learner_restarts = 0
        self.learner_restarted = False  # set when a restarted learner is first heard
        self._pending = None  # the newest (version, ParamsMessage) drained, not yet acted with
        # staleness.forced_lag K: the versions received, newest last; it acts with K behind
        self.lag = config.staleness.forced_lag
        # runtime.param_refresh: take newer versions between vector steps too (async, host envs)
        self.refresh_per_step = config.refresh_per_step and self.mode.takes_newest
        self._ring: collections.deque = collections.deque(maxlen=self.lag + 1)
        self.time_s = dict.fromkeys(TIME_KEYS, 0.0)
        self._t0 = self._cpu0 = None  # wall clock and CPU time when it registered

    # ------------------------------------------------------------------ waiting, politely
    def _beat(self) -> None:
        now = time.monotonic()
        if self.control.to is None:
            return  # no learner heard yet: nobody to address
        if now - self._last_beat >= self.config.runtime.heartbeat_s:
            self.control.send(
                {
                    "type": "heartbeat",
                    "actor": self.actor_id,
                    "version": self.version,
                    "env_steps": self.env_steps,
                    "credits": self.credits,
                    "sent": self.sent,
                    "sent_before": self.sent_before,
                    "unsent": self.unsent,
                    "time_s": {
                        **self.time_s,
                        "wall": time.perf_counter() - self._t0,
                        "cpu": time.process_time() - self._cpu0,
                    },
                }
            )
            self._last_beat = now

    def _check_control(self) -> None:
        if shutdown.requested.is_set():  # a SIGTERM whose SystemExit was swallowed
            raise SystemExit(143)
        while (msg := self.control.recv(0)) is not None:
            self._last_heard = time.monotonic()
            if msg.get("type") == "stop":
                if isinstance(msg.get("error"), str):
                    raise ActorStopped(f"the learner failed: {msg['error']}")
                raise ActorStopped()
            if msg.get("type") == "credit":
                n = msg.get("n")
                if isinstance(n, int) and 0 < n <= 1024:
                    self.credits += n

    def _take_newest(self, activate: bool = True) -> bool:
        """Drains the parameter socket, keeping the newest message; with `activate`, acts
        with it from now on. Returns whether anything new arrived.

        An actor waiting for a credit drains too (without activating): the newest message
        also says the learner is alive."""
        newest = self.params_in.latest(0)  # only versions newer than ours, or a new learner's
        if newest is not None:
            self._last_heard = time.monotonic()
            self._pending = newest
        if activate:
            self._activate_pending()
        if newest is None:
            return False
        if self.params_in.source != self.control.to:
            # the first learner heard, or a restarted one (from its last checkpoint): every
            # message goes to that incarnation from now on (a learner takes no other's), and
            # a restarted one's credits and version count start afresh, so register again
            # and follow its versions from here
            if self.control.to is not None:
                self._learner_restarts += 1
                self.learner_restarted = True
            self.control.to = self.traj_out.to = self.params_in.source
            self.credits = 0
            self.sent_before += self.sent
            self.sent = 0
            # with its counts, so that the ledger has them even if no heartbeat follows (a
            # learner killed again, or a run ending, within a beat of this)
            self.control.send(
                {
                    "type": "register",
                    "actor": self.actor_id,
                    "pid": os.getpid(),
                    "env_steps": self.env_steps,
                    "sent": 0,
                    "sent_before": self.sent_before,
                    "unsent": self.unsent,
                }
            )
        return True

    def _activate_pending(self) -> None:
        """Acts with the newest message drained, if one waits (with a forced lag, with the
        version K behind it)."""
        if self._pending is None:
            return
        version, message = self._pending
        self._pending = None
        if self.lag:
            self._act_lagged(int(version), message)
        else:
            if int(version) != self.version or self.params is None:
                self.params = jax.device_put(message.params)  # once per version
            self.version = int(version)
        self.global_steps = int(message.env_steps)

    def _refresh_in_flight(self):
        """runtime.param_refresh step: asked by a host source before each vector step of a
        rollout. Drains the parameter socket without waiting and takes a newer version from
        the learner this rollout is for; (params, version) when the acting version changed,
        else None. A restarted learner's first version waits for the next rollout (this one
        is dropped: its credit went with the old learner)."""
        to = self.control.to
        self._take_newest(activate=False)
        if self._pending is None or self.control.to != to:
            return None
        before = self.version
        self._activate_pending()
        return None if self.version == before else (self.params, self.version)

    def _act_lagged(self, version: int, message) -> None:
        """Keeps `version` in the ring of versions received and acts with the one K behind
        the newest (`lagged_version`): exact where the actor received every version, at
        least K behind where the parameter channel skipped some (it keeps the newest)."""
        if not self._ring or self._ring[-1][0] != version:
            if self._ring and version < self._ring[-1][0]:  # a restarted learner: start afresh
                self._ring.clear()
            self._ring.append((version, jax.device_put(message.params)))
        chosen = lagged_version([v for v, _ in self._ring], self.lag)
        self.version, self.params = next(item for item in self._ring if item[0] == chosen)

    def _wait_for_version(self, minimum: int, timeout: float | None = None) -> None:
        """Blocks (polling, with heartbeats) until a version >= minimum is held."""
        poller = zmq.Poller()
        poller.register(self.params_in.socket, zmq.POLLIN)
        poller.register(self.control.socket, zmq.POLLIN)
        timeout = timeout or self.config.runtime.heartbeat_timeout_s
        self.learner_restarted = False
        while True:
            self._take_newest()
            if self.version >= minimum or self.learner_restarted:
                return
            self._check_control()
            self._beat()
            now = time.monotonic()
            if now - self._last_heard > timeout:
                raise ActorStopped(f"no parameters from the learner for {timeout:.0f} s")
            lost = self.config.runtime.heartbeat_timeout_s
            if self.control.to is None and self.presence.absent_for(now) > lost:
                # before its first word a learner may take connect_timeout_s, but only
                # while its process holds its ports
                raise ActorStopped(
                    f"no learner at {self.control.endpoint} for {lost:.0f} s "
                    "(runtime.heartbeat_timeout_s): it never came, or it ended"
                )
            poller.poll(timeout=int(1000 * self.config.runtime.heartbeat_s))

    def _wait_for_credit(self) -> None:
        """Flow control: blocks (polling, with heartbeats) until the learner grants a slot."""
        timeout = self.config.runtime.heartbeat_timeout_s
        poller = zmq.Poller()
        poller.register(self.params_in.socket, zmq.POLLIN)
        poller.register(self.control.socket, zmq.POLLIN)
        while True:
            self._check_control()
            if self.credits > 0:
                return
            self._take_newest(activate=False)
            self._beat()
            if time.monotonic() - self._last_heard > timeout:
                raise ActorStopped(f"no word from the learner for {timeout:.0f} s")
            poller.poll(timeout=int(1000 * self.config.runtime.heartbeat_s))

    def _send(self, rollout, acted_at: int, body: dict) -> bool:
        """Sends a rollout to the learner that granted its credit (`body`: what rides with
        it: where it came from, for the replay log, or its round and shard in the
        deterministic-lag mode). False if that learner was replaced meanwhile (its credit
        went with it: the rollout is dropped)."""
        poll_ms = int(1000 * self.config.runtime.heartbeat_s)
        message = (rollout.batch, rollout.episodes, np.asarray(acted_at, np.int64))
        # one number for the trajectory: its oldest step's version (admission and the
        # learner's pool order by it, so their bounds hold for every step)
        oldest = int(np.min(rollout.batch.version))
        granted_by = self.traj_out.to
        while not self.traj_out.send(message, oldest, timeout_ms=poll_ms, body=body):
            # the learner is not reading (its pool is full): wait, but stay alive and stoppable
            self._check_control()
            self._beat()
            if self.mode.takes_newest:
                self._take_newest()
            elif self.mode.fixed_order:
                self._take_newest(activate=False)  # (a restarted learner is noticed)
            if self.traj_out.to != granted_by:
                return False
            timeout = self.config.runtime.heartbeat_timeout_s
            if time.monotonic() - self._last_heard > timeout:
                raise ActorStopped(f"the learner took nothing and said nothing for {timeout:.0f} s")
        return True

    # ------------------------------------------------------------------ the loop
    def _timed(self, key: str, fn, *args):
        t = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.time_s[key] += time.perf_counter() - t

    def _rollout_args(self, acted_at: int) -> tuple:
        """The source's arguments: the params and version to act with, the global count the
        schedules follow, and (runtime.param_refresh step) where newer versions come from."""
        args = (self.params, self.version, acted_at)
        return args + (self._refresh_in_flight,) if self.refresh_per_step else args

    def _run_ordered(self) -> None:
        """The deterministic-lag mode's loop: round r of every shard this process hosts,
        in shard order, acted with version max(0, r - k) once a version >= that is held (the
        lag paces the actor; credits are not waited for). It starts at the round of the
        learner's version (0, or a resumed learner's) and stops after the budget's rounds."""
        cfg = self.config
        k, rounds = cfg.runtime.deterministic_lag, cfg.total_env_steps // cfg.steps_per_update
        round_, learner = self.version, self.control.to
        # the shards' rollout states before each of the last rounds, so that a learner
        # restarted from a checkpoint at most checkpoint.every updates old is followed from
        # there exactly (the rounds after it made again as they were)
        history: collections.OrderedDict = collections.OrderedDict()
        keep = cfg.checkpoint.every + k + 4
        if round_ > 0:
            print(
                f"tianjax: actor {self.actor_id}: joined at round {round_} with fresh envs (a "
                "restarted actor, or a resumed run): the run goes on, not as the uninterrupted "
                "run",
                file=sys.stderr,
                flush=True,
            )
        while True:
            if round_ >= rounds:  # every round made: wait for the learner's stop
                self._timed("waiting_params", self._wait_for_version, 1 << 62)
            else:
                self._timed("waiting_params", self._wait_for_version, round_ - k)
            if self.control.to != learner:  # a restarted learner goes on from its checkpoint
                round_, learner = self.version, self.control.to
                if round_ in history:
                    for shard, source in self.shards.items():
                        source.restore(history[round_][shard])
                elif history:
                    print(
                        f"tianjax: actor {self.actor_id}: the learner restarted at round {round_}, "
                        f"before the rounds this actor keeps ({next(iter(history))} on): it goes "
                        "on from its envs as they are (not as the uninterrupted run)",
                        file=sys.stderr,
                        flush=True,
                    )
                history.clear()
            # NOTE: the ring holds versions V - k .. V of the message held (V <= the round
            # of any rollout the learner still needs); a round it has passed is skipped
            round_ = max(round_, self.version)
            if round_ >= rounds:
                continue
            if round_ not in history:
                history[round_] = {shard: src.snapshot() for shard, src in self.shards.items()}
                while len(history) > keep:
                    history.popitem(last=False)
            params = self._behaviour(self.params, round_)
            version = max(round_ - k, 0)
            acted_at = round_ * cfg.steps_per_update
            granted_by = self.control.to
            for shard, source in self.shards.items():
                rollout = self._timed("acting", source, params, version, acted_at)
                self.env_steps += source.steps_per_call
                if self.control.to != granted_by:
                    self.unsent += 1
                    break  # the learner restarted mid-round
                if self._timed("sending", self._send, rollout, acted_at, tag(round_, shard)):
                    self.sent += 1
                else:
                    self.unsent += 1
                self._beat()
            else:
                round_ += 1

    def run(self) -> int:
        self._t0, self._cpu0 = time.perf_counter(), time.process_time()
        try:
            # it registers with the learner whose parameters it first receives (the
            # parameters name that learner's incarnation, see _take_newest)
            # the learner may still be starting (compiling, joining a multi-host mesh)
            self._last_heard = time.monotonic()
            self._timed(
                "waiting_params", self._wait_for_version, 0, self.config.runtime.connect_timeout_s
            )
            if self.mode.fixed_order:
                self._run_ordered()  # (it ends by ActorStopped)
            while True:
                self._timed("waiting_credit", self._wait_for_credit)
                if self.mode.takes_newest:
                    self._take_newest()
                # actor-side schedules (epsilon) follow the learner's global count, so every
                # actor, and a restarted one, is at the same point of one schedule
                acted_at = self.global_steps
                granted_by = self.control.to
                sent_with = self.version
                rollout = self._timed("acting", self.source, *self._rollout_args(acted_at))
                index, self.rollouts = self.rollouts, self.rollouts + 1
                self.env_steps += self.source.steps_per_call
                if self.control.to != granted_by:
                    self.unsent += 1
                    continue  # the learner restarted mid-rollout: its credit went with it
                # what the replay log records of where it came from
                origin = {"rollout": index, "seed": self.seed}
                if self._timed("sending", self._send, rollout, acted_at, origin):
                    self.credits -= 1
                    self.sent += 1
                else:
                    self.unsent += 1
                self._beat()
                if self.mode.waits_for_next_version:
                    self._timed("waiting_params", self._wait_for_version, sent_with + 1)
        except ActorStopped as e:
            if e.args:
                print(
                    f"tianjax: actor {self.actor_id} stopping: {e.args[0]}",
                    file=sys.stderr,
                    flush=True,
                )
                return LEARNER_GONE
            return 0
        finally:
            self.close()

    def close(self) -> None:
        self.source.close()
        for source in self.shards.values():
            source.close()
        for ch in (self.params_in, self.traj_out, self.control):
            ch.close()
        self.net.close()


__all__ = [
    "LEARNER_GONE",
    "TIME_KEYS",
    "Actor",
    "ActorStopped",
    "LearnerPresence",
    "actor_seed",
    "lagged_version",
]
