"""One run's record, kept the same way by all three runners (fused, the in-process host
trainer, and the distributed learner): the episode trackers, the metric records
(metrics.jsonl and TensorBoard through the run's RunLogger, and the console progress), the
checkpoint cadence with resume, and the result dict that train() turns into summary.json.

What each runner counts and measures is its own; how it is kept is here:

- clock: `elapsed(now)` is the run's wall time, a resumed run's included (the checkpoint's
  `wall_time_s` goes on); training time runs from `training()`, after compilation, to
  `end_training()`, after the last update and before the final checkpoint, whose save is
  timed apart (summary.json's `final_checkpoint_s`).
- episodes: one EpisodeTracker, or one per seed (fused `num_seeds`; the return and win
  rate are their means, and a run has converged when its slowest seed has).
- records: each opens with env_steps, updates, wall_time_s, env_steps_per_s (this
  session's env steps over its training time), the runner's rates, return_mean_100,
  win_rate_100 (envs that report wins) and episodes; then the runner's own fields.
- evaluations: each is a record of its own (tianjax.runtime.record.evaluations), and the
  book of them (final and best, with their versions) goes into the checkpoints' meta and
  the summary; the progress line shows the latest.
- checkpoints: every `checkpoint.every` updates (`due`), and, with `checkpoint.final`, at
  the end; the meta holds the config's shape keys, the runner's counters, the wall time so
  far and the trackers' state (`tracker`, or `trackers` per seed).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Callable

import jax
import numpy as np

from tianjax.checkpoint import store as ckpt
from tianjax.config import Config
from tianjax.metrics import EpisodeTracker, Progress, RunLogger
from tianjax.metrics.tracker import finished_episodes
from tianjax.runtime.record.evaluations import EvalBook, eval_record
from tianjax.runtime.record.outcome import RunOutcome


class RunRecorder:
    """`seeds`: one tracker per seed (fused), kept in checkpoints as `trackers`; None for
    one tracker (`tracker`). `wins`: whether the env reports wins (None: as the trackers
    have seen). `win_target`: whether config.target_win_rate decides convergence."""

    def __init__(
        self,
        config: Config,
        logger: RunLogger | None = None,
        progress: Progress | None = None,
        *,
        seeds: int | None = None,
        wins: bool | None = None,
        win_target: bool = True,
    ):
        self.config, self.logger, self.progress = config, logger, progress
        target = config.target_win_rate if win_target else None
        self.trackers = [
            EpisodeTracker(config.target_return, target_win_rate=target) for _ in range(seeds or 1)
        ]
        self.per_seed = seeds is not None
        self._wins = wins
        self.wall_offset = 0.0  # a resumed run's wall time before this session
        self.resumed_from: int | None = None
        self.t_start = 0.0  # when this session began, less wall_offset
        self.t_train = 0.0
        self.env_steps0 = 0  # env steps when this session's training began
        self.train_time: float | None = None
        self.final_checkpoint_s: float | None = (
            None  # the final save's wall time (None: none saved)
        )
        self.saver: ckpt.Checkpointer | None = None
        self.evals = EvalBook()
        # [wall time, return] of every finished episode, when a runner merges the episodes
        # of several learners (learner groups) into one moving average (None: not kept)
        self.episode_log: list | None = None

    # ------------------------------------------------------------------ clock
    def start(self, t_start: float) -> None:
        """The session began at `t_start` (perf_counter); its clock goes on from a resumed run's."""
        self.t_start = t_start - self.wall_offset

    def elapsed(self, now: float) -> float:
        return now - self.t_start

    def training(self, now: float, env_steps: int) -> None:
        """Training (after compilation) begins at `now`, with `env_steps` already done."""
        self.t_train, self.env_steps0 = now, env_steps

    def end_training(self, now: float) -> None:
        self.train_time = now - self.t_train

    def session_time(self, now: float) -> float:
        """The training time, or (a session that did not end its training) all of it."""
        return (
            self.train_time
            if self.train_time is not None
            else now - self.t_start - self.wall_offset
        )

    # ------------------------------------------------------------------ episodes
    @property
    def tracker(self) -> EpisodeTracker:
        return self.trackers[0]

    def add(self, returns, ended_at, now: float, wins=None, seed: int = 0) -> None:
        """Finished episodes: their returns, the env-step count at each end (or one for all)."""
        self.trackers[seed].add(returns, ended_at, self.elapsed(now), wins=wins)
        if self.episode_log is not None:
            t = round(self.elapsed(now), 3)
            self.episode_log += [[t, float(r)] for r in np.asarray(returns).reshape(-1)]

    def add_rollout(
        self, done, returns, base_steps: int, now: float, won=None, seed: int = 0
    ) -> None:
        """The episodes that ended in a rollout's [..., B] steps, the first of which ends at
        env step base_steps + B (see finished_episodes)."""
        if won is None:
            self.add(*finished_episodes(done, returns, base_steps), now, seed=seed)
        else:
            r, steps, w = finished_episodes(done, returns, base_steps, won)
            self.add(r, steps, now, wins=w, seed=seed)

    @property
    def reports_wins(self) -> bool:
        return self._wins if self._wins is not None else all(t.reports_wins for t in self.trackers)

    @property
    def moving_average(self) -> float:
        return float(np.mean([t.moving_average for t in self.trackers]))

    @property
    def win_rate(self) -> float:
        return float(np.mean([t.win_rate for t in self.trackers]))

    @property
    def converged(self) -> bool:
        """Every seed's tracker has reached the target."""
        return all(t.converged for t in self.trackers)

    def stop_now(self) -> bool:
        """config.stop_at_target is set and the run has converged: end it here."""
        return self.config.stop_at_target and self.converged

    @property
    def episodes(self) -> int:
        return int(sum(t.episodes for t in self.trackers))

    # ------------------------------------------------------------------ records
    def record(
        self,
        env_steps: int,
        updates: int,
        now: float,
        rates: dict | None = None,
        fields: dict | None = None,
        shown: dict | None = None,
    ) -> dict:
        """Logs one record (see the module doc) and updates the progress line with the
        return, the `shown` values and the env steps per second."""
        rec = {
            "env_steps": env_steps,
            "updates": updates,
            "wall_time_s": self.elapsed(now),
            "env_steps_per_s": (env_steps - self.env_steps0) / max(now - self.t_train, 1e-9),
            **(rates or {}),
            "return_mean_100": self.moving_average,
        }
        if self.reports_wins:
            rec["win_rate_100"] = self.win_rate
        rec["episodes"] = self.episodes
        rec.update(fields or {})
        if self.logger is not None:
            self.logger.log(rec)
        if self.progress is not None:
            latest = self.evals.final
            self.progress.update(
                env_steps,
                ret=rec["return_mean_100"],
                **({"eval": latest["eval_return"]} if latest else {}),
                **(shown or {}),
                sps=int(rec["env_steps_per_s"]),
            )
        return rec

    def evaluation(
        self, version: int, env_steps: int, now: float, fields: dict, age_s: float = 0.0
    ) -> tuple[dict, bool]:
        """Logs one evaluation of `version` (taken `age_s` before `now`) as a record of its
        own; returns (the record, whether it is the best so far)."""
        rec = eval_record(version, env_steps, self.elapsed(now) - age_s, fields)
        best = self.evals.add(rec)
        if self.logger is not None:
            self.logger.log(rec)
        return rec, best

    # ------------------------------------------------------------------ checkpoints
    def resume(self, template):
        """(tree, meta) of config.resume's newest readable checkpoint; the clock, the
        trackers and `resumed_from` go on from it."""
        # an unreadable newest step of the directory this run goes on writing to is moved
        # aside (by one process of a multi-process run), so that this run's save of that
        # step writes it rather than taking it for done
        resume = self.config.resume
        ours = self.logger is not None and os.path.abspath(self.logger.run_dir) == os.path.abspath(
            resume
        )
        step, tree, meta = ckpt.restore_latest(
            resume, template, move_aside=ours and jax.process_index() == 0
        )
        ckpt.check_compatible(meta, self.config, self.config.resume)
        self.wall_offset = float(meta["wall_time_s"])
        for tracker, state in zip(
            self.trackers, meta["trackers"] if self.per_seed else [meta["tracker"]]
        ):
            tracker.load_state_dict(state)
        self.evals.load_state_dict(meta.get("evaluations"))
        self.resumed_from = step
        if ours and jax.process_index() == 0:
            # (the version saved: a fused DQN's step label runs ahead of it during learning_starts)
            self.logger.supersede_after(int(meta.get("updates", step)))
        return tree, meta

    def open_checkpoints(self, root: str, start: int) -> None:
        """Checkpoints under `root`, the cadence counted from step `start`."""
        cc = self.config.checkpoint
        self.saver = ckpt.Checkpointer(root, cc.keep, cc.every, start=start)

    def due(self, step: int) -> bool:
        return self.saver is not None and self.saver.due(step)

    def save(
        self,
        step: int,
        tree,
        now: float,
        counters: dict,
        extra: dict | None = None,
        wall_time_s: float | None = None,
    ) -> None:
        """A checkpoint labelled `step`; its meta: the runner's `counters`, the wall time so
        far (`wall_time_s`, default the run's), the trackers, then `extra`."""
        trackers = [t.state_dict() for t in self.trackers]
        meta = dict(
            ckpt.run_meta(self.config),
            **counters,
            wall_time_s=self.elapsed(now) if wall_time_s is None else wall_time_s,
            **({"trackers": trackers} if self.per_seed else {"tracker": trackers[0]}),
            evaluations=self.evals.state_dict(),
            **(extra or {}),
        )
        self.saver.save(step, tree, meta)

    def final_checkpoint(
        self, save: Callable[[], None], tolerant: bool = False, allowed: bool = True
    ) -> None:
        """With checkpoint.final (and `allowed`), `save()`; then closes the checkpoints.
        `tolerant`: a failed save (an update interrupted after it donated the state) is a
        warning, and the last periodic checkpoint stands."""
        if self.saver is None:
            return
        try:
            if self.config.checkpoint.final and allowed:
                t = time.perf_counter()
                save()
                self.final_checkpoint_s = time.perf_counter() - t
        except Exception as e:  # noqa: BLE001
            if not tolerant:
                raise
            print(
                f"tianjax: warning: no final checkpoint ({type(e).__name__}: {e}); "
                f"the last periodic one stands",
                file=sys.stderr,
                flush=True,
            )
        finally:
            self.close()

    def close(self) -> None:
        if self.saver is not None:
            self.saver.close()
            self.saver = None

    # ------------------------------------------------------------------ result
    def result(
        self,
        *,
        params,
        algo,
        env,
        env_steps: int,
        updates: int,
        skipped_updates: int,
        compile_time_s: float,
        interrupted: bool,
        extra_summary: dict,
        now: float | None = None,
    ) -> RunOutcome:
        """What train() reports: `env_steps` per seed; the rate counts this session's env
        steps of every seed over its training time."""
        n = len(self.trackers)
        train_time = self.session_time(time.perf_counter() if now is None else now)
        conv = [t.convergence_time_s for t in self.trackers]
        conv_steps = [t.convergence_env_steps for t in self.trackers]
        return RunOutcome(
            params=params,
            algo=algo,
            env=env,
            env_steps=env_steps * n,
            updates=updates,
            skipped_updates=skipped_updates,
            train_time_s=train_time,
            compile_time_s=compile_time_s,
            env_steps_per_s=(env_steps - self.env_steps0) * n / max(train_time, 1e-9),
            resumed_from_step=self.resumed_from,
            interrupted=interrupted,
            wall_offset_s=self.wall_offset,
            episodes=self.episodes,
            final_return=self.moving_average,
            # with several seeds, the run has converged when its slowest seed has
            convergence_time_s=None if any(c is None for c in conv) else max(conv),
            convergence_env_steps=None if any(c is None for c in conv_steps) else max(conv_steps),
            final_win_rate=self.win_rate if self.reports_wins else None,
            extra_summary=dict(
                extra_summary, final_checkpoint_s=self.final_checkpoint_s, **self.evals.summary()
            ),
            final_return_per_seed=[t.moving_average for t in self.trackers]
            if self.per_seed and n > 1
            else None,
        )


