"""What the distributed learner measures beside the fields every runner records
(tianjax.runtime.record.recorder): its sample rates, the state of its ingress and balance
controller in each metrics record, and the run's extra summary (staleness, drops, rejections, the
controller's settings, and where the learner's and the actors' time went).

Rates count this session only: fresh samples (learned from for the first time; off-policy,
added to replay) and consumed samples (every sample of every update, reuse and replay
included) per second of training, and the share of consumption that was reuse.
"""

from __future__ import annotations

import collections

import numpy as np

from tianjax.config import Config
from tianjax.core.algorithm import Algorithm
from tianjax.runtime.balance.controller import AdaptiveBalance
from tianjax.runtime.balance.controller import pace as learner_sets_pace
from tianjax.runtime.balance.measures import Measures
from tianjax.runtime.learner.batches.replay import ReplayBatches
from tianjax.runtime.learner.inflight import InFlight, to_host
from tianjax.runtime.learner.ingress import Ingress


def pace(learner_busy: float, actor_time_s: dict) -> dict:
    """Which side set the pace over the run (the rule the balance controller applies to each
    of its periods, tianjax.runtime.balance.controller.pace): the learner when the actors
    waited for credits for a larger share of their time than the learner waited for data;
    else the actors. With both shares, so a reader can see by how much."""
    wall = actor_time_s.get("wall") or 0.0
    credit_wait = actor_time_s.get("waiting_credit", 0.0) / wall if wall else None
    if credit_wait is None:
        return {"pace_set_by": None, "actor_credit_wait_fraction": None}
    idle = 1.0 - learner_busy
    return {
        "pace_set_by": "learner" if learner_sets_pace(credit_wait, idle) else "actors",
        "actor_credit_wait_fraction": credit_wait,
        "learner_idle_fraction": idle,
    }


