"""The local launcher: a learner and `num_actors` actor processes on this machine, wired
over loopback, supervised, and, however the run ends (finished, Ctrl-C, SIGTERM, a crash),
all stopped with no orphans.

Two shapes:

- default: this process is the learner. Dead or silent actors are replaced (see
  tianjax.launch.supervisor); a crash of the learner is a crash of the run, whose last
  checkpoint stays whole (orbax renames a step into place only when it is complete).
- `runtime.restart_learner: true`: this process only supervises. The learner is a child
  process too (`python -m tianjax.launch.role learner`); when it dies, killed or of an
  exception (a learner tells its actors to stop only at the run's end), it is started
  again, up to `runtime.max_learner_restarts` times, from its newest checkpoint and on the
  same endpoints, and the running actors follow it (they take its versions and register
  with its new incarnation).
  This process binds the learner's listening sockets and holds them for the whole run
  (tianjax.launch.ports), so no other process can take the ports while the learner is down.
  With `runtime.standby_learner: true` a second learner process waits beside it, imported
  and compiled (tianjax.launch.role, `--standby`), and takes a dead learner's place at once,
  resuming from the same checkpoint a cold one would; another standby starts behind it.

With `runtime.transport: ipc` the sockets live in a private directory (mode 0700) made
here and removed at exit.
"""

from __future__ import annotations

import dataclasses
import json
import os
import select
import signal
import subprocess
import sys
import time
from typing import Callable

from tianjax.checkpoint import store as ckpt
from tianjax.config import Config
from tianjax.errors import ActorFailure, LearnerFailure
from tianjax.launch.placement import apply, learner_environment
from tianjax.launch.ports import HeldPorts, PrivateDir
from tianjax.launch.supervisor import ActorSupervisor, describe, python_path
from tianjax.metrics import Progress, RunLogger
from tianjax.runtime.learner.learner import Learner
from tianjax.runtime.modes import mode_of
from tianjax.runtime.process import shutdown
from tianjax.runtime.record.outcome import RunOutcome
from tianjax.transport.auth import KEY_ENV, new_run_key

RESULT_FILE = "learner_result.json"  # what a learner process reports (params: its checkpoint)


def supervise_actors(
    config: Config, actors: ActorSupervisor, silent, log_dir: str, learner: Learner | None = None
) -> None:
    """One supervision pass: replace dead and silent actors; raise if the run cannot go on.
    An in-process `learner` forgets the lost and the restarted ones (their credits no
    longer count)."""
    changes = actors.check(silent)
    if changes.failed:  # deterministic: restarting would fail the same way
        i, why = sorted(changes.failed.items())[0]
        raise ActorFailure(f"actor {i} cannot start: {why}")
    if learner is not None:
        # (a restarted actor's replacement also takes its place when it registers)
        for i in [*changes.lost, *changes.restarted]:
            learner.forget_actor(i)
    for line in describe(changes, len(actors.procs), log_dir):
        print(line, file=sys.stderr, flush=True)
    if changes.lost and (mode_of(config).needs_every_actor or not actors.procs):
        ids = ", ".join(f"actor {i} ({why})" for i, why in sorted(changes.lost.items()))
        raise ActorFailure(
            f"{ids} stopped and is out of restarts "
            f"(runtime.max_actor_restarts={config.runtime.max_actor_restarts}); see {log_dir}"
        )


def _evaluator(config: Config, endpoints, run_key, log_dir, run_dir) -> ActorSupervisor | None:
    """The supervisor of the run's evaluator process (eval.every_updates or eval.every_s)."""
    if not config.eval.periodic:
        return None
    return ActorSupervisor(
        config, endpoints, run_key, log_dir=log_dir, role="evaluator", run_dir=run_dir
    )


def _supervise_evaluator(evaluator: ActorSupervisor | None, log_dir: str) -> None:
    """Restarts a dead evaluator; one that is out of restarts or cannot start is said in one
    line, and the run goes on without it."""
    if evaluator is None:
        return
    for line in describe(evaluator.check(), 0, log_dir, role="evaluator"):
        print(line, file=sys.stderr, flush=True)


