"""Evaluation records: what one evaluation of one parameter version leaves in the run's
record, and the run's book of them (the final one and the best one, each with its version).

An evaluation record is a line of metrics.jsonl of its own, beside the training records:

    env_steps, updates     the version it evaluated and the env steps the learner had
                           admitted when that version was published
    wall_time_s            when that version was taken for evaluation (the run's clock)
    eval_return            the mean undiscounted return of its episodes, with
    eval_return_std, eval_return_min, eval_return_max, eval_length_mean, eval_episodes,
    eval_win_rate          (envs that report wins), eval_s (how long it took), and
    eval_video             (eval.video) the mp4 of one episode, relative to the run directory

Its keys all start with `eval_` (the training records have none), so a reader tells the
two apart by `eval_return`. The evaluator process sends the same fields to the learner as a
control message; `from_message` checks them, and one that does not check is dropped.
"""

from __future__ import annotations

import math

import numpy as np

EVAL_KEY = "eval_return"  # what marks a record as an evaluation's
_NUMBERS = (
    "eval_return",
    "eval_return_std",
    "eval_return_min",
    "eval_return_max",
    "eval_length_mean",
    "eval_win_rate",
    "eval_s",
    "age_s",
)


def eval_fields(returns, lengths=None, won=None, eval_s: float | None = None) -> dict:
    """The eval_* fields of one evaluation's episodes (returns [n], lengths [n], won [n])."""
    r = np.asarray(returns, np.float64).reshape(-1)
    out = {
        "eval_return": float(r.mean()),
        "eval_return_std": float(r.std()),
        "eval_return_min": float(r.min()),
        "eval_return_max": float(r.max()),
        "eval_episodes": int(r.size),
    }
    if lengths is not None:
        out["eval_length_mean"] = float(np.mean(lengths))
    if won is not None:
        out["eval_win_rate"] = float(np.mean(won))
    if eval_s is not None:
        out["eval_s"] = float(eval_s)
    return out


def eval_record(version: int, env_steps: int, wall_time_s: float, fields: dict) -> dict:
    """One evaluation's record: the version and env steps it evaluated, then its fields."""
    return {
        "env_steps": int(env_steps),
        "updates": int(version),
        "wall_time_s": float(wall_time_s),
        **fields,
    }


def is_evaluation(record: dict) -> bool:
    return EVAL_KEY in record


def from_message(msg: dict) -> dict | None:
    """An evaluator's message ({"type": "evaluation", "version", "env_steps", "age_s",
    the eval_* fields}) as a dict of version, env_steps, age_s (seconds since it took that
    version) and fields, or None when any field is missing, of the wrong type or not finite."""
    version, env_steps = msg.get("version"), msg.get("env_steps")
    for v in (version, env_steps, msg.get("eval_episodes")):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            return None
    fields = {"eval_episodes": msg["eval_episodes"]}
    for key in _NUMBERS:
        if key not in msg:
            if key in ("eval_return", "age_s"):
                return None
            continue
        v = msg[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            return None
        fields[key] = float(v)
    video = msg.get("eval_video")
    if video is not None:
        if not isinstance(video, str) or video.startswith("/") or ".." in video.split("/"):
            return None  # a path inside the run directory, and nothing else
        fields["eval_video"] = video
    age = fields.pop("age_s")
    return {"version": version, "env_steps": env_steps, "age_s": max(age, 0.0), "fields": fields}


class EvalBook:
    """The run's evaluations: the final (latest version) and the best (highest mean return;
    the earlier of equals), each with its version and env steps."""

    def __init__(self):
        self.final: dict | None = None
        self.best: dict | None = None
        self.count = 0

    def add(self, record: dict) -> bool:
        """Takes in one evaluation record; returns whether it is the best so far."""
        self.count += 1
        if self.final is None or record["updates"] >= self.final["updates"]:
            self.final = record
        if self.best is None or record[EVAL_KEY] > self.best[EVAL_KEY]:
            self.best = record
            return True
        return False

    def summary(self) -> dict:
        """summary.json's evaluation keys (None where the run made no evaluation)."""
        f, b = self.final or {}, self.best or {}
        out = {
            "eval_return": f.get(EVAL_KEY),
            "eval_version": f.get("updates"),
            "eval_best_return": b.get(EVAL_KEY),
            "eval_best_version": b.get("updates"),
            "evaluations": self.count,
        }
        if "eval_win_rate" in f:
            out["eval_win_rate"] = f["eval_win_rate"]
        return out

    def state_dict(self) -> dict:
        return {"final": self.final, "best": self.best, "count": self.count}

    def load_state_dict(self, state: dict | None) -> None:
        state = state or {}
        self.final, self.best = state.get("final"), state.get("best")
        self.count = int(state.get("count", 0))


__all__ = ["EVAL_KEY", "EvalBook", "eval_fields", "eval_record", "from_message", "is_evaluation"]
