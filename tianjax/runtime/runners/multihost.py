"""Multi-host roles: `tianjax launch --role learner|actor CONFIG ...`, one process per command.

Learner processes call `jax.distributed.initialize` (an explicit coordinator address,
process count and id, or the cluster's auto-detection, e.g. SLURM) and form one global
mesh; the update is data-parallel over it, gradients are all-reduced by XLA, and the
parameters stay identical on every learner process. Learner process i binds three ports,
`base_port + 3 i` (parameters), `+1` (trajectories), `+2` (control), on `bind_host`
(loopback unless set), and holds them from its first second. Actor k connects, over tcp,
to learner `k mod num_learners`. The learners' collectives use the address that reaches
the others, whatever the host name resolves to (tianjax.launch.collectives).

`num_actors` and `total_env_steps` are per learner process: learner i trains on the
actors `i, i + N, i + 2N, ...` (N learners), `num_actors` of them, so actor ids run from 0
to N * num_actors - 1. Each learner prints which ids it expects and where they connect.

The per-run key comes from `--key-file` or the TIANJAX_RUN_KEY environment variable, the
same on every process; it is never printed. Connections use `runtime.security: curve`
unless the config says otherwise (a multi-host run crosses a network).

A lost learner process ends the run in bounded time (tianjax.launch.guard): the others notice
within `runtime.heartbeat_timeout_s`, tell their actors the run failed, print one line
and exit 1; a SIGTERM ends a learner within seconds even inside a collective; an actor
whose learner is gone gives up after the same timeout and is not restarted.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import selectors
import signal
import socket
import sys
import threading
import time

from tianjax.config import Config, ConfigError
from tianjax.errors import LearnerStalled
from tianjax.launch import collectives
from tianjax.launch.ports import BACKLOG, CHANNELS

SIGTERM_GRACE_S = 5.0


def request_stop(signum, frame):
    """A role's SIGTERM and SIGINT handler: the loop stops at its next check."""
    from tianjax.runtime.process import shutdown

    shutdown.request()


def learner_endpoints(host: str, base_port: int, index: int) -> dict:
    p = base_port + 3 * index
    return {
        "params": f"tcp://{host}:{p}",
        "traj": f"tcp://{host}:{p + 1}",
        "control": f"tcp://{host}:{p + 2}",
    }


def with_security(config: Config) -> Config:
    """A multi-host run crosses a network: curve unless `runtime.security` is set."""
    if config.runtime.security is not None:
        return config
    return dataclasses.replace(
        config, runtime=dataclasses.replace(config.runtime, security="curve")
    )


def actor_ids(index: int, num_learners: int, num_actors: int) -> list[int]:
    """The actor ids learner `index` trains on: k with k mod num_learners == index."""
    return [index + num_learners * j for j in range(num_actors)]


