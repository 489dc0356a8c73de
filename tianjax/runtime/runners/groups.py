"""The groups runner: `tianjax train CONFIG groups.count=G` on one machine. It starts the
averager and G learner groups, each a learner process with its own actors
(tianjax.runtime.groups), supervises them, and, however the run ends, stops them all with
no orphans.

- The run's `num_actors` and `total_env_steps` are split evenly over the groups
  (tianjax.runtime.groups.shares); group g writes to RUN_DIR/group-g (its config.yaml,
  metrics.jsonl, checkpoints, actors' logs and summary.json), the averager to
  RUN_DIR/averager (its checkpoints, a record per round, its summary).
- Each group's and the averager's listening sockets are bound and held here for the whole
  run (tianjax.launch.ports), so a restarted process serves the same endpoints, and the
  actors start while their learner starts.
- A group whose learner process dies is lost, said in one line, with its actors stopped
  and its share of the budget; the others go on, and the averager leaves it out of rounds.
  With `runtime.restart_learner` it is restarted instead (up to
  `runtime.max_learner_restarts` times), from its newest checkpoint or, without one, from
  the start; either way it rejoins by taking the newest average.
- The averager, if it dies, is restarted from its newest checkpoint (up to
  `runtime.max_learner_restarts` times; beyond that the groups train on alone); meanwhile
  the groups train alone.

The run's figures: env steps, updates and episodes are the groups' sums; the moving
average return and the convergence time are over every finished group's episodes in the
order they ended (each group's clock starts with the run's), as over every actor of one
learner; the env steps at convergence are every group's at that time. The run's
parameters are the averager's final average.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

from tianjax.checkpoint import store as ckpt
from tianjax.config import Config
from tianjax.errors import LearnerFailure
from tianjax.launch.ports import HeldPorts, PrivateDir
from tianjax.launch.supervisor import ActorSupervisor
from tianjax.metrics import EpisodeTracker, Progress, RunLogger
from tianjax.metrics.logger import read_metrics, write_json_atomic
from tianjax.runtime.groups import shares
from tianjax.runtime.groups.averager import final_average
from tianjax.runtime.process import shutdown
from tianjax.runtime.record.outcome import RunOutcome
from tianjax.runtime.runners.local import (
    RESULT_FILE,
    RoleProcess,
    StandbyLearner,
    supervise_actors,
)
from tianjax.transport.auth import new_run_key

AVERAGER_CHANNELS = ("deltas", "averages")
AVERAGER_END_S = 10.0  # after the last group, how long the averager may take to end alone


def _exit_why(code: int, failure: str | None) -> str:
    why = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
    return why + (f" ({failure})" if failure else "")


class _Group:
    """One learner group on this machine: its held ports, its learner process, its actors."""

    def __init__(self, config: Config, index: int, run_key, averager: dict, ipc_dir, t0: float):
        self.index = index
        self.config = group_cfg = shares.group_config(config, index)
        if group_cfg.resume and not ckpt.has_checkpoint(group_cfg.resume):
            self.config = group_cfg = dataclasses.replace(group_cfg, resume=None)
        self.run_dir = group_cfg.run_dir
        self.ipc_dir = None
        if ipc_dir is not None:  # each group's sockets in a directory of its own
            self.ipc_dir = os.path.join(ipc_dir, f"group-{index}")
            os.makedirs(self.ipc_dir, mode=0o700)
        rt = group_cfg.runtime
        self.ports = HeldPorts(rt.bind_host, rt.transport, self.ipc_dir)
        self.extra = (
            "--group",
            str(index),
            "--averager-json",
            json.dumps(averager),
            "--started-at",
            repr(t0),
        )
        self.run_key = run_key
        self.learner = RoleProcess(
            group_cfg, self.run_dir, run_key, self.ports, self.ipc_dir, extra=self.extra
        )
        self.standby = StandbyLearner(self._spare if group_cfg.runtime.standby_learner else None)
        ids = shares.group_actor_ids(index, config.groups.count, group_cfg.num_actors)
        self.log_dir = os.path.join(self.run_dir, "actors")
        self.actors = ActorSupervisor(
            group_cfg, self.ports.endpoints, run_key, log_dir=self.log_dir, ids=ids
        )
        self.actors.start_all()
        self.restarts = 0
        self.ended: str | None = None  # "finished" or "lost"
        self.why = ""

    def _spare(self) -> RoleProcess:
        """runtime.standby_learner: a warm learner for this group, waiting for its turn."""
        return RoleProcess(
            self.config,
            self.run_dir,
            self.run_key,
            self.ports,
            self.ipc_dir,
            extra=self.extra,
            standby=True,
        )

    def restart(self) -> bool:
        """A new learner for the group, from its newest checkpoint: its warm standby where
        one waits (True), else a cold one."""
        resume = self.run_dir if ckpt.has_checkpoint(self.run_dir) else None
        self.restarts += 1
        self.learner, warm = self.standby.next_learner(resume, self._cold)
        return warm

    def _cold(self, resume: str | None) -> RoleProcess:
        cfg = dataclasses.replace(self.config, resume=resume)
        return RoleProcess(
            cfg, self.run_dir, self.run_key, self.ports, self.ipc_dir, extra=self.extra
        )

    def stop(self) -> None:
        self.standby.close()
        self.learner.stop()
        self.actors.stop(grace_s=5.0)
        self.ports.close()


class _AveragerProcess:
    def __init__(self, config: Config, run_key, ipc_dir, resume_dir: str | None):
        self.config, self.run_key = config, run_key
        self.run_dir = shares.averager_dir(config.run_dir)
        self.ipc_dir = None
        if ipc_dir is not None:
            self.ipc_dir = os.path.join(ipc_dir, "averager")
            os.makedirs(self.ipc_dir, mode=0o700)
        rt = config.runtime
        self.ports = HeldPorts(rt.bind_host, rt.transport, self.ipc_dir, AVERAGER_CHANNELS)
        self.endpoints = self.ports.endpoints
        self.extra = ("--resume-dir", resume_dir) if resume_dir else ()
        self.restarts = 0
        self.proc = self._start()
        self.gave_up: str | None = None

    def _start(self) -> RoleProcess:
        return RoleProcess(
            self.config,
            self.run_dir,
            self.run_key,
            self.ports,
            self.ipc_dir,
            role="averager",
            extra=self.extra,
        )

    def check(self) -> None:
        """Restarts a dead averager from its newest checkpoint, while restarts are left."""
        self.proc.events(0)
        code = self.proc.poll()
        if code is None or code == 0 or self.gave_up:
            return
        self.proc.rest()
        why = _exit_why(code, self.proc.failure)
        if self.restarts >= self.config.runtime.max_learner_restarts:
            self.gave_up = why
            print(
                f"tianjax: warning: the averager {why} and is out of restarts "
                f"(runtime.max_learner_restarts={self.config.runtime.max_learner_restarts}): "
                "the groups train on alone",
                file=sys.stderr,
                flush=True,
            )
            return
        self.restarts += 1
        print(
            f"tianjax: warning: the averager {why}; restarting it from its newest checkpoint "
            f"({self.restarts}/{self.config.runtime.max_learner_restarts}); the groups train "
            "alone meanwhile",
            file=sys.stderr,
            flush=True,
        )
        self.proc = self._start()

    def stop(self) -> None:
        deadline = time.monotonic() + AVERAGER_END_S
        while self.proc.poll() is None and time.monotonic() < deadline:
            self.proc.events(0.1)
        self.proc.stop()
        self.ports.close()


def run_groups(config: Config, logger: RunLogger, progress: Progress) -> RunOutcome:
    t0 = time.time()
    progress.close()  # each group prints its own lines
    shares.check_split(config)
    # each learner process hands its parameters and figures over through its final
    # checkpoint and result file
    config = dataclasses.replace(
        config,
        run_dir=logger.run_dir,
        checkpoint=dataclasses.replace(config.checkpoint, final=True),
    )
    wall_offset = 0.0
    if config.resume and ckpt.has_checkpoint(shares.group_dir(config.resume, 0)):
        wall_offset = ckpt.read_meta(shares.group_dir(config.resume, 0))["wall_time_s"]
    run_key = new_run_key()
    count = config.groups.count
    private = PrivateDir() if config.runtime.transport == "ipc" else None
    averager: _AveragerProcess | None = None
    groups: list[_Group] = []
    interrupted = False
    try:
        resume_dir = None
        if config.resume and ckpt.has_checkpoint(shares.averager_dir(config.resume)):
            resume_dir = shares.averager_dir(config.resume)
        averager = _AveragerProcess(config, run_key, private and private.path, resume_dir)
        for g in range(count):
            stale = os.path.join(shares.group_dir(config.run_dir, g), RESULT_FILE)
            if os.path.exists(stale):  # a resumed run's, from before
                os.remove(stale)
            groups.append(
                _Group(config, g, run_key, averager.endpoints, private and private.path, t0)
            )
        # a SIGTERM only sets the stop flag in here, taken at the next pass (see run_local's
        # learner-process loop)
        with shutdown.critical():
            while any(grp.ended is None for grp in groups):
                shutdown.check()
                time.sleep(0.1)
                averager.check()
                for grp in groups:
                    if grp.ended is None:
                        _supervise(config, grp)
    except KeyboardInterrupt:
        interrupted = True  # each learner process, stopped below, checkpoints and reports
    finally:
        for grp in groups:
            grp.stop()
        if averager is not None:
            averager.stop()
        if private is not None:
            private.close()
    return _outcome(config, groups, averager, interrupted, wall_offset)


def _supervise(config: Config, grp: _Group) -> None:
    """One pass over a group: its learner's events and exit, and its actors."""
    events = grp.learner.events(0)
    code = grp.learner.poll()
    if code is not None:
        events += grp.learner.rest()
        if code == 0:
            grp.ended = "finished"
            return
        why = _exit_why(code, grp.learner.failure)
        rt = grp.config.runtime
        if code not in (130, 143) and rt.restart_learner and grp.restarts < rt.max_learner_restarts:
            warm = grp.restart()
            print(
                f"tianjax: warning: group {grp.index}'s learner {why}; restarting it "
                f"({grp.restarts}/{rt.max_learner_restarts})"
                + (" (its warm standby took over)" if warm else "")
                + ": it rejoins with the newest average",
                file=sys.stderr,
                flush=True,
            )
            return
        grp.ended, grp.why = "lost", why
        print(
            f"tianjax: warning: group {grp.index}'s learner {why}: the group is lost, with its "
            f"actors and what is left of its share of the budget; the other groups go on",
            file=sys.stderr,
            flush=True,
        )
        grp.actors.stop(grace_s=0.0, unreachable=list(grp.actors.procs))
        return
    silent = [i for ev in events if ev["tianjax_event"] == "silent" for i in ev["actors"]]
    supervise_actors(grp.config, grp.actors, silent, grp.log_dir)