def run_local(config: Config, logger: RunLogger, progress: Progress) -> RunOutcome:
    if config.runtime.restart_learner:
        return _run_with_learner_process(config, logger, progress)
    t_start = time.perf_counter()
    run_key = new_run_key()
    ipc_dir = PrivateDir() if config.runtime.transport == "ipc" else None
    try:
        learner = Learner(config, run_key, logger, progress, ipc_dir=ipc_dir and ipc_dir.path)
    except BaseException:
        if ipc_dir is not None:
            ipc_dir.close()
        raise
    log_dir = os.path.join(logger.run_dir, "actors")
    actors = ActorSupervisor(config, learner.endpoints, run_key, log_dir=log_dir)
    evaluator = _evaluator(config, learner.endpoints, run_key, log_dir, logger.run_dir)
    # the evaluator ends with training: the learner then evaluates its final parameters
    learner.on_trained = lambda: evaluator and evaluator.stop(grace_s=0.0)

    def should_stop() -> bool:
        silent = learner.silent_actors(time.perf_counter())
        for i in silent:
            learner.forget_actor(i)  # its replacement registers afresh
        supervise_actors(config, actors, silent, log_dir, learner)
        _supervise_evaluator(evaluator, log_dir)
        return False

    try:
        actors.start_all()
        if evaluator is not None:
            evaluator.start_all()
        out = learner.run(should_stop, t_start=t_start)
    finally:
        learner.stop_actors()
        if evaluator is not None:
            evaluator.stop(grace_s=0.0)
        registered = {info.actor for info in learner.actors.values()}
        actors.stop(unreachable=[i for i in actors.procs if i not in registered])
        learner.close()
        if ipc_dir is not None:
            ipc_dir.close()
    return out._replace(
        extra_summary={
            **out.extra_summary,
            "actor_restarts": actors.total_restarts,
            "actor_restarts_from_standby": actors.promoted,
            "actors_lost": len(actors.lost),
            **_evaluator_counts(evaluator),
        }
    )


def _evaluator_counts(evaluator: ActorSupervisor | None) -> dict:
    """summary.json's count of the evaluator's restarts, and whether it was lost."""
    if evaluator is None:
        return {}
    return {"evaluator_restarts": evaluator.total_restarts, "evaluator_lost": bool(evaluator.lost)}