class _HeldPorts:
    """Learner `index`'s three ports, bound from the process's first second until its
    Learner serves them (`handover`). Meanwhile a thread accepts each connection and keeps
    it until the actor drops it (after its handshake times out, and it connects again): an
    actor sees a learner that is starting (joining the others, compiling) rather than none,
    and waits for it (tianjax.runtime.actor); and the listen queue never fills with
    connections nobody would serve."""

    def __init__(self, host: str, base_port: int, index: int):
        self.socks: list[socket.socket] = []
        port = base_port + 3 * index
        try:
            for port in range(base_port + 3 * index, base_port + 3 * index + len(CHANNELS)):
                family, kind, proto, _, where = socket.getaddrinfo(
                    None if host in ("", "*") else host.strip("[]"),
                    port,
                    type=socket.SOCK_STREAM,
                    flags=socket.AI_PASSIVE,
                )[0]
                s = socket.socket(family, kind, proto)
                self.socks.append(s)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind(where)
                s.listen(BACKLOG)
        except OSError as e:
            for s in self.socks:
                s.close()
            if e.errno is not None:  # (the CLI says it in one line: the address, and what to do)
                raise OSError(e.errno, os.strerror(e.errno), f"tcp://{host}:{port}") from None
            raise ConfigError(
                f"launch: learner {index} cannot listen on {host} port {port} ({e}): "
                "does another process hold it? (--base-port moves the ports)"
            ) from None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._hold, name="tianjax-held-ports", daemon=True)
        self._thread.start()

    def _hold(self) -> None:
        with selectors.DefaultSelector() as sel:
            for s in self.socks:
                s.setblocking(False)  # (a connection gone before its accept must not block it)
                sel.register(s, selectors.EVENT_READ)
            while not self._stop.is_set():
                for key, _ in sel.select(0.1):
                    try:
                        if key.fileobj in self.socks:
                            conn, _ = key.fileobj.accept()
                            sel.register(conn, selectors.EVENT_READ)
                        elif not key.fileobj.recv(4096):  # (its greeting is dropped unread)
                            sel.unregister(key.fileobj)
                            key.fileobj.close()
                    except OSError:
                        if key.fileobj not in self.socks:
                            sel.unregister(key.fileobj)
                            key.fileobj.close()
            for key in list(sel.get_map().values()):
                if key.fileobj not in self.socks:
                    key.fileobj.close()

    def handover(self) -> dict[str, int]:
        """Stops holding; returns copies of the listening descriptors (channel name -> fd)
        for the Learner's sockets, which own them."""
        self._stop.set()
        self._thread.join()
        for s in self.socks:
            s.setblocking(True)  # as tianjax.launch.ports hands them over
        fds = {name: os.dup(s.fileno()) for name, s in zip(CHANNELS, self.socks)}
        for s in self.socks:
            s.close()
        return fds


def _join(
    coordinator: str | None,
    num_processes: int | None,
    process_id: int | None,
    heartbeat_timeout_s: float,
) -> None:
    """jax.distributed.initialize, or one line naming the coordinator's address it tried."""
    import jax

    # JAX's own heartbeat is the backstop (it aborts): ours (guard.PeerWatch) reports first
    heartbeat = int(math.ceil(heartbeat_timeout_s)) + 5
    try:
        if coordinator is not None:
            jax.distributed.initialize(
                coordinator_address=coordinator,
                num_processes=num_processes,
                process_id=process_id,
                heartbeat_timeout_seconds=heartbeat,
            )
        else:
            jax.distributed.initialize(
                heartbeat_timeout_seconds=heartbeat
            )  # cluster auto-detection (SLURM, ...)
    except RuntimeError as e:  # JAX's runtime error: the coordinator did not answer in time
        from tianjax.launch.guard import exit_now

        where = coordinator or "the coordinator"
        try:
            where += (
                f" ({collectives.resolve(collectives.split_host_port(coordinator)[0])} from here)"
            )
        except (OSError, ValueError, AttributeError):
            pass
        exit_now(
            f"tianjax: error: learner {process_id}: cannot join the run's coordinator at {where}: "
            f"{str(e).strip().splitlines()[0][:200]}",
            1,
        )


def _collectives(config: Config, coordinator: str, bind_host: str, index: int, count: int) -> str:
    """Gives JAX's collectives the address the other learners reach this one at
    (tianjax.launch.collectives); returns it for the learner's start line. A learner that
    cannot reach another ends here with one line naming the address it tried."""
    from jax._src.distributed import global_state

    from tianjax.launch.guard import exit_now

    if count == 1:
        return ""
    timeout = config.runtime.heartbeat_timeout_s
    try:
        chosen = collectives.choose(
            global_state.client, index, count, coordinator, bind_host, timeout
        )
        collectives.check_reach(global_state.client, index, count, chosen.address, timeout)
    except collectives.Unreachable as e:
        if index == 0:
            time.sleep(1.0)  # the others read the checks' results from its coordination service
        exit_now(
            f"tianjax: error: learner {index}/{count}: {e}; every learner must reach the others "
            "(--bind-host chooses the interface)",
            1,
        )
    collectives.use_for_gloo(chosen.address)
    if not collectives.is_loopback(chosen.address) and _on_loopback(bind_host):
        # the learners span hosts, and this one's actors can only be on its own
        print(
            f"tianjax: warning: learner {index}/{count} binds its ports on loopback ({bind_host}): "
            "only actors on its own host can connect; --bind-host 0.0.0.0 (or an address of this "
            "host) lets others in",
            file=sys.stderr,
            flush=True,
        )
    return f"; collectives on {chosen.address} ({chosen.how})"


