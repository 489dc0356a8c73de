"""The replay log of an async (or sync) run: where every trajectory the learner received came
from, and, in order, every event that changed the learner's state, so that
`tianjax replay RUN_DIR` (tianjax.runtime.runners.rerun) can act the trajectories again
in one process and apply the same updates to the same batches, bit for bit.

One JSON object a line in RUN_DIR/replay.jsonl, written by the learner's loop and flushed
at each line (a learner killed with -9 loses at most the line it was writing):

    start   a learner incarnation began: its version, the checkpoint step it resumed from
            (null: a fresh run), the seed its state and replay sampling come from, how many
            learner processes the run has, and whether it is a learner group's
    traj    a trajectory arrived (every one the receiver accepted, learned from or not: an
            actor's env state runs on across its rollouts, so its next one can be acted
            again only after this one): `i` its index in the log, the actor id, the actor
            process's incarnation, the rollout's index in that incarnation, the actor's env
            seed, the versions that acted along T as [version, steps] runs, the global
            env-step count its schedules followed (`act_steps`), and what became of it:
            `to` pool | replay (DQN's buffer, with the `scale` of the replay ratio it was paced
            at) | a drop reason (nonfinite, bad_versions:..., budget, stale)
    expire  a pooled trajectory dropped before it was learned from, and why (stale, older)
    update  an update dispatched: on-policy, the trajectories joined into its batch, in order,
            or `reuse` (another pass over the last batch); off-policy, one sample of the buffer
    ckpt    a checkpoint was written at this version
    end     the learner ended: its version and the SHA-256 of its parameters' leaves

A trajectory is named by its `i`; updates name the trajectories they learn from by it.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Iterator

import jax
import numpy as np

REPLAY_LOG = "replay.jsonl"


def params_sha256(params) -> str:
    """SHA-256 of a parameter tree: each leaf's path, dtype, shape and bytes, in tree order
    (two trees hash equal only when they are equal bit for bit)."""
    h = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_flatten_with_path(jax.device_get(params))[0]:
        a = np.ascontiguousarray(np.asarray(leaf))
        h.update(f"{jax.tree_util.keystr(path)}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def version_runs(version_t: np.ndarray) -> list[list[int]]:
    """The versions that acted along T ([T] ints, non-decreasing) as [version, steps] runs."""
    runs: list[list[int]] = []
    for v in np.asarray(version_t).tolist():
        if runs and runs[-1][0] == v:
            runs[-1][1] += 1
        else:
            runs.append([int(v), 1])
    return runs


class ReplayLog:
    """Appends the run's events to RUN_DIR/replay.jsonl (see the module doc)."""

    def __init__(self, run_dir: str):
        self.path = os.path.join(run_dir, REPLAY_LOG)
        # NOTE: appended to: a restarted learner's events follow its predecessor's
        self._f = open(self.path, "a", encoding="utf-8")
        self.trajectories = self._count_trajectories()

    def _count_trajectories(self) -> int:
        """Trajectories already logged (a restarted learner numbers on from them)."""
        n = 0
        with open(self.path, encoding="utf-8") as f:
            for line in f:
                n += line.startswith('{"e":"traj"')
        return n

    def write(self, event: dict) -> None:
        self._f.write(json.dumps(event, separators=(",", ":")) + "\n")
        self._f.flush()

    def start(
        self, version: int, resumed_from: int | None, seed: int, processes: int, group: bool
    ) -> None:
        self.write(
            dict(
                e="start",
                version=int(version),
                resumed_from=resumed_from,
                seed=int(seed),
                processes=int(processes),
                group=bool(group),
            )
        )

    def trajectory(self, msg, actor, version_t, act_steps: int, to: str, **extra) -> int:
        """Logs a trajectory the receiver accepted (`msg`: its decoded Message; `version_t`
        [T]: the versions that acted; `extra`: more fields, such as the replay `scale` it
        was paced at); returns its index."""
        i = self.trajectories
        self.trajectories += 1
        body = msg.body or {}
        self.write(
            {
                "e": "traj",
                "i": i,
                "actor": actor,
                "inc": msg.inc,
                "rollout": body.get("rollout"),
                "seed": body.get("seed"),
                "seq": int(msg.seq),
                "v": version_runs(version_t),
                "act_steps": int(act_steps),
                "to": to,
                **extra,
            }
        )
        return i

    def close(self) -> None:
        self._f.close()


def read_events(run_dir: str) -> Iterator[dict]:
    """The events of RUN_DIR's replay log, in order; a half-written last line (a learner
    killed while writing it) is left out."""
    with open(os.path.join(run_dir, REPLAY_LOG), encoding="utf-8") as f:
        for line in f:
            try:
                event: Any = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(event, dict):
                yield event


__all__ = ["REPLAY_LOG", "ReplayLog", "params_sha256", "read_events", "version_runs"]