class LearnerStats:
    """`channels`: the trajectory and control channels (their accepted and rejected
    counts); `net`: the learner's SecureContext (the connections it refused)."""

    def __init__(
        self,
        config: Config,
        algo: Algorithm,
        ingress: Ingress,
        measures: Measures,
        controller: AdaptiveBalance,
        inflight: InFlight,
        replay: ReplayBatches | None,
        channels: tuple,
        net,
        devices: int,
    ):
        self.config, self.algo, self.ingress, self.measures = config, algo, ingress, measures
        self.controller, self.inflight, self.replay = controller, inflight, replay
        self.traj_in, self.control = channels
        self.net, self.devices = net, devices
        self._counts0 = (0, 0)  # samples consumed and fresh when this session began
        self.train_cpu_s: float | None = None  # this process's CPU seconds while training

    def begin(self) -> None:
        self._counts0 = (self.measures.consumed, self.fresh_samples())

    def fresh_samples(self) -> int:
        # off-policy, a sample is fresh when it enters the replay buffer: it is learned from
        # (replay_ratio times on average) from then on
        return self.replay.added if self.replay is not None else self.measures.fresh

    def rates(self, train_time: float) -> dict:
        """This session's sample rates over `train_time` (see the module doc)."""
        fresh = self.fresh_samples() - self._counts0[1]
        consumed = self.measures.consumed - self._counts0[0]
        return {
            "samples_fresh_per_s": fresh / train_time,
            "samples_consumed_per_s": consumed / train_time,
            # share of training wall time (compilation excluded) with an update running
            "learner_busy_fraction": min(self.inflight.busy_s / train_time, 1.0),
            "reuse_fraction": 1.0 - fresh / consumed if consumed and self.replay is None else 0.0,
        }

    def _replay_ratios(self) -> dict:
        if self.replay is None:
            return {}
        return {
            "replay_ratio": self.replay.ratio_measured(),
            "replay_ratio_target": self.replay.ratio,
        }

    def fields(self, now: float, pending: list[dict]) -> dict:
        """A record's learner fields; `pending`: the finished updates' metrics since the last."""
        ingress = self.ingress
        out = {
            "pool": len(ingress.pool),
            "actors_seen": len(ingress.actors),
            "rejected_messages": sum(self.traj_in.rejected.values())
            + sum(self.control.rejected.values()),
            "dropped_nonfinite": ingress.dropped_nonfinite,
            "dropped_bad_versions": sum(ingress.dropped_bad_versions.values()),
            **self.measures.metrics(now),
            **self.controller.metrics(),
            # consumed samples per tau since the previous record (TensorBoard histogram)
            "staleness_hist": self.measures.take_interval_histogram(),
        }
        out["samples_fresh"] = self.fresh_samples()
        out.update(self._replay_ratios())
        if self.algo.schedules is not None:
            # what the actors acted with: the schedules at the global count they last used
            out["actor_env_steps"] = ingress.act_steps
            # how far behind the global count an actor's schedules were, at worst, this interval
            out["actor_steps_lag_max"], ingress.lag_max = ingress.lag_max, 0
            out.update({k: float(v) for k, v in self.algo.schedules(ingress.act_steps).items()})
        if pending:
            host = to_host(pending)
            out.update({k: float(np.mean([m[k] for m in host])) for k in host[0]})
        return out

    def summary(self, now: float, train_time: float) -> dict:
        """The run's extra summary (summary.json). The keys in PER_INCARNATION count what
        this learner process saw since it started (a restarted or resumed learner's start
        afresh; the summary lists them under "counted_since_learner_start"); the rest,
        the balance's counts included, go on across checkpoints."""
        stats = self.measures.staleness_stats()
        rejected = collections.Counter(self.traj_in.rejected) + collections.Counter(
            self.control.rejected
        )
        return {
            "num_actors": self.config.num_actors,
            **self.rates(max(train_time, 1e-9)),
            **self._replay_ratios(),
            "staleness_mean": stats["staleness_mean"],
            "staleness_max": stats["staleness_max"],
            "staleness_histogram": self.measures.staleness_histogram(),
            "dropped_samples": self.measures.dropped,
            "dropped_nonfinite": self.ingress.dropped_nonfinite,
            # per-step versions that cannot be true (tianjax.core.staleness.step_versions_fault)
            "dropped_bad_versions": sum(self.ingress.dropped_bad_versions.values()),
            "dropped_bad_versions_by_reason": dict(self.ingress.dropped_bad_versions),
            # trajectories acted with more than one version (runtime.param_refresh: step)
            "trajectories_mixed_versions": self.ingress.mixed_versions,
            # deterministic-lag mode: trajectories whose (round, shard) was malformed, already
            # learned, or a copy (tianjax.runtime.learner.batches.ordered)
            "dropped_order_by_reason": dict(self.ingress.dropped_order),
            # every valid trajectory that arrived (admitted or dropped): what the actors sent
            "trajectories_received": self.traj_in.accepted,
            # said sent by an actor, never come: their slots were handed back (the ingress)
            "trajectories_written_off": self.ingress.written_off,
            # per actor id: received, and sent / env steps as its newest heartbeat said
            "trajectories_by_actor": self.ingress.actor_counts(),
            "rejected_messages": sum(rejected.values()),
            "rejected_by_reason": dict(rejected),
            # connections refused, by reason: at the handshake (no run credentials), or
            # at accept for a host over runtime.max_connections_per_host ("per_host_limit")
            "handshakes_refused": dict(self.net.refused),
            "balance": {**self.measures.metrics(now), **self.controller.metrics()},
            "learner_devices": self.devices,
            # where the time went: this process's CPU seconds while training, and the actors'
            "learner_cpu_s": self.train_cpu_s,
            **(times := self.ingress.actor_time_summary()),
            **pace(
                self.rates(max(train_time, 1e-9))["learner_busy_fraction"], times["actor_time_s"]
            ),
            "counted_since_learner_start": list(PER_INCARNATION),
        }


# summary keys that count from this learner process's start, not across checkpoints
PER_INCARNATION = (
    "dropped_nonfinite",
    "dropped_bad_versions",
    "dropped_bad_versions_by_reason",
    "trajectories_mixed_versions",
    "dropped_order_by_reason",
    "trajectories_received",
    "trajectories_written_off",
    "rejected_messages",
    "rejected_by_reason",
    "handshakes_refused",
    "learner_cpu_s",
    "actor_time_s",
    "actor_wait_fraction",
    "skipped_fresh_samples",
    "trajectories_by_actor",
    "pace_set_by",
    "actor_credit_wait_fraction",
    "learner_idle_fraction",
)

__all__ = ["PER_INCARNATION", "LearnerStats"]
