"""Actor supervision: start actor processes, replace dead or silent ones, stop them all.

An actor that cannot start (it exits with code 78 after one line saying why: a bad env
id, a module it cannot import) would fail the same way again: it is not restarted, and
the caller ends the run with its line. An actor that exits while the run goes on, or
that the learner reports silent (no heartbeat or trajectory for
`runtime.heartbeat_timeout_s`: hung, stopped, cut off), is killed if need be and started
again under the same id, at most `runtime.max_actor_restarts` times per id. A replacement
registers with the learner like any actor and gets the newest
parameters at once; in async mode the learner keeps updating on what the others send
meanwhile. An actor out of restarts is lost: the caller decides whether the run can go on.

The evaluator of a run (`eval.every_updates` or `eval.every_s`; see
tianjax.runtime.evaluation.evaluator) is supervised the same way by a supervisor of its
own (`role="evaluator"`, one process): restarted when it dies, and, out of restarts or
unable to start, said in one line while the run goes on without it.

Actors are separate OS processes started with `python -m tianjax.launch.role actor`; the
per-run key reaches them through the environment (never argv, logs or files), and each
asks the kernel to signal it if its launcher dies (Linux), on top of its own heartbeat
timeout. Actors import what this process can: its `sys.path` reaches them as
PYTHONPATH, so a module next to the script (or added to sys.path) is found by
`env=module:EnvId`, `imports` and `network.module` in the actors too.

With `runtime.standby_actors`, each actor id also has a warm standby: a second process
started the same way with `--standby`, which imports, builds its envs and compiles, then
waits on its standard input without opening a socket (tianjax.launch.role.await_turn). A
replacement is that standby told to go (a line on its stdin): it connects, registers and
acts within a rollout, instead of paying a process's start-up (JAX's import alone is over
a second). Another standby is started behind it at once. A standby that died is replaced by
a cold start. At the stop, standbys have their stdin closed, and exit.

`runtime.actor_wrapper` puts a command before each actor's (`taskset -c {actor}` pins it,
`ip netns exec host{actor}` starts it on a network-namespace host; experiments/studies/chaos
cuts and caps such hosts' links). The wrapper must exec what follows it, as those do, so
that the process started is the actor itself: its pid, its signals, its parent.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Iterable

from tianjax.config import Config
from tianjax.launch.placement import actor_environment, apply
from tianjax.launch.role import STARTUP_FAILED  # the actor could not start, and never will
from tianjax.transport.auth import KEY_ENV

# Actors share this machine's cores with the learner: one XLA thread pool each (and
# synchronous dispatch, which the actor's entry point sets: tianjax.launch.role.actor_jax).
ACTOR_XLA_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


@dataclass
class Changes:
    """What one check() did: actors started again, and actors given up on (id -> why)."""

    restarted: dict[int, str] = field(default_factory=dict)
    lost: dict[int, str] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)  # could not start: its own error line
    from_standby: set[int] = field(default_factory=set)  # restarted ones its warm standby took


class ActorSupervisor:
    """`role`: "actor" (processes for the actor ids `ids`, default 0 .. num_actors - 1; a
    learner group's are its share of the run's, tianjax.runtime.groups.shares) or
    "evaluator" (one, which also takes `run_dir`, where it writes videos and the best params)."""

    def __init__(
        self,
        config: Config,
        endpoints: dict,
        run_key: bytes,
        log_dir: str | None = None,
        role: str = "actor",
        run_dir: str | None = None,
        ids: Iterable[int] | None = None,
    ):
        self.config = config
        self.role, self.run_dir = role, run_dir
        self.ids = (
            list(range(config.num_actors) if ids is None else ids) if role == "actor" else [0]
        )
        self.endpoints = endpoints
        self.run_key = run_key
        self.log_dir = log_dir
        self.procs: dict[int, subprocess.Popen] = {}
        # runtime.standby_actors: a warm process per actor id, waiting for its turn
        self.standby = role == "actor" and config.runtime.standby_actors
        self.standbys: dict[int, subprocess.Popen] = {}
        self.promoted = 0  # replacements made by a standby (the rest started cold)
        self.exit_codes: dict[int, int] = {}
        self.restarts: dict[int, int] = {}  # actor id -> times started again
        self.lost: dict[int, str] = {}

    @property
    def total_restarts(self) -> int:
        return sum(self.restarts.values())

    def pid(self, actor_id: int) -> int | None:
        p = self.procs.get(actor_id)
        return None if p is None else p.pid

    def start(self, actor_id: int) -> None:
        """Starts the process of `actor_id`: its warm standby where one waits, else a new
        one; then (runtime.standby_actors) a standby for its next start."""
        self._start(actor_id)
        self._keep_standby(actor_id)

    def _start(self, actor_id: int) -> None:
        spare = self.standbys.pop(actor_id, None)
        if spare is not None and spare.poll() is None and self._go(spare):
            self.procs[actor_id] = spare
            self.promoted += 1
        else:
            if spare is not None:
                self._dismiss(spare)
            self.procs[actor_id] = self._spawn(actor_id)

    def _keep_standby(self, actor_id: int) -> None:
        if self.standby and actor_id not in self.standbys:
            self.standbys[actor_id] = self._spawn(actor_id, standby=True)

    @staticmethod
    def _go(spare: subprocess.Popen) -> bool:
        try:
            spare.stdin.write(b"go\n")
            spare.stdin.close()
            return True
        except OSError:  # it died meanwhile (a broken pipe)
            return False

    @staticmethod
    def _dismiss(spare: subprocess.Popen) -> None:
        """Ends a standby: stdin closed (it exits 0), else terminated after a moment."""
        try:
            spare.stdin.close()
        except OSError:
            pass
        try:
            spare.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            spare.kill()
            spare.wait()

    def _spawn(self, actor_id: int, standby: bool = False) -> subprocess.Popen:
        # its platform, and where the actor devices are listed its own device and memory
        # share (tianjax.launch.placement); the evaluator takes the slot after the actors'
        slot = actor_id if self.role == "actor" else self.config.num_actors
        env = apply(dict(os.environ), actor_environment(self.config, slot))
        env[KEY_ENV] = self.run_key.hex()
        cpu = self.config.runtime.actor_device_list.platform == "cpu"
        if cpu and self.config.runtime.actor_threads == 1:
            env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + ACTOR_XLA_FLAGS).strip()
        env.setdefault("PYTHONUNBUFFERED", "1")
        env["PYTHONPATH"] = python_path(env.get("PYTHONPATH", ""))
        cmd = [
            *(part.format(actor=slot) for part in self.config.runtime.actor_wrapper),
            sys.executable,
            "-m",
            "tianjax.launch.role",
            self.role,
            "--actor-id",
            str(actor_id),
            "--config-json",
            json.dumps(self.config.to_dict()),
            "--endpoints-json",
            json.dumps(self.endpoints),
            "--parent-pid",
            str(os.getpid()),
        ]
        if self.run_dir is not None:
            cmd += ["--run-dir", self.run_dir]
        if standby:
            cmd.append("--standby")
        out = None
        if self.log_dir:
            os.makedirs(self.log_dir, exist_ok=True)
            out = open(os.path.join(self.log_dir, self.log_name(actor_id)), "ab")  # noqa: SIM115
        try:
            return subprocess.Popen(
                cmd,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT if out else None,
                stdin=subprocess.PIPE if standby else subprocess.DEVNULL,
            )
        finally:
            if out:
                out.close()

    def log_name(self, actor_id: int) -> str:
        return f"{self.role}-{actor_id}.log"

    def start_all(self) -> None:
        for i in self.ids:
            self._start(i)
        for i in self.ids:  # after every actor: those start first
            self._keep_standby(i)

    def _replace(self, actor_id: int, why: str, changes: Changes) -> None:
        if self.restarts.get(actor_id, 0) >= self.config.runtime.max_actor_restarts:
            self.lost[actor_id] = why
            changes.lost[actor_id] = why
            return
        self.restarts[actor_id] = self.restarts.get(actor_id, 0) + 1
        promoted = self.promoted
        self.start(actor_id)
        changes.restarted[actor_id] = why
        if self.promoted > promoted:
            changes.from_standby.add(actor_id)

    def check(self, silent: Iterable[int] = ()) -> Changes:
        """Replaces actors that exited, and kills and replaces the `silent` ones."""
        changes = Changes()
        for i in sorted(set(silent)):
            p = self.procs.pop(i, None)
            if p is None:
                continue
            p.kill()  # SIGKILL also ends a stopped (SIGSTOP) process
            p.wait()
            self.exit_codes[i] = p.returncode
            self._replace(
                i, f"silent for more than {self.config.runtime.heartbeat_timeout_s:g} s", changes
            )
        for i, p in list(self.procs.items()):
            code = p.poll()
            if code is not None:
                del self.procs[i]
                self.exit_codes[i] = code
                if code == 0:
                    continue  # told to stop by the learner: the run is ending
                if code == STARTUP_FAILED:
                    self.lost[i] = changes.failed[i] = self._startup_error(i)
                    continue
                self._replace(
                    i,
                    f"exit code {code}" if code > 0 else f"killed by {signal.Signals(-code).name}",
                    changes,
                )
        return changes

    def _startup_error(self, actor_id: int) -> str:
        """The actor's own line (the last one of its log that says why it cannot start)."""
        if self.log_dir:
            try:
                with open(os.path.join(self.log_dir, self.log_name(actor_id)), "rb") as f:
                    f.seek(0, os.SEEK_END)
                    f.seek(max(f.tell() - 8192, 0))
                    lines = f.read().decode(errors="replace").splitlines()
                for line in reversed(lines):
                    if "cannot start:" in line:
                        return line.split("cannot start:", 1)[1].strip()
            except OSError:
                pass
        return f"exit code {STARTUP_FAILED} (see its output above)"

    def stop(self, grace_s: float = 5.0, unreachable: Iterable[int] = ()) -> None:
        """Waits up to grace_s for the actors (told to stop) to exit, then terminates them.
        `unreachable` actors never registered, so no stop can reach them: they are
        terminated at once (an interrupted start-up does not wait out the grace)."""
        for spare in self.standbys.values():
            try:
                spare.stdin.close()  # it exits (or is terminated below)
            except OSError:
                pass
        for i in unreachable:
            if i in self.procs:
                self.procs[i].terminate()
        deadline = time.monotonic() + grace_s
        for p in self.procs.values():
            try:
                p.wait(timeout=max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                p.terminate()
        for p in self.procs.values():
            try:
                p.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for i, p in self.procs.items():
            self.exit_codes[i] = p.returncode
        self.procs.clear()
        for spare in self.standbys.values():
            self._dismiss(spare)
        self.standbys.clear()


def python_path(existing: str) -> str:
    """This process's sys.path (directories), then what PYTHONPATH already held."""
    entries = [os.path.abspath(p) if p else os.getcwd() for p in sys.path]
    entries = [p for p in entries if os.path.isdir(p)] + [
        p for p in existing.split(os.pathsep) if p
    ]
    return os.pathsep.join(dict.fromkeys(entries))


def describe(changes: Changes, alive: int, log_dir: str, role: str = "actor") -> list[str]:
    """Console lines for a check's changes (the evaluator's: what the run goes on without)."""
    name = (lambda i: f"actor {i}") if role == "actor" else (lambda i: role)
    lines = [
        f"tianjax: warning: {name(i)} ({why}) restarted"
        f"{' (its warm standby took over)' if i in changes.from_standby else ''}; see {log_dir}"
        for i, why in sorted(changes.restarted.items())
    ]
    if role == "actor":
        lines += [
            f"tianjax: warning: actor {i} ({why}) is out of restarts; continuing with {alive} actors"
            for i, why in sorted(changes.lost.items())
        ]
    else:
        lines += [
            f"tianjax: warning: the {role} ({why}) is gone; the run goes on without evaluations "
            "during training (its final evaluation is the learner's)"
            for _, why in sorted({**changes.lost, **changes.failed}.items())
        ]
    return lines


__all__ = [
    "ACTOR_XLA_FLAGS",
    "STARTUP_FAILED",
    "ActorSupervisor",
    "Changes",
    "describe",
    "python_path",
]
