"""Helpers for tests that run the real thing: OS processes, real sockets, real run dirs.

Nothing here may hang or leak: every process a test starts goes through `procs`, which
starts it in its own session (process group) and, in teardown, SIGKILLs whatever of that
group is still alive, by the group id it created. Every wait has a timeout.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tianjax.metrics.logger import read_metrics

REPO = Path(__file__).resolve().parents[2]
ASYNC_CFG = str(REPO / "configs" / "ppo_cartpole_async.yaml")
ROLE_MARK = "tianjax.launch.role"  # in every actor process's command line (local launcher)


def child_env(**extra) -> dict:
    env = dict(os.environ)
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def wait_for(predicate, timeout: float, interval: float = 0.05, what: str = "condition"):
    """Polls until predicate() is truthy (returns it) or raises after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def records(run_dir) -> list[dict]:
    """The metrics.jsonl records written so far (a half-written last line is skipped)."""
    return read_metrics(str(run_dir))


def updates_logged(run_dir) -> int:
    recs = records(run_dir)
    return max((r.get("updates", 0) for r in recs), default=0)


def read_summary(run_dir) -> dict:
    return json.loads((Path(run_dir) / "summary.json").read_text())


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def actor_processes(pid: int, role: str = "actor") -> list[psutil.Process]:
    """The actor (or learner) processes under `pid`, identified by their command line."""
    out = []
    for p in descendants(pid):
        try:
            cmd = p.cmdline()
            if ROLE_MARK in cmd and cmd[cmd.index(ROLE_MARK) + 1] == role:
                out.append(p)
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            pass
    return out


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    """Those still running (zombies count as gone: they hold no resources but a pid)."""
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def ask_for_stacks(procs) -> None:
    """Asks each of `procs` (Popen or psutil) still running for its threads' stacks: the
    CLI and role processes print them to their stderr on SIGUSR1. Gives them 2 s."""
    for p in procs:
        try:
            p.send_signal(signal.SIGUSR1)
        except (psutil.NoSuchProcess, ProcessLookupError):
            pass
    time.sleep(2.0)


def wait_exited(
    procs: list[psutil.Process], timeout: float, log_dir=None, what: str = "the processes to exit"
) -> None:
    """Waits until none of `procs` is alive. If some still are, raises with their stacks
    in the tail of their logs (`log_dir`/actor-N.log, as the launcher writes them), so a
    hang shows where it is."""
    try:
        wait_for(lambda: not alive(procs), timeout, what=what)
    except TimeoutError as e:
        left = alive(procs)
        ask_for_stacks(left)
        logs = sorted(Path(log_dir).glob("*.log")) if log_dir else []
        tails = "\n".join(f"--- {f.name}\n{f.read_text(errors='replace')[-4000:]}" for f in logs)
        raise AssertionError(f"{e}; still alive: {[p.pid for p in alive(left)]}\n{tails}") from None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_block(n: int, tries: int = 50) -> int:
    """A base port such that base .. base + n - 1 are all free on loopback now."""
    import random

    rng = random.Random(os.getpid() ^ time.time_ns())
    for _ in range(tries):
        base = rng.randrange(20000, 60000 - n)
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no block of {n} free ports found")


class Procs:
    """Starts subprocesses in their own process groups and kills what is left in teardown."""

    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self.started: list[tuple[subprocess.Popen, Path]] = []

    def start(self, args: list[str], name: str, env: dict | None = None) -> subprocess.Popen:
        """Runs `python args...` with stdout and stderr to separate files in log_dir."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        out = open(self.log_dir / f"{name}.out", "wb")
        err = open(self.log_dir / f"{name}.err", "wb")
        p = subprocess.Popen(
            [sys.executable, *args],
            cwd=REPO,
            env=env or child_env(),
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        out.close()
        err.close()
        p.log_name = name
        self.started.append((p, self.log_dir / name))
        return p

    def stderr(self, p: subprocess.Popen) -> str:
        return (self.log_dir / f"{p.log_name}.err").read_text(errors="replace")

    def stdout(self, p: subprocess.Popen) -> str:
        return (self.log_dir / f"{p.log_name}.out").read_text(errors="replace")

    def wait(self, p: subprocess.Popen, timeout: float) -> int:
        try:
            return p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            ask_for_stacks([p])  # where it hangs
            raise AssertionError(
                f"{p.log_name} still running after {timeout:.0f} s; stderr:\n"
                + self.stderr(p)[-6000:]
            ) from None

    def kill_all(self) -> None:
        for p, _ in self.started:
            # the group this test created: the process and anything it started that is left
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


@pytest.fixture
def procs(tmp_path):
    ps = Procs(tmp_path / "logs")
    try:
        yield ps
    finally:
        ps.kill_all()


def run_in_process(
    config,
    logger=None,
    instrument=lambda actor: None,
    learner_kwargs=None,
    prepare=lambda learner: None,
):
    """A Learner in this process and its actors in threads, over real sockets: the learner's
    state stays readable. `prepare(learner)` runs before the actors are made and
    `instrument(actor)` on each actor before it runs. Returns (learner, result). An actor
    thread that raises stops the learner, and its error is raised here (not a learner
    waiting out its heartbeat timeout for trajectories that cannot come)."""
    import threading

    from tianjax.runtime.actor.actor import Actor
    from tianjax.runtime.learner.learner import Learner
    from tianjax.transport.auth import new_run_key

    run_key = new_run_key()
    learner = Learner(config, run_key, logger, **(learner_kwargs or {}))
    prepare(learner)
    actors = [Actor(config, i, learner.endpoints, run_key) for i in range(config.num_actors)]
    for a in actors:
        instrument(a)
    errors: list[BaseException] = []

    def run(actor):
        try:
            actor.run()
        except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(a,), daemon=True) for a in actors]
    for t in threads:
        t.start()
    try:
        out = learner.run(should_stop=lambda: bool(errors))
        raised = list(errors)  # while the run went on (not in the teardown below)
    finally:
        learner.stop_actors()
        for t in threads:
            t.join(30)
        learner.close()
    if raised:
        raise AssertionError(f"an actor thread raised: {raised[0]!r}") from raised[0]
    return learner, out