def _on_loopback(host: str) -> bool:
    try:
        return host.strip() not in collectives.WILDCARDS and collectives.is_loopback(
            collectives.resolve(host)
        )
    except (OSError, ValueError):
        return False


def launch_key(key_file: str | None):
    """The run key from `key_file` or $TIANJAX_RUN_KEY, or one line saying what is missing."""
    from tianjax.transport.auth import KEY_ENV, load_key

    if key_file is None and not os.environ.get(KEY_ENV):
        raise ConfigError(
            f"launch: no run key: pass --key-file FILE or set {KEY_ENV} (the same on every process)"
        )
    try:
        return load_key(key_file)
    except (
        ValueError,
        PermissionError,
        FileNotFoundError,
    ) as e:  # a bad key, or a file others may read
        raise ConfigError(f"launch: {e}") from None


def run_learner(
    config: Config,
    *,
    coordinator: str | None,
    num_processes: int | None,
    process_id: int | None,
    bind_host: str,
    base_port: int,
    key_file: str | None,
) -> int:
    import jax

    from tianjax.runtime.process import compile_cache

    compile_cache.enable(config.compile_cache)
    config = with_security(config)
    if config.num_actors < 1:
        raise ConfigError(
            f"launch --role learner: num_actors must be >= 1 (actor processes per learner "
            f"process, started with tianjax launch --role actor), got {config.num_actors}"
        )
    run_key = launch_key(key_file)
    if (coordinator is not None or num_processes is not None) and (
        coordinator is None or num_processes is None or process_id is None
    ):
        raise ConfigError("launch: --coordinator, --num-processes and --process-id go together")
    # from here on its actors see a learner that is starting
    held = _HeldPorts(bind_host, base_port, process_id) if process_id is not None else None
    _join(coordinator, num_processes, process_id, config.runtime.heartbeat_timeout_s)
    from jax._src.distributed import global_state

    # NOTE: not jax.process_index(): it would start JAX's backend, whose collectives must
    # first be given their address (below)
    index, count = global_state.process_id, global_state.num_processes
    if held is None:
        held = _HeldPorts(bind_host, base_port, index)
    from tianjax.launch.guard import PeerWatch, SigtermWatchdog, exit_now, exit_on_abort

    if index != 0:  # JAX's client aborts the moment learner 0's coordination service is gone
        exit_on_abort(
            f"tianjax: error: learner {index}/{count}: learner process 0 is lost (JAX's "
            "coordination service, which it hosts, stopped answering; JAX's log above); "
            "stopping; the last checkpoint stands"
        )
    net = _collectives(
        config, coordinator or global_state.coordinator_address, bind_host, index, count
    )
    if config.stop_at_target and count > 1:
        # every learner must take the same number of collective updates, and each tracks
        # the episodes of its own actors
        raise ConfigError("stop_at_target: not supported in a multi-process run (set it false)")
    # NOTE: set after jax.distributed.initialize, which installs its own SIGTERM handling
    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    SigtermWatchdog(SIGTERM_GRACE_S, code=143, what=f"learner {index}")
    peers = None
    if count > 1:
        from tianjax.runtime.process import shutdown

        def lost(line: str) -> None:
            # the main thread stops at its next check, tells its actors and exits (below);
            # if it is blocked in a collective with the lost process, end the process here
            shutdown.requested.set()
            time.sleep(1.0)  # (before a failing learner 0 takes JAX's coordination service down)
            exit_now(line, 1)

        peers = PeerWatch(
            global_state.client, index, count, config.runtime.heartbeat_timeout_s, on_lost=lost
        )
    from tianjax.metrics import Progress, RunLogger, format_summary
    from tianjax.runtime.learner.learner import Learner
    from tianjax.runtime.record.recorder import save_params

    run_dir = os.path.join(config.run_dir or "runs/multihost", f"learner-{index}")
    logger = RunLogger(config, run_dir)
    progress = Progress(
        config.total_env_steps,
        enabled=False if index else None,
        desc=f"learner {index}/{jax.process_count()}",
    )
    # every learner process writes (its shards of) the same checkpoints: the run's root;
    # it serves the ports held since its start
    learner = Learner(
        config,
        run_key,
        logger,
        progress,
        endpoints=learner_endpoints(bind_host, base_port, index),
        checkpoint_root=os.path.dirname(logger.run_dir),
        listen_fds=held.handover(),
    )
    if count > 1:  # its records list its actors' episodes, for the run's moving average
        learner.recorder.episode_log = []
    ids = actor_ids(index, count, config.num_actors)
    learner.watch.who = f"learner {index}/{count}"
    learner.watch.hint = (
        f"its actors with tianjax launch --role actor --actor-id {', '.join(map(str, ids))} "
        f"--num-learners {count} --learner-host <this host> --base-port {base_port}"
    )
    print(
        f"tianjax: learner {index}/{count} on {learner.mesh.devices.size} devices ({config.runtime.security}); "
        f"its actors are --actor-id {', '.join(map(str, ids))} (of 0-{count * config.num_actors - 1}; "
        f"num_actors={config.num_actors} per learner), started with --num-learners {count} "
        f"--learner-host <this host> --base-port {base_port}: ports {base_port + 3 * index}-"
        f"{base_port + 3 * index + 2} on {bind_host}{net}",
        flush=True,
    )
    t0 = time.perf_counter()
    try:
        out = learner.run(t_start=t0)
        if peers is not None and peers.lost:
            raise RuntimeError(peers.lost)
    except Exception as e:  # noqa: BLE001
        if count == 1:
            raise
        # a collective failed: another learner process is gone. Say so once, tell our actors
        # the run failed, and leave without jax.distributed.shutdown (it would wait for it)
        if isinstance(e, LearnerStalled):
            why = (
                f"{e}: start its actors with --actor-id {', '.join(map(str, ids))} --num-learners {count} "
                f"(num_actors={config.num_actors} per learner)"
            )
        else:
            why = (
                peers.lost
                if peers and peers.lost
                else f"a collective failed, another learner process is lost ({type(e).__name__}: "
                f"{str(e).strip().splitlines()[0][:160]})"
            )
        line = f"tianjax: error: learner {index}/{count}: {why}; the last checkpoint stands"
        if index != 0:  # learner 0 may leave (taking JAX's service with it) before we do
            exit_on_abort(line)
        learner.stop_actors(error=f"learner {index}: {why}")
        if peers is not None and not peers.lost:
            peers.announce_failure(f"learner {index} failed: {why}")  # lets the stop go out too
        else:
            time.sleep(0.5)  # let the stop go out
        exit_now(line, 1)
    finally:
        if peers is not None:
            peers.close()
        learner.stop_actors()
        learner.close()
        progress.close()
    save_params(os.path.join(logger.run_dir, "final_params.npz"), out.params)
    summary = {
        "mode": config.mode,
        "algo": config.algo,
        "env": config.env,
        "process_index": index,
        "process_count": jax.process_count(),
        "env_steps": out.env_steps,
        "updates": out.updates,
        "env_steps_per_s": out.env_steps_per_s,
        "final_return": out.final_return,
        "convergence_time_s": out.convergence_time_s,
        "convergence_env_steps": out.convergence_env_steps,
        "compile_time_s": out.compile_time_s,
        "skipped_updates": out.skipped_updates,
        "episodes": out.episodes,
        "wall_time_s": time.perf_counter() - t0,
        "target_return": config.target_return,
        "interrupted": out.interrupted,
        **out.extra_summary,
    }
    summary = logger.write_summary(summary)
    logger.close()
    print(format_summary(summary), flush=True)
    if count > 1 and out.interrupted:
        # the other learners are still in the run: jax.distributed.shutdown would wait for them
        exit_now(f"tianjax: learner {index}/{count} interrupted; the last checkpoint stands", 143)
    jax.distributed.shutdown()
    return 130 if out.interrupted else 0