def _group_figures(grp: _Group) -> RunOutcome | None:
    path = os.path.join(grp.run_dir, RESULT_FILE)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return RunOutcome.from_json(json.load(f))


def _last_record(run_dir: str) -> dict:
    try:
        records = read_metrics(run_dir)
    except OSError:
        return {}
    return records[-1] if records else {}


def _env_steps_at(run_dir: str, t: float, final: int) -> int:
    """A group's env steps at run time `t`: interpolated between its records around it
    (`final` if it ended before)."""
    points = [(r.get("wall_time_s", 0.0), r["env_steps"]) for r in read_metrics(run_dir)]
    if not points or points[-1][0] <= t:
        return final
    before = [p for p in points if p[0] <= t]
    (t0, s0) = before[-1] if before else (0.0, 0)
    t1, s1 = next(p for p in points if p[0] > t)
    return int(s0 + (s1 - s0) * (t - t0) / max(t1 - t0, 1e-9))


def _outcome(
    config: Config,
    groups: list[_Group],
    averager: _AveragerProcess | None,
    interrupted: bool,
    wall_offset: float,
) -> RunOutcome:
    outs = {grp.index: _group_figures(grp) for grp in groups}
    done = {g: out for g, out in outs.items() if out is not None}
    if not done:
        lost = "; ".join(f"group {grp.index}'s learner {grp.why}" for grp in groups if grp.why)
        if interrupted:
            raise KeyboardInterrupt("stopped before any group could report")
        raise LearnerFailure(f"every learner group was lost ({lost})")
    by_group = {}
    for grp in groups:
        out = done.get(grp.index)
        last = _last_record(grp.run_dir) if out is None else {}
        figures = {
            "status": grp.ended or "stopped",
            "env_steps": out.env_steps if out else last.get("env_steps", 0),
            "updates": out.updates if out else last.get("updates", 0),
            "final_return": out.final_return if out else last.get("return_mean_100"),
            "convergence_time_s": out.convergence_time_s if out else None,
            "learner_restarts": grp.restarts,
            "learner_restarts_from_standby": grp.standby.promoted,
        }
        if grp.why:
            figures["lost_why"] = grp.why
        by_group[str(grp.index)] = figures
        if out is not None:
            _write_group_summary(config, grp, out)
    tracker = EpisodeTracker(config.target_return)
    log = sorted(ep for out in done.values() for ep in out.extra_summary.get("episode_log", []))
    for t, r in log:
        tracker.add([r], 0, t)
    conv_time = tracker.convergence_time_s
    conv_steps = None
    if conv_time is not None:  # every group's env steps when the run converged
        conv_steps = sum(
            _env_steps_at(grp.run_dir, conv_time, by_group[str(grp.index)]["env_steps"])
            for grp in groups
        )
    train_time = max(out.train_time_s for out in done.values())
    env_steps = sum(f["env_steps"] for f in by_group.values())
    params, rounds = None, None
    if averager is not None and ckpt.has_checkpoint(averager.run_dir):
        params, rounds = final_average(averager.run_dir)
    averager_summary = {}
    if averager is not None and os.path.exists(os.path.join(averager.run_dir, "summary.json")):
        with open(os.path.join(averager.run_dir, "summary.json")) as f:
            averager_summary = json.load(f)
    lost = {str(grp.index): grp.why for grp in groups if grp.ended == "lost"}
    extra = {
        "groups": len(groups),
        "groups_finished": sum(grp.ended == "finished" for grp in groups),
        "groups_lost": len(lost),
        "groups_lost_why": lost,
        "group_restarts": sum(grp.restarts for grp in groups),
        "averager_restarts": averager.restarts if averager else 0,
        "rounds": rounds,
        "deltas_merged": averager_summary.get("deltas_merged"),
        "deltas_per_round_mean": averager_summary.get("deltas_per_round_mean"),
        "delta_staleness_mean": averager_summary.get("delta_staleness_mean"),
        "averager": averager_summary,
        "by_group": by_group,
        "num_actors": config.num_actors,
        "actor_restarts": sum(grp.actors.total_restarts for grp in groups),
        "actors_lost": sum(len(grp.actors.lost) for grp in groups),
    }
    return RunOutcome(
        params=params,
        algo=None,
        env=None,
        env_steps=env_steps,
        updates=sum(f["updates"] for f in by_group.values()),
        skipped_updates=sum(out.skipped_updates for out in done.values()),
        train_time_s=train_time,
        compile_time_s=max(out.compile_time_s for out in done.values()),
        env_steps_per_s=env_steps / max(train_time, 1e-9),
        episodes=sum(out.episodes for out in done.values()),
        final_return=tracker.moving_average if log else None,
        convergence_time_s=conv_time,
        convergence_env_steps=conv_steps,
        extra_summary=extra,
        interrupted=interrupted or any(out.interrupted for out in done.values()),
        wall_offset_s=wall_offset,
    )


def group_summary(
    config: Config, group_config: Config, index: int, out: RunOutcome, **extra
) -> dict:
    """A group's summary.json: its share, its figures, its learner's summary and `extra`."""
    return {
        "group": index,
        "groups": config.groups.count,
        "mode": config.mode,
        "algo": config.algo,
        "env": config.env,
        "num_actors": group_config.num_actors,
        "total_env_steps": group_config.total_env_steps,
        **{k: v for k, v in out.to_json().items() if k != "extra_summary"},
        **extra,
        **{k: v for k, v in out.extra_summary.items() if k != "episode_log"},
    }


def _write_group_summary(config: Config, grp: _Group, out: RunOutcome) -> None:
    summary = group_summary(
        config,
        grp.config,
        grp.index,
        out,
        learner_restarts=grp.restarts,
        learner_restarts_from_standby=grp.standby.promoted,
        actor_restarts=grp.actors.total_restarts,
        actors_lost=len(grp.actors.lost),
    )
    write_json_atomic(os.path.join(grp.run_dir, "summary.json"), summary)


__all__ = ["group_summary", "run_groups"]
