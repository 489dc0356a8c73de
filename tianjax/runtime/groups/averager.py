"""The averager of learner groups: its own small process, an event loop around a zmq poller
that takes the groups' deltas as they come and closes rounds (tianjax.core.outer_step).

    deltas in   DeltaReceiver (PULL): each group's change since its reference point, its
                version the round it was computed against
    averages    AveragePublisher (PUB): (round, average) with the body {"round", "settled"},
    out         each to the groups it concerns (their own topic): when a round closes, to the
                groups whose deltas it settled; at once to a group that subscribes (it
                starts, or comes back); and to every group every groups.timeout_s / 2

No barrier: a round closes when every live group has a delta waiting, or when the oldest
delta waiting has waited groups.round_wait_s. A group is live from the averager's start
and while it has sent within groups.timeout_s; one silent longer (killed, cut off, far
behind) is left out of rounds, said in one line, and is live again with its next delta (a
restarted group learner, a new incarnation, also starts from the newest average). A group
that sends its final delta is done and never waited for again.

Each delta is settled once: merged into a round, or dropped (its weight is 0: staler than
groups.max_staleness), and the average's body says so per group, so that each group
knows what the average holds of its own progress (tianjax.runtime.groups.sync).

The average, its momentum, the round and the settled table are checkpointed with orbax
every groups.checkpoint_every rounds and at the end; a restarted averager goes on from
its newest checkpoint (deltas that were waiting are lost with the process, stopped or
killed, and their groups learn it from the new incarnation: they keep that progress and
send it again).
Round 0's average is the groups' common initial parameters, made from the config's seed
as every group makes its own.
"""

from __future__ import annotations

import collections
import sys
import time
from typing import Callable, NamedTuple

import jax
import numpy as np

from tianjax.checkpoint import store as ckpt
from tianjax.config import Config
from tianjax.core import outer_step
from tianjax.metrics import RunLogger
from tianjax.runtime.process import shutdown
from tianjax.transport.deltas import AveragePublisher, DeltaReceiver, group_topic
from tianjax.transport.security import secure_context
from tianjax.transport.sockets import address, process_incarnation

NAME = "averager"  # its sender name; its address is NAME@incarnation
POLL_MS = 50


def initial_params(config: Config):
    """The parameters every group starts from: the algorithm's initial state for
    config.seed, as tianjax.runtime.learner.sharded_update makes it (host arrays)."""
    from tianjax.algos import make_algorithm
    from tianjax.envs.factory import env_spec

    obs_shape, obs_dtype, action_spec = env_spec(config)
    algo = make_algorithm(
        config,
        obs_shape,
        action_spec,
        correct_staleness=config.staleness.correct,
        obs_dtype=obs_dtype,
    )
    params = jax.jit(algo.init)(jax.random.key(config.seed)).params
    return jax.tree.map(np.asarray, params)


class Pending(NamedTuple):
    group: int
    inc: str  # the group learner's incarnation
    seq: int  # the delta's sequence number in that incarnation
    base: int  # the round it was computed against
    tree: object
    arrived: float
    nbytes: int
    final: bool


