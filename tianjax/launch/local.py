"""The local launcher: this process is the learner; it starts `num_actors` actor processes,
wires them to its sockets, supervises them and, however the run ends (finished, Ctrl-C,
SIGTERM, a crash), stops every actor and leaves no orphans.

Actors are separate OS processes started with `python -m tianjax.launch.role actor`; the
per-run key reaches them through the environment (never argv, logs or files), and each
actor asks the kernel to signal it if the launcher dies (Linux), on top of its own
heartbeat timeout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Iterable

from tianjax.config import Config
from tianjax.metrics import Progress, RunLogger
from tianjax.runtime.learner import Learner
from tianjax.transport.auth import KEY_ENV, new_run_key

# Actors share this machine's cores with the learner: one XLA thread pool each.
_ACTOR_XLA_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


class ActorProcesses:
    def __init__(self, config: Config, endpoints: dict, run_key: bytes, log_dir: str | None = None):
        self.config = config
        self.endpoints = endpoints
        self.run_key = run_key
        self.log_dir = log_dir
        self.procs: dict[int, subprocess.Popen] = {}
        self.exit_codes: dict[int, int] = {}

    def start(self, actor_id: int) -> None:
        env = dict(os.environ)
        env[KEY_ENV] = self.run_key.hex()
        env["JAX_PLATFORMS"] = self.config.runtime.actor_devices
        if self.config.runtime.actor_devices == "cpu" and self.config.runtime.actor_threads == 1:
            env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + _ACTOR_XLA_FLAGS).strip()
        env.setdefault("PYTHONUNBUFFERED", "1")
        cmd = [sys.executable, "-m", "tianjax.launch.role", "actor",
               "--actor-id", str(actor_id),
               "--config-json", json.dumps(self.config.to_dict()),
               "--endpoints-json", json.dumps(self.endpoints),
               "--parent-pid", str(os.getpid())]
        out = None
        if self.log_dir:
            os.makedirs(self.log_dir, exist_ok=True)
            out = open(os.path.join(self.log_dir, f"actor-{actor_id}.log"), "ab")
        self.procs[actor_id] = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT if out else None,
                                                stdin=subprocess.DEVNULL)
        if out:
            out.close()

    def start_all(self) -> None:
        for i in range(self.config.num_actors):
            self.start(i)

    def dead(self) -> dict[int, int]:
        """Actors that have exited since the last call: {actor_id: exit code}."""
        gone = {}
        for i, p in list(self.procs.items()):
            code = p.poll()
            if code is not None:
                gone[i] = code
                self.exit_codes[i] = code
                del self.procs[i]
        return gone

    def stop(self, grace_s: float = 5.0, unreachable: Iterable[int] = ()) -> None:
        """Waits up to grace_s for the actors (told to stop) to exit, then terminates them.
        `unreachable` actors never registered, so no stop can reach them: they are
        terminated at once (an interrupted start-up does not wait out the grace)."""
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


class ActorFailure(RuntimeError):
    pass


def run_local(config: Config, logger: RunLogger, progress: Progress) -> dict:
    t_start = time.perf_counter()
    run_key = new_run_key()
    learner = Learner(config, run_key, logger, progress)
    actors = ActorProcesses(config, learner.endpoints, run_key,
                            log_dir=os.path.join(logger.run_dir, "actors"))
    failures: dict[int, int] = {}

    def should_stop() -> bool:
        gone = {i: c for i, c in actors.dead().items()}
        failures.update(gone)
        if not gone:
            return False
        ids = ", ".join(f"actor {i} (exit code {c})" for i, c in sorted(gone.items()))
        if config.mode == "sync" or not actors.procs:
            raise ActorFailure(f"{ids} stopped; see {logger.run_dir}/actors/ for its log")
        # async: the learner takes whatever the others send; say so once, then go on
        print(f"tianjax: warning: {ids} stopped; continuing with {len(actors.procs)} actors "
              f"(see {logger.run_dir}/actors/)", file=sys.stderr, flush=True)
        return False

    try:
        actors.start_all()
        out = learner.run(should_stop, t_start=t_start)
    finally:
        learner.stop_actors()
        registered = {info.get("actor") for info in learner.actors.values()}
        actors.stop(unreachable=[i for i in actors.procs if i not in registered])
        learner.close()
    out["extra_summary"]["actor_failures"] = len(failures)
    return out
