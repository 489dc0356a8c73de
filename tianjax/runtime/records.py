"""What a learner keeps and reports: its checkpoints (state, replay buffer, counters) and
resume from them, the metric records it logs, and the result of a run. A mixin of
`Learner` (tianjax/runtime/learner.py), whose state it reads and writes."""

from __future__ import annotations

import collections
import sys
import time

import jax
import numpy as np

from tianjax import checkpoint as ckpt
from tianjax.runtime.inflight import to_host


class LearnerRecords:
    """Checkpoints, resume, records and results (methods of `Learner`)."""

    def _checkpoint_tree(self) -> dict:
        tree = {"learner": self.state}
        if self.replay and self.config.checkpoint.replay:
            tree.update(replay=self.rb, sample_key=self._sample_key)
        return tree

    def _resume(self, run_dir: str) -> None:
        """Continues from the newest readable checkpoint: state, version, counters."""
        step, tree, meta = ckpt.restore_latest(run_dir, self._checkpoint_tree())
        ckpt.check_compatible(meta, self.config, run_dir)
        self.state = tree["learner"]
        if "replay" in tree:
            self.rb, self._sample_key = tree["replay"], tree["sample_key"]
            self.replay_added = meta["replay_added"]
            starts = self.config.replay_config.learning_starts
            self.replay_earned = float(meta.get("replay_earned",
                                                self.replay_ratio * max(self.replay_added - starts, 0)))
        self.env_steps = int(meta["env_steps"])
        self.fresh_updates = int(meta["fresh_updates"])
        self.wall_offset = float(meta["wall_time_s"])
        self.tracker.load_state_dict(meta["tracker"])
        self.balance.load_state_dict(meta["balance"])
        if self.replay:
            # without the buffer's contents, the buffer refills to learning_starts and the
            # ratio is held over what this session adds
            self.learned = int(meta["learned"]) if "replay" in tree else 0
        self._version_cache = int(to_host(self.state.version))
        self.resumed_from = step

    def save_checkpoint(self, now: float, t_start: float) -> None:
        if self.saver is None:
            return
        meta = dict(ckpt.run_meta(self.config), updates=self.state_version, env_steps=self.env_steps,
                    fresh_updates=self.fresh_updates, wall_time_s=self.wall_offset + now - t_start,
                    tracker=self.tracker.state_dict(), balance=self.balance.state_dict(),
                    learned=getattr(self, "learned", 0), replay_added=getattr(self, "replay_added", 0),
                    replay_earned=getattr(self, "replay_earned", 0.0))
        with self.fd_reserve.released():
            self.saver.save(self.state_version, self._checkpoint_tree(), meta)

    def _final_checkpoint(self, t_start: float, completed: bool) -> None:
        if self.saver is None:
            return
        try:
            # NOTE: in a multi-process run every learner must join a save; after a failure
            # on one of them the others would wait for it, so only a whole run saves there
            if self.config.checkpoint.final and (completed or jax.process_count() == 1):
                self.save_checkpoint(time.perf_counter(), t_start)
        except Exception as e:  # noqa: BLE001 - interrupted mid-update: the state was donated
            print(f"tianjax: warning: no final checkpoint ({type(e).__name__}: {e}); "
                  f"the last periodic one stands", file=sys.stderr, flush=True)
        finally:
            self.saver.close()
            self.saver = None

    def _log(self, pending, t_start, t_train):
        now = time.perf_counter()
        train_time = max(now - t_train, 1e-9)
        record = {
            "env_steps": self.env_steps,
            "updates": self.state_version,
            "wall_time_s": now - t_start,
            "env_steps_per_s": (self.env_steps - self._counts0[0]) / train_time,
            **self._sample_rates(train_time),
            "return_mean_100": self.tracker.moving_average,
            **({"win_rate_100": self.tracker.win_rate} if self.tracker.reports_wins else {}),
            "episodes": self.tracker.episodes,
            "pool": len(self.pool),
            "actors_seen": len(self.actors),
            "rejected_messages": sum(self.traj_in.rejected.values()) + sum(self.control.rejected.values()),
            "dropped_nonfinite": self.dropped_nonfinite,
            **self.balance.metrics(now),
            **self.controller.metrics(),
            # consumed samples per tau since the previous record (TensorBoard histogram)
            "staleness_hist": self.balance.take_interval_histogram(),
        }
        record["samples_fresh"] = self._fresh_samples()
        if self.replay:
            record["replay_ratio"] = self.replay_ratio_measured()
            record["replay_ratio_target"] = self.replay_ratio
        if self.algo.schedules is not None:
            # what the actors acted with: the schedules at the global count they last used
            record["actor_env_steps"] = self._act_steps
            # how far behind the global count an actor's schedules were, at worst, this interval
            record["actor_steps_lag_max"], self._lag_max = self._lag_max, 0
            record.update({k: float(v) for k, v in self.algo.schedules(self._act_steps).items()})
        if pending:
            host = to_host(pending)
            record.update({k: float(np.mean([m[k] for m in host])) for k in host[0]})
        if self.logger is not None:
            self.logger.log(record)
        if self.progress is not None:
            self.progress.update(self.env_steps, ret=record["return_mean_100"],
                                 tau=record["staleness_mean"], sps=int(record["env_steps_per_s"]))

    def _sample_rates(self, train_time: float) -> dict:
        """Fresh samples (learned from for the first time; off-policy: added to replay) and
        consumed samples (every sample of every update, reuse and replay included) per
        second of this session's training, and the share of consumption that was reuse."""
        fresh = self._fresh_samples() - self._counts0[2]
        consumed = self.balance.consumed - self._counts0[1]
        return {"samples_fresh_per_s": fresh / train_time,
                "samples_consumed_per_s": consumed / train_time,
                # share of training wall time (compilation excluded) with an update running
                "learner_busy_fraction": min(self.inflight.busy_s / train_time, 1.0),
                "reuse_fraction": 1.0 - fresh / consumed if consumed and not self.replay else 0.0}

    def _fresh_samples(self) -> int:
        # off-policy, a sample is fresh when it enters the replay buffer: it is learned from
        # (replay_ratio times on average) from then on
        return self.replay_added if self.replay else self.balance.fresh

    def result(self, t_start: float) -> dict:
        train_time = getattr(self, "_train_time", time.perf_counter() - t_start - self.wall_offset)
        stats = self.balance.staleness_stats()
        rejected = collections.Counter(self.traj_in.rejected) + collections.Counter(self.control.rejected)
        return {
            "params": to_host(self.state.params),
            "algo": self.algo,
            "env": None,
            "env_steps": self.env_steps,
            "updates": self.state_version,
            "skipped_updates": int(to_host(self.state.skipped_updates)),
            "train_time_s": train_time,
            "compile_time_s": self.compile_time_s,
            "env_steps_per_s": (self.env_steps - self._counts0[0]) / max(train_time, 1e-9),
            "resumed_from_step": self.resumed_from,
            "interrupted": getattr(self, "interrupted", False),
            "wall_offset_s": self.wall_offset,
            "episodes": self.tracker.episodes,
            "final_return": self.tracker.moving_average,
            "convergence_time_s": self.tracker.convergence_time_s,
            "convergence_env_steps": self.tracker.convergence_env_steps,
            "final_win_rate": self.tracker.win_rate if self.tracker.reports_wins else None,
            "extra_summary": {
                "num_actors": self.config.num_actors,
                **self._sample_rates(max(train_time, 1e-9)),
                **({"replay_ratio": self.replay_ratio_measured(), "replay_ratio_target": self.replay_ratio}
                   if self.replay else {}),
                "staleness_mean": stats["staleness_mean"],
                "staleness_max": stats["staleness_max"],
                "staleness_histogram": self.balance.staleness_histogram(),
                "dropped_samples": self.balance.dropped,
                "dropped_nonfinite": self.dropped_nonfinite,
                # every valid trajectory that arrived (admitted or dropped): what the actors sent
                "trajectories_received": self.traj_in.accepted,
                "rejected_messages": sum(rejected.values()),
                "rejected_by_reason": dict(rejected),
                # connections refused at the handshake (no run credentials), by reason
                "handshakes_refused": dict(self.net.gatekeeper.refused),
                "balance": {**self.balance.metrics(time.perf_counter()), **self.controller.metrics()},
                "learner_devices": int(self.mesh.devices.size),
                # where the time went: this process's CPU seconds while training, and the actors'
                "learner_cpu_s": getattr(self, "_train_cpu", None),
                **self.actor_time_summary(),
            },
        }