def run_actor(
    config: Config,
    *,
    actor_id: int,
    learner_host: str,
    base_port: int,
    num_learners: int,
    key_file: str | None,
) -> int:
    """Runs actor `actor_id` as a supervised child process: restarted when it dies, up to
    `runtime.max_actor_restarts` times, until the learner tells it to stop (exit code 0)."""
    from tianjax.launch.supervisor import ActorSupervisor
    from tianjax.runtime.actor.actor import LEARNER_GONE

    config = with_security(config)
    if config.groups.enabled:  # learner groups: num_actors is the run's, split over them
        from tianjax.runtime.groups.shares import group_config

        num_learners = config.groups.count
        if not 0 <= actor_id < config.num_actors:
            raise ConfigError(
                f"launch: --actor-id {actor_id} is outside 0-{config.num_actors - 1}: with "
                f"groups.count={num_learners} and num_actors={config.num_actors} (the run's) "
                f"the actor ids are 0 to {config.num_actors - 1}, actor k training for group "
                f"k mod {num_learners}"
            )
        config = group_config(config, actor_id % num_learners)
    if num_learners < 1:
        raise ConfigError(f"launch: --num-learners must be >= 1, got {num_learners}")
    total = num_learners * config.num_actors
    if not 0 <= actor_id < total:
        raise ConfigError(
            f"launch: --actor-id {actor_id} is outside 0-{total - 1}: with --num-learners "
            f"{num_learners} and num_actors={config.num_actors} (per learner) the actor ids "
            f"are 0 to {total - 1}, actor k training for learner k mod {num_learners}"
        )
    run_key = launch_key(key_file)
    endpoints = learner_endpoints(learner_host, base_port, actor_id % num_learners)
    print(
        f"tianjax: actor {actor_id} -> learner {actor_id % num_learners} at {json.dumps(endpoints)} "
        f"({config.runtime.security})",
        flush=True,
    )
    sup = ActorSupervisor(config, endpoints, run_key)
    signal.signal(signal.SIGTERM, request_stop)
    try:
        sup.start(actor_id)
        while True:
            time.sleep(0.2)
            p = sup.procs.get(actor_id)
            if p is not None and p.poll() == LEARNER_GONE:
                # its learner is gone or failed: another process would only wait again
                print(
                    f"tianjax: error: actor {actor_id}: its learner ({endpoints['control']}) is gone "
                    "or failed; see the line above",
                    file=sys.stderr,
                    flush=True,
                )
                return 1
            changes = sup.check()
            for i, why in changes.restarted.items():
                print(
                    f"tianjax: warning: actor {i} ({why}) restarted "
                    f"({sup.restarts[i]}/{config.runtime.max_actor_restarts})",
                    file=sys.stderr,
                    flush=True,
                )
            if changes.lost:
                why = changes.lost[actor_id]
                print(
                    f"tianjax: error: actor {actor_id} ({why}) is out of restarts",
                    file=sys.stderr,
                    flush=True,
                )
                return 1
            if not sup.procs:  # it exited 0: told to stop by the learner
                return 0
    except KeyboardInterrupt:
        return 143
    finally:
        sup.stop(grace_s=2.0)


__all__ = [
    "SIGTERM_GRACE_S",
    "actor_ids",
    "learner_endpoints",
    "run_actor",
    "run_learner",
    "with_security",
]