# ----------------------------------------------------------------------------- learner process
class RoleProcess:
    """A learner (or another role: the averager of learner groups) as a child process; its
    stdout carries one JSON event per line (tianjax.launch.role: "endpoints", "silent"
    actors, and "failed" with the exception it exits with). `extra`: more of the role's
    arguments."""

    def __init__(
        self,
        config: Config,
        run_dir: str,
        run_key: bytes,
        ports: HeldPorts,
        ipc_dir: str | None,
        role: str = "learner",
        extra: tuple[str, ...] = (),
        standby: bool = False,
    ):
        # its devices and memory share where runtime.learner_devices lists them
        env = apply(dict(os.environ), learner_environment(config))
        env[KEY_ENV] = run_key.hex()
        env.setdefault("PYTHONUNBUFFERED", "1")
        env["PYTHONPATH"] = python_path(env.get("PYTHONPATH", ""))
        cmd = [
            sys.executable,
            "-m",
            "tianjax.launch.role",
            role,
            "--config-json",
            json.dumps(config.to_dict()),
            "--run-dir",
            run_dir,
            "--parent-pid",
            str(os.getpid()),
            "--endpoints-json",
            json.dumps(ports.endpoints),
            "--listen-fds-json",
            json.dumps(ports.fds),
        ]
        if ipc_dir:
            cmd += ["--ipc-dir", ipc_dir]
        cmd += list(extra)
        if standby:
            cmd.append("--standby")
        # the held listening sockets are inherited (the child serves them, we keep them; a
        # standby touches them only once it is told to go)
        self.proc = subprocess.Popen(
            cmd,
            env=env,
            stdout=subprocess.PIPE,
            stdin=subprocess.PIPE if standby else subprocess.DEVNULL,
            pass_fds=tuple(ports.fds.values()),
        )
        self._buf = b""
        self.failure: str | None = None  # the exception it reported before exiting, in one line

    def events(self, timeout_s: float) -> list[dict]:
        """Events printed since the last call (waits up to timeout_s for the first)."""
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        return self._parse(os.read(self.proc.stdout.fileno(), 1 << 16)) if ready else []

    def rest(self) -> list[dict]:
        """The events of an exited learner not read yet: its stdout to the end (a last line
        without a newline too), never waiting."""
        out = []
        while select.select([self.proc.stdout], [], [], 0)[0]:
            chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
            if not chunk:
                break
            out += self._parse(chunk)
        return out + (self._parse(b"\n") if self._buf else [])

    def _parse(self, chunk: bytes) -> list[dict]:
        out = []
        if chunk:
            self._buf += chunk
            *lines, self._buf = self._buf.split(b"\n")
            for line in lines:
                try:
                    event = json.loads(line)
                except ValueError:
                    event = None
                if isinstance(event, dict) and "tianjax_event" in event:
                    if event["tianjax_event"] == "failed":
                        self.failure = str(event.get("error"))
                    out.append(event)
                else:  # anything else the learner printed goes on to our stdout
                    print(line.decode(errors="replace"), flush=True)
        return out

    def poll(self) -> int | None:
        return self.proc.poll()

    def go(self, resume: str | None) -> bool:
        """A standby's turn: it resumes from `resume` (a run directory; None: the start).
        False if it is gone (it died while it waited)."""
        if self.proc.poll() is not None:
            return False
        try:
            self.proc.stdin.write((json.dumps({"resume": resume}) + "\n").encode())
            self.proc.stdin.close()
            return True
        except OSError:  # it died meanwhile (a broken pipe)
            return False

    def dismiss(self) -> None:
        """Ends a standby that was not needed: its stdin closed (it exits 0), else killed
        after a moment (it holds nothing of the run's)."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()

    def stop(self, grace_s: float = 20.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # it writes a final checkpoint
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()


class StandbyLearner:
    """runtime.standby_learner: the warm learner process waiting beside the working one
    (`start()` makes one: a RoleProcess with standby=True), and the restarts it made."""

    def __init__(self, start: Callable[[], RoleProcess] | None):
        """`start`: None where there is no standby (runtime.standby_learner off)."""
        self._start = start
        self.waiting = start() if start is not None else None
        self.promoted = 0

    def next_learner(
        self, resume: str | None, cold: Callable[[str | None], RoleProcess]
    ) -> tuple[RoleProcess, bool]:
        """A dead learner's replacement, resuming from `resume`: the standby told to go
        (True), with a new one behind it; else `cold(resume)` (False), and, if the standby
        had died while it waited, a warning and a new standby."""
        spare = self.waiting
        if spare is not None and spare.go(resume):
            self.waiting = self._start()
            self.promoted += 1
            return spare, True
        if spare is not None:
            print(
                f"tianjax: warning: the learner's warm standby had exited with code "
                f"{spare.poll()}; a cold learner starts instead, and a new standby",
                file=sys.stderr,
                flush=True,
            )
            spare.dismiss()
            self.waiting = self._start()
        return cold(resume), False

    def close(self) -> None:
        if self.waiting is not None:
            self.waiting.dismiss()
            self.waiting = None


def _run_with_learner_process(config: Config, logger: RunLogger, progress: Progress) -> RunOutcome:
    run_dir = logger.run_dir
    progress.close()  # the learner process shows its own
    # the learner process hands its parameters over through its final checkpoint
    config = dataclasses.replace(
        config, checkpoint=dataclasses.replace(config.checkpoint, final=True)
    )
    wall_offset = ckpt.read_meta(config.resume)["wall_time_s"] if config.resume else 0.0
    # trajectories the learners of earlier sessions received (none of this launch's actors')
    received_at_launch = (
        int(ckpt.read_meta(config.resume).get("received_total", 0)) if config.resume else 0
    )
    log_dir = os.path.join(run_dir, "actors")
    run_key = new_run_key()
    result_path = os.path.join(run_dir, RESULT_FILE)
    if os.path.exists(result_path):
        os.remove(result_path)
    private = PrivateDir() if config.runtime.transport == "ipc" else None
    ipc_dir = private and private.path
    ports: HeldPorts | None = None
    learner: RoleProcess | None = None
    actors: ActorSupervisor | None = None
    evaluator: ActorSupervisor | None = None
    standby: StandbyLearner | None = None
    learner_restarts = 0
    interrupted = False

    def cold(resume: str | None) -> RoleProcess:
        return RoleProcess(
            dataclasses.replace(config, resume=resume), run_dir, run_key, ports, ipc_dir
        )

    try:
        ports = HeldPorts(config.runtime.bind_host, config.runtime.transport, ipc_dir)
        endpoints = ports.endpoints
        learner = RoleProcess(config, run_dir, run_key, ports, ipc_dir)
        # a warm learner that builds and compiles while this one runs: a killed learner's
        # replacement then pays none of it
        standby = StandbyLearner(
            (lambda: RoleProcess(config, run_dir, run_key, ports, ipc_dir, standby=True))
            if config.runtime.standby_learner
            else None
        )
        # the endpoints are known before the learner is up: the actors start meanwhile
        actors = ActorSupervisor(config, endpoints, run_key, log_dir=log_dir)
        actors.start_all()
        evaluator = _evaluator(config, endpoints, run_key, log_dir, run_dir)
        if evaluator is not None:
            evaluator.start_all()
        # a SIGTERM only sets the stop flag in here, taken at the loop's next pass (within
        # 0.1 s): raised between any two bytecodes it could land inside a Popen or a
        # subprocess's wait lock and leave the stop below hung (tianjax.runtime.process.shutdown)
        with shutdown.critical():
            while True:
                events = learner.events(0.1)
                shutdown.check()  # before the exit code: a stopped learner's 130/143 is no failure
                code = learner.poll()
                if code is not None:
                    events += learner.rest()
                    if code == 0:
                        break
                    why = f"; it failed with {learner.failure}" if learner.failure else ""
                    if (
                        code in (130, 143)
                        or not config.runtime.restart_learner
                        or learner_restarts >= config.runtime.max_learner_restarts
                    ):
                        where = _last_checkpoint(run_dir)
                        raise LearnerFailure(
                            f"the learner process exited with code {code}; {where}{why}"
                        )
                    learner_restarts += 1
                    # from its newest checkpoint (or, if it wrote none, from where this run began)
                    resume = run_dir if ckpt.has_checkpoint(run_dir) else config.resume
                    learner, warm = standby.next_learner(resume, cold)
                    where = _last_checkpoint(run_dir)
                    print(
                        f"tianjax: warning: the learner process exited with code {code}; restarting it "
                        f"({learner_restarts}/{config.runtime.max_learner_restarts}) from {where}{why}"
                        + (" (its warm standby took over)" if warm else ""),
                        file=sys.stderr,
                        flush=True,
                    )
                    continue
                silent = [
                    i for ev in events if ev["tianjax_event"] == "silent" for i in ev["actors"]
                ]
                supervise_actors(config, actors, silent, log_dir)
                _supervise_evaluator(evaluator, log_dir)
    except KeyboardInterrupt:
        interrupted = True  # the learner process, stopped below, checkpoints and reports
    finally:
        if standby is not None:
            standby.close()
        if learner is not None:
            learner.stop()
        if actors is not None:
            actors.stop(grace_s=5.0)
        if evaluator is not None:
            evaluator.stop(grace_s=0.0)
        if ports is not None:
            ports.close()
        if private is not None:
            private.close()
    if interrupted and not os.path.exists(result_path):
        raise KeyboardInterrupt("stopped before the learner could report")
    with open(result_path) as f:
        figures = json.load(f)
    _, state, _ = ckpt.restore_latest(run_dir)
    out = RunOutcome.from_json(figures, params=state["learner"]["params"])
    return out._replace(
        interrupted=out.interrupted or interrupted,
        # this process's clock covered every learner incarnation; only a run resumed by the
        # user has time from before it
        wall_offset_s=wall_offset,
        extra_summary={
            **out.extra_summary,
            "actor_restarts": actors.total_restarts if actors else 0,
            "actor_restarts_from_standby": actors.promoted if actors else 0,
            "actors_lost": len(actors.lost) if actors else 0,
            "learner_restarts": learner_restarts,
            "learner_restarts_from_standby": standby.promoted if standby else 0,
            **_lost_with_learners(out.extra_summary, received_at_launch, actors),
            **_evaluator_counts(evaluator),
        },
    )


def _lost_with_learners(summary: dict, received_at_launch: int, actors) -> dict:
    """summary.json's count of what a learner killed or failed took with it: trajectories
    the actors sent to earlier learner incarnations that no checkpoint resumed from had
    received (pooled, in flight, or learned from after that checkpoint), and rollouts made
    for a learner replaced before they went out. None where an actor process was restarted
    (its counts went with it), or where the final learner did not hear an actor's counts."""
    by_actor = summary.get("trajectories_by_actor", {})
    if (
        actors is None
        or actors.total_restarts
        or "trajectories_received_before" not in summary
        # an actor the final learner never heard count (none registered with it)
        or any(a.get("sent_before") is None for a in by_actor.values())
    ):
        return {"trajectories_lost_with_learners": None, "trajectories_unsent_at_restart": None}
    sent_before = sum(a["sent_before"] for a in by_actor.values())
    received = summary["trajectories_received_before"] - received_at_launch
    return {
        "trajectories_lost_with_learners": sent_before - received,
        "trajectories_unsent_at_restart": sum(a.get("unsent") or 0 for a in by_actor.values()),
    }


def _last_checkpoint(run_dir: str) -> str:
    try:
        meta = ckpt.read_meta(run_dir)
    except ckpt.CheckpointError:
        return "there is no checkpoint yet"
    return f"the last checkpoint is step {meta['updates']} in {ckpt.checkpoint_dir(run_dir)}"


__all__ = ["RoleProcess", "StandbyLearner", "run_local", "supervise_actors"]
