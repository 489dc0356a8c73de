"""The run directory: resolved config, metrics.jsonl (one object per log step), summary.json,
and TensorBoard events under tb/."""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

import numpy as np
import yaml

from tianjax.config import Config


def _plain(x: Any) -> Any:
    """JSON-safe: numpy/jax scalars to Python, non-finite floats to None."""
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if hasattr(x, "item") and np.ndim(x) == 0:
        x = x.item()
    elif hasattr(x, "tolist"):
        return _plain(np.asarray(x).tolist())
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def write_json_atomic(path: str, obj: Any) -> Any:
    """Writes obj (made JSON-safe) to path via a temporary file: never half-written."""
    obj = _plain(obj)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2)
    os.replace(tmp, path)
    return obj


def read_metrics(run_dir: str, name: str = "metrics.jsonl") -> list[dict]:
    """The records of RUN_DIR/metrics.jsonl, or of another JSON-lines file there such as
    metrics.superseded.jsonl (a half-written last line is skipped)."""
    out = []
    path = os.path.join(run_dir, name)
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
    return out


def default_run_dir(config: Config, kind: str | None = None) -> str:
    """runs/<algo>_<env>_<kind, default the mode>_<time>, made unique with -1, -2, ..."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = os.path.join("runs", f"{config.algo}_{config.env}_{kind or config.mode}_{stamp}")
    path, i = base, 1
    while os.path.exists(path):
        path, i = f"{base}-{i}", i + 1
    return path


class RunLogger:
    """Owns one run directory: config.yaml, metrics.jsonl (every record) and summary.json,
    and hands records and the summary to the config's `loggers` (tianjax/metrics/loggers.py).

    `tensorboard=False` leaves the `loggers` out (metrics.jsonl only)."""

    def __init__(self, config: Config, run_dir: str | None = None, tensorboard: bool = True):
        from tianjax.metrics.loggers import Loggers

        self.run_dir = os.path.abspath(run_dir or config.run_dir or default_run_dir(config))
        os.makedirs(self.run_dir, exist_ok=True)
        with open(os.path.join(self.run_dir, "config.yaml"), "w") as f:
            yaml.safe_dump(
                config.to_dict(read_only=True), f, sort_keys=False
            )  # the sections it reads
        self._metrics = open(os.path.join(self.run_dir, "metrics.jsonl"), "a")
        self._loggers = Loggers(config, self.run_dir, config.loggers if tensorboard else ())

    def log(self, record: dict) -> None:
        rec = _plain(record)
        self._metrics.write(json.dumps(rec) + "\n")
        self._metrics.flush()
        self._loggers.record(rec)

    def write_summary(self, summary: dict) -> dict:
        summary = write_json_atomic(os.path.join(self.run_dir, "summary.json"), summary)
        self._loggers.summary(summary)
        return summary

    def supersede_after(self, updates: int) -> int:
        """A run resumed from the checkpoint at `updates` into this directory: the records
        written after that checkpoint (by the run that went on from it, then died or was
        stopped before its next save) describe training this run does again. They are
        moved, whole and in order, to metrics.superseded.jsonl, so metrics.jsonl holds each
        update once. Returns how many were moved."""
        self._metrics.flush()
        path = os.path.join(self.run_dir, "metrics.jsonl")
        with open(path) as f:
            lines = [line for line in f if line.strip()]
        keep, moved = [], []
        for line in lines:
            try:
                later = json.loads(line).get("updates", 0) > updates
            except (ValueError, AttributeError, TypeError):
                later = False  # a torn or foreign line stays where it is
            (moved if later else keep).append(line)
        if not moved:
            return 0
        with open(os.path.join(self.run_dir, "metrics.superseded.jsonl"), "a") as f:
            f.writelines(moved)
            f.flush()
            os.fsync(f.fileno())
        self._metrics.close()
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.writelines(keep)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        self._metrics = open(path, "a")
        return len(moved)

    def read_records(self) -> list[dict]:
        """The run's metrics records, from metrics.jsonl (a resumed run's include those of
        the runs before it). Not kept in memory while training: a run may last days."""
        self._metrics.flush()
        return read_metrics(self.run_dir)

    def close(self, failing: BaseException | None = None) -> None:
        """Closes metrics.jsonl and the loggers (they flush what is queued: TensorBoard,
        W&B), the loggers even when the file's last flush fails. `failing`: the error the
        run ends with (see Loggers.close)."""
        try:
            self._metrics.close()
        finally:
            self._loggers.close(failing)


def format_summary(summary: dict) -> str:
    """A one-screen summary of a finished run."""

    def fmt(v):
        if v is None:
            return "-"
        if isinstance(v, bool):
            return "yes" if v else "no"
        if isinstance(v, float):
            return f"{v:,.4g}" if abs(v) < 1e5 else f"{v:,.0f}"
        if isinstance(v, int):
            return f"{v:,}"
        return str(v)

    keys = [
        "mode",
        "algo",
        "env",
        "env_steps",
        "updates",
        "wall_time_s",
        "compile_time_s",
        "env_steps_per_s",
        "samples_fresh_per_s",
        "samples_consumed_per_s",
        "reuse_fraction",
        "learner_busy_fraction",
        "actor_wait_fraction",
        "pace_set_by",
        "replay_ratio",
        "episodes",
        "final_return",
        "target_return",
        "final_win_rate",
        "target_win_rate",
        "convergence_time_s",
        "convergence_env_steps",
        "eval_return",
        "eval_version",
        "eval_best_return",
        "eval_best_version",
        "eval_win_rate",
        "skipped_updates",
        "actor_restarts",
        "learner_restarts",
        "groups",  # learner groups: how many, lost, the averager's rounds and restarts
        "groups_lost",
        "rounds",
        "deltas_per_round_mean",
        "delta_staleness_mean",
        "averager_restarts",
        "rejected_messages",
        "interrupted",
        "run_dir",
    ]
    rows = [(k, fmt(summary[k])) for k in keys if k in summary]
    width = max(len(k) for k, _ in rows)
    line = "-" * (width + 32)
    out = [line, "tianjax run summary", line]
    out += [f"{k:<{width}}  {v}" for k, v in rows]
    verdict = summary.get("convergence_time_s")
    if summary.get("target_win_rate") is not None:
        out.append(line)
        out.append(
            f"target win rate {fmt(summary['target_win_rate'])} reached after {fmt(verdict)} s"
            if verdict is not None
            else f"target win rate {fmt(summary['target_win_rate'])} not reached"
        )
    elif summary.get("target_return") is not None:
        out.append(line)
        out.append(
            f"target {fmt(summary['target_return'])} reached after {fmt(verdict)} s"
            if verdict is not None
            else f"target {fmt(summary['target_return'])} not reached"
        )
    if summary.get("stopped_at_target"):
        out.append(f"stopped there (stop_at_target), at {fmt(summary['env_steps'])} env steps")
    out.append(line)
    return "\n".join(out)


__all__ = ["RunLogger", "default_run_dir", "format_summary", "read_metrics", "write_json_atomic"]