def sample_rates(config: Config, algo, env_steps: int, train_time: float) -> dict:
    """Fresh and consumed samples per second of a single-process loop: every env step is
    learned from once (fresh); on-policy each update consumes its batch once, off-policy
    each gradient step consumes the replay section's batch_size items. No reuse here."""
    t = max(train_time, 1e-9)
    if algo.buffer.replayed:
        rc = config.replay_config  # items: transitions, or sequences of rollout_len steps
        item_steps = algo.buffer.item_steps(config.rollout_len)
        learned = max(env_steps - rc.learning_starts, 0) // (config.num_envs * config.rollout_len)
        consumed = learned * rc.updates_per_rollout * rc.batch_size * item_steps
    else:
        consumed = env_steps
    return {
        "samples_fresh_per_s": env_steps / t,
        "samples_consumed_per_s": consumed / t,
        "reuse_fraction": 0.0,
    }


def save_params(path: str, params) -> None:
    """Parameters as a .npz of leaves keyed by their tree paths (plain arrays, no pickle)."""
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    tmp = path + ".tmp.npz"
    np.savez(tmp, **{jax.tree_util.keystr(k): np.asarray(v) for k, v in flat})
    os.replace(tmp, path)


__all__ = ["RunRecorder", "sample_rates", "save_params"]