class Averager:
    """`run_dir`: where its checkpoints, config.yaml, metrics.jsonl (a record per round) and
    summary.json go; it resumes from a checkpoint found there (a restart), else from
    `resume_dir`'s (a run resumed by the user), else starts at round 0. `endpoints`
    ({"deltas", "averages"}) and `listen_fds` as the learner's (tianjax.launch.ports).
    `incarnation`: its own (default: the process's, as every role's)."""

    def __init__(
        self,
        config: Config,
        run_key,
        run_dir: str,
        *,
        endpoints: dict | None = None,
        listen_fds: dict | None = None,
        resume_dir: str | None = None,
        incarnation: str | None = None,
    ):
        self.config, self.groups = config, config.groups
        self.count = config.groups.count
        self.logger = RunLogger(config, run_dir, tensorboard=False)
        self.run_dir = self.logger.run_dir
        template = initial_params(config)
        self.state = outer_step.init(template)
        # per group: [incarnation, newest delta seq settled, "merged" | "dropped"]
        self.settled: dict[int, list] = {}
        self.counts = collections.Counter()  # merged, dropped, rounds, ...
        self.per_round: list[int] = []  # deltas of each round of this session
        self.taus: collections.Counter = (
            collections.Counter()
        )  # staleness in rounds of merged deltas
        self.resumed_from: int | None = None
        self._restore(resume_dir)
        rt, ep, fds = config.runtime, endpoints or {}, listen_fds or {}
        self.net = secure_context(run_key, rt, server=True)
        # (`limit`: no limit on connections, but each one's TCP back-off capped)
        net = dict(
            ctx=self.net.ctx, handshake=self.net.handshake, host=rt.bind_host, limit=self.net.limit
        )
        inc = incarnation or process_incarnation()
        self.address = address(NAME, inc)
        # an exact-shape template: a delta of another structure or size is refused unread
        self.rx = DeltaReceiver(
            run_key,
            template,
            endpoint=ep.get("deltas"),
            use_fd=fds.get("deltas"),
            name=NAME,
            incarnation=inc,
            hwm=max(4, 2 * self.count),
            **net,
        )
        self.topics = [group_topic(g) for g in range(self.count)]
        self.pub = AveragePublisher(
            run_key,
            endpoint=ep.get("averages"),
            use_fd=fds.get("averages"),
            sender=NAME,
            incarnation=inc,
            topics=tuple(self.topics),
            **net,
        )
        self.saver = ckpt.Checkpointer(
            self.run_dir, keep=3, every=self.groups.checkpoint_every, start=self.round
        )
        self.pending: list[Pending] = []
        self.t0 = time.perf_counter()
        self.heard = {g: self.t0 for g in range(self.count)}  # live from the start
        self.left_out: set[int] = set()
        self.done: set[int] = set()
        self.incarnations: dict[int, str] = {}
        self._host = jax.tree.map(np.asarray, self.state.average)  # what is published
        self._last_publish = 0.0

    # ------------------------------------------------------------------ state
    @property
    def round(self) -> int:
        return int(self.state.round)

    @property
    def endpoints(self) -> dict:
        return {"deltas": self.rx.endpoint, "averages": self.pub.endpoint}

    def _tree(self) -> dict:
        return {"average": self.state.average, "momentum": self.state.momentum}

    def _restore(self, resume_dir: str | None) -> None:
        for where in (self.run_dir, resume_dir):
            if where and ckpt.has_checkpoint(where):
                step, tree, meta = ckpt.restore_latest(where, self._tree())
                self.state = outer_step.OuterState(
                    tree["average"], tree["momentum"], np.asarray(meta["round"], np.int32)
                )
                self.settled = {int(g): list(v) for g, v in meta["settled"].items()}
                self.counts.update(meta.get("counts", {}))
                self.taus.update({int(k): v for k, v in meta.get("taus", {}).items()})
                self.resumed_from = step
                return

    def save(self) -> None:
        meta = dict(
            ckpt.run_meta(self.config),
            round=self.round,
            settled={str(g): v for g, v in self.settled.items()},
            counts=dict(self.counts),
            taus={str(k): v for k, v in self.taus.items()},
        )
        self.saver.save(self.round, self._tree(), meta)

    # ------------------------------------------------------------------ the loop
    def run(self, should_stop: Callable[[], bool] = lambda: False) -> dict:
        """Takes deltas and closes rounds until every group has sent its final delta,
        `should_stop()` says so, or a stop is requested (SIGTERM); returns the summary."""
        self._publish(time.perf_counter())
        interrupted = False
        try:
            # a SIGTERM only sets the stop flag in here: the loop stops at its next check,
            # never inside a round or a checkpoint (tianjax.runtime.process.shutdown)
            with shutdown.critical():
                while not should_stop() and len(self.done) < self.count and not self._abandoned():
                    shutdown.check()
                    msg = self.rx.recv(POLL_MS)
                    now = time.perf_counter()
                    if msg is not None:
                        self._take(msg, now)
                    self._liveness(now)
                    if self._due(now):
                        self._close_round(now)
                    self.pub.serve_subscriptions()
                    if self.pub.subscribed:  # groups that start or come back
                        joined, self.pub.subscribed = set(self.pub.subscribed), []
                        self._publish(now, [t for t in self.topics if t in joined])
                    if now - self._last_publish >= self.groups.timeout_s / 2:
                        self._publish(now)
                if self.pending and len(self.done) == self.count:  # the final deltas
                    self._close_round(time.perf_counter())
        except KeyboardInterrupt:
            interrupted = True
        with shutdown.critical():
            self.save()
        return self.summary(interrupted)

    def _take(self, msg, now: float) -> None:
        body = msg.body or {}
        g = body.get("group")
        if type(g) is not int or not 0 <= g < self.count or msg.sender != f"group-{g}":
            self.counts["rejected_group"] += 1  # authenticated, but no group of this run
            return
        if self.incarnations.get(g) not in (None, msg.inc):
            self.counts["group_restarts"] += 1
            print(f"tianjax: group {g}: a new learner process joined", file=sys.stderr, flush=True)
        self.incarnations[g] = msg.inc
        if g in self.left_out:
            self.left_out.discard(g)
            self.counts["rejoins"] += 1
            print(f"tianjax: group {g} is back: in the rounds again", file=sys.stderr, flush=True)
        self.heard[g] = now
        final = body.get("final") is True
        if final:
            self.done.add(g)
        else:
            self.done.discard(g)
        self.counts["deltas"] += 1
        self.counts["bytes_in"] += msg.nbytes
        self.pending.append(
            Pending(g, msg.inc, msg.seq, msg.version, msg.tree, now, msg.nbytes, final)
        )

    def _abandoned(self) -> bool:
        """No group has been heard for runtime.connect_timeout_s (a run across hosts whose
        groups are all gone, or never came): the averager ends too."""
        last = max(self.heard.values(), default=self.t0)
        return time.perf_counter() - last > self.config.runtime.connect_timeout_s

    def _live(self) -> set[int]:
        return set(range(self.count)) - self.left_out - self.done

    def _liveness(self, now: float) -> None:
        for g in self._live():
            if now - self.heard[g] > self.groups.timeout_s:
                self.left_out.add(g)
                self.counts["left_out"] += 1
                print(
                    f"tianjax: warning: group {g} silent for more than "
                    f"{self.groups.timeout_s:g} s: left out of rounds until it sends again",
                    file=sys.stderr,
                    flush=True,
                )

    def _due(self, now: float) -> bool:
        if not self.pending:
            return False
        waiting = {p.group for p in self.pending}
        return self._live() <= waiting or now - self.pending[0].arrived >= self.groups.round_wait_s

    def _close_round(self, now: float) -> None:
        deltas, self.pending = self.pending, []
        r = self.round
        taus = np.asarray([max(r - p.base, 0) for p in deltas], np.int32)
        g = self.groups
        self.state, weights = outer_step.outer_step(
            self.state,
            [p.tree for p in deltas],
            taus,
            outer=g.outer,
            lr=g.outer_lr,
            momentum=g.outer_momentum,
            schedule=g,
        )
        weights = np.asarray(weights)
        for p, w, tau in zip(deltas, weights, taus):
            merged = bool(w > 0)
            self.settled[p.group] = [p.inc, p.seq, "merged" if merged else "dropped"]
            self.counts["merged" if merged else "dropped"] += 1
            if merged:
                self.taus[int(tau)] += 1
        advanced = self.round > r
        if advanced:
            self.counts["rounds"] += 1
            self.per_round.append(int((weights > 0).sum()))
            self._host = jax.tree.map(np.asarray, self.state.average)
        self._publish(now, sorted({self.topics[p.group] for p in deltas}))
        self.logger.log(
            {
                "round": self.round,
                "wall_time_s": now - self.t0,
                "unix_time": time.time(),  # the clock every process shares (when it merged)
                "deltas": len(deltas),
                "merged": int((weights > 0).sum()),
                "staleness_rounds": [int(t) for t in taus],
                "groups": [p.group for p in deltas],
                "merged_groups": [p.group for p, w in zip(deltas, weights) if w > 0],
            }
        )
        if advanced and self.saver.due(self.round):
            self.save()

    def _publish(self, now: float, topics: list[bytes] | None = None) -> None:
        """The newest average to the groups of `topics` (default: every group)."""
        body = {"round": self.round, "settled": {str(g): v for g, v in self.settled.items()}}
        for topic in self.topics if topics is None else topics:
            self.pub.publish(self.round, self._host, body=body, topic=topic)
            self.counts["publishes"] += 1
            self.counts["bytes_out"] += sum(a.nbytes for a in jax.tree.leaves(self._host))
        if topics is None:
            self._last_publish = now

    # ------------------------------------------------------------------ the record
    def summary(self, interrupted: bool = False) -> dict:
        c, hist = self.counts, self.taus
        merged = sum(hist.values())
        return {
            "groups": self.count,
            "outer": self.groups.outer,
            "rounds": self.round,
            "rounds_this_session": len(self.per_round),
            "resumed_from_round": self.resumed_from,
            "deltas_received": c["deltas"],
            "deltas_merged": c["merged"],
            # staler than groups.max_staleness: weighed 0 (their groups learn it)
            "deltas_dropped": c["dropped"],
            "deltas_per_round_mean": float(np.mean(self.per_round)) if self.per_round else None,
            "delta_staleness_mean": (
                sum(k * v for k, v in hist.items()) / merged if merged else None
            ),
            "delta_staleness_max": max(hist) if hist else None,
            "delta_staleness_histogram": {str(k): hist[k] for k in sorted(hist)},
            "bytes_in": c["bytes_in"],  # delta payloads received
            "bytes_out": c["bytes_out"],  # average payloads sent (each to one group)
            "publishes": c["publishes"],
            "groups_left_out": c["left_out"],  # times a group fell silent past timeout_s
            "group_rejoins": c["rejoins"],
            "group_restarts": c["group_restarts"],
            "groups_done": sorted(self.done),
            "rejected_messages": sum(self.rx.rejected.values()) + c["rejected_group"],
            "rejected_by_reason": {**self.rx.rejected, "group": c["rejected_group"]},
            "handshakes_refused": dict(self.net.refused),
            "wall_time_s": time.perf_counter() - self.t0,
            "interrupted": interrupted,
        }

    def close(self, summary: dict | None = None) -> None:
        if summary is not None:
            self.logger.write_summary(summary)
        self.saver.close()
        self.rx.close()
        self.pub.close()
        self.net.close()
        self.logger.close()


def final_average(run_dir: str):
    """The newest average an averager checkpointed in `run_dir` (host arrays), its round."""
    _, tree, meta = ckpt.restore_latest(run_dir)
    return tree["average"], int(meta["round"])


__all__ = ["NAME", "Averager", "final_average", "initial_params"]
