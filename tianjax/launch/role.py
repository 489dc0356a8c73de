"""Entry point of one role process started by a launcher on this machine:
`python -m tianjax.launch.role actor|learner|evaluator|averager ...` (a learner with
`--group` is one group's, the averager that of learner groups: tianjax.runtime.groups)."""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import sys


def _die_with_parent(parent_pid: int | None) -> None:
    """Linux: ask for SIGTERM when the launching process dies, so no actor is orphaned."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            PR_SET_PDEATHSIG = 1
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        except OSError:
            pass
    # NOTE: a launcher that died before the prctl above sends no signal: we already have
    # another parent, and would otherwise wait out connect_timeout_s for a dead learner.
    if parent_pid is not None and os.getppid() != parent_pid:
        sys.exit(143)


def stop_actor(signum, frame):
    """An actor's SIGTERM handler: exit code 143, once (a killed launcher's threads each
    send its parent-death SIGTERM as they exit; see tianjax.runtime.process.shutdown)."""
    from tianjax.runtime.process import shutdown

    shutdown.request(exit_code=143)


def _event(kind: str, **fields) -> None:
    """One line on stdout for the supervising launcher (see tianjax.runtime.runners.local)."""
    print(json.dumps({"tianjax_event": kind, **fields}), flush=True)


# An actor that cannot start (bad env id, a module it cannot import, a torso that does not
# fit) would fail the same way every time: it exits with this code after one line saying
# why, and the supervisor ends the run with that line instead of restarting it.
STARTUP_FAILED = 78  # EX_CONFIG


def _why(e: BaseException) -> str:
    """An exception in one line: its type and its message's first line (a ConfigError's
    message alone: it names the key)."""
    from tianjax.config import ConfigError

    line = (str(e).strip().splitlines() or [""])[0]
    return line if isinstance(e, ConfigError) else f"{type(e).__name__}: {line}"


def _startup_failed(args, e: BaseException) -> int:
    who = "evaluator" if args.role == "evaluator" else f"actor {args.actor_id}"
    print(f"tianjax: {who} cannot start: {_why(e)}", file=sys.stderr, flush=True)
    return STARTUP_FAILED


def actor_jax() -> None:
    """JAX as an actor process runs it; call before anything starts JAX's backend.

    XLA:CPU runs each computation inline, on the calling thread, instead of handing it to
    another thread and returning a future: an actor calls its small jitted policy once per
    vector step and reads the result at once, so the hand-off overlaps nothing and only
    costs CPU, in every actor process. The launcher's XLA_FLAGS (tianjax.launch.supervisor)
    size the thread pools; this setting has no environment variable in JAX, so the actor's
    own entry point makes it. The learner keeps JAX's default: its update overlaps the
    receiver and publisher threads."""
    import jax

    jax.config.update("jax_cpu_enable_async_dispatch", False)


def await_turn() -> str:
    """A warm standby's wait (`--standby`; runtime.standby_actors, runtime.standby_learner):
    built and compiled, it reads its standard input until the launcher writes a line (its
    turn: it goes on as the actor or learner it was started for; the line is returned) or
    closes it (not needed: it exits 0). Until then a SIGTERM ends it at once (it holds
    nothing: no socket, no file of the run)."""
    from tianjax.runtime.process import shutdown

    if shutdown.requested.is_set():  # told to stop while it was starting
        sys.exit(143)
    handler = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    line = sys.stdin.readline()
    if not line:
        sys.exit(0)
    signal.signal(signal.SIGTERM, handler)
    return line


def _run_actor(args, raw_config: dict) -> int:
    from tianjax.envs.host_api import ACTOR_INDEX_ENV

    actor_jax()
    os.environ[ACTOR_INDEX_ENV] = str(args.actor_id)  # which actor this process's envs serve
    from tianjax.config import load_config
    from tianjax.runtime.actor.actor import Actor
    from tianjax.runtime.process import compile_cache
    from tianjax.transport.auth import load_key

    try:
        config = load_config(raw_config)
        # every actor compiles the same policy: load it from a cache unless told not to
        compile_cache.enable(config.compile_cache, default=compile_cache.DEFAULT)
        actor = Actor(
            config,
            args.actor_id,
            json.loads(args.endpoints_json),
            load_key(),
            before_connecting=await_turn if args.standby else None,
        )
    except Exception as e:  # noqa: BLE001 (whatever stops the start-up stops it every time)
        return _startup_failed(args, e)
    _say_devices(f"actor {args.actor_id}")
    return actor.run()


def _say_devices(who: str) -> None:
    """One line in the process's log: the device it was placed on and what JAX sees."""
    import jax

    from tianjax.launch.placement import DEVICE_ENV

    placed = os.environ.get(DEVICE_ENV, os.environ.get("JAX_PLATFORMS", "default"))
    seen = ", ".join(f"{d.platform}:{d.id}" for d in jax.local_devices())
    print(f"tianjax: {who} on {placed}; JAX sees {seen}", file=sys.stderr, flush=True)


# The evaluator's niceness once it is ready: on a machine whose cores the learner and the
# actors keep busy, evaluating yields to training (an evaluation is of a pinned version:
# late, it is still that version's). Its start-up (imports, env, compilation) is not niced:
# it runs while the learner compiles, and a niced one dragged on into training.
EVALUATOR_NICE = 10


def _run_evaluator(args, raw_config: dict) -> int:
    """The evaluator of a sync or async run (tianjax.runtime.evaluation.evaluator): set up
    as an actor is (synchronous dispatch, the compile cache), at a lower priority once ready."""
    actor_jax()
    from tianjax.config import load_config
    from tianjax.runtime.evaluation.evaluator import Evaluator
    from tianjax.runtime.process import compile_cache
    from tianjax.transport.auth import load_key

    try:
        config = load_config(raw_config)
        compile_cache.enable(config.compile_cache, default=compile_cache.DEFAULT)
        evaluator = Evaluator(config, json.loads(args.endpoints_json), load_key(), args.run_dir)
    except Exception as e:  # noqa: BLE001 (whatever stops the start-up stops it every time)
        return _startup_failed(args, e)
    _say_devices("evaluator")
    try:
        os.nice(EVALUATOR_NICE)
    except OSError:
        pass
    return evaluator.run()


def _run_learner(args, config) -> int:
    """A learner process under a supervising launcher: it binds (the given endpoints, or
    free ports it reports), trains, reports silent actors as events, checkpoints, and
    writes its result for the launcher. A SIGTERM ends it with a final checkpoint.

    `--standby` (runtime.standby_learner): it first builds and compiles its update, then
    waits for its turn (await_turn), whose line is JSON naming the run directory to resume
    from ({"resume": null}: from the start); only then does it bind and read a checkpoint."""
    import dataclasses
    import time

    from tianjax.metrics import Progress, RunLogger
    from tianjax.runtime.learner.learner import Learner
    from tianjax.runtime.learner.prepared import prepare
    from tianjax.transport.auth import load_key

    prepared = None
    if args.standby:
        prepared = prepare(config)
        prepared.compile()
        turn = json.loads(await_turn())
        config = dataclasses.replace(config, resume=turn["resume"])
    t_start = time.perf_counter()
    if args.started_at is not None:  # the run began before this process (learner groups)
        t_start -= max(time.time() - args.started_at, 0.0)
    logger = RunLogger(config, args.run_dir, tensorboard=True)
    group = name = None
    if args.group is not None:
        from tianjax.runtime.groups.sync import GroupPlace

        group = GroupPlace(args.group, json.loads(args.averager_json))
        name = f"group {args.group}/{config.groups.count}"
    progress = Progress(
        config.total_env_steps, desc=f"{config.algo} {config.env} [{config.mode}]", name=name
    )
    endpoints = json.loads(args.endpoints_json) if args.endpoints_json else None
    listen_fds = json.loads(args.listen_fds_json) if args.listen_fds_json else None
    learner = Learner(
        config,
        load_key(),
        logger,
        progress,
        endpoints=endpoints,
        listen_fds=listen_fds,
        ipc_dir=args.ipc_dir,
        group=group,
        prepared=prepared,
    )
    _event("endpoints", endpoints=learner.endpoints)

    def should_stop() -> bool:
        silent = learner.silent_actors(time.perf_counter())
        for i in silent:
            learner.forget_actor(i)
        if silent:
            _event("silent", actors=silent)
        return False

    ended = False
    try:
        out = learner.run(should_stop, t_start=t_start)  # (an interrupt returns too)
        ended = True
    finally:
        # NOTE: the actors hear "stop" only when the run ends, finished or interrupted,
        # never when this learner dies of an exception (a full disk at a checkpoint, an
        # XLA out-of-memory, a stall): then the launcher starts another learner, and the
        # same actors follow it (they register with its incarnation when its parameters
        # arrive); if it gives up instead, it stops them itself. The alternative, a
        # supervisor that keeps actors alive through a restart, would have to tell an
        # actor told to stop (exit 0, as at the run's end) from one that should go on,
        # and would pay every actor's start-up again; this way no actor is asked to stop
        # when it should not.
        if ended:
            learner.stop_actors()
        learner.close()
        progress.close()
        logger.close(failing=sys.exception())  # the error this learner dies of, if any
    from tianjax.metrics.logger import write_json_atomic

    write_json_atomic(os.path.join(args.run_dir, "learner_result.json"), out.to_json())
    return 143 if out.interrupted else 0


def _run_averager(args, config) -> int:
    """The averager of learner groups under a supervising launcher: it binds (the given
    endpoints, or free ports it reports), resumes from its own checkpoint if it has one,
    and writes its summary when it ends (every group done, or SIGTERM)."""
    from tianjax.runtime.groups.averager import Averager
    from tianjax.transport.auth import load_key

    endpoints = json.loads(args.endpoints_json) if args.endpoints_json else None
    listen_fds = json.loads(args.listen_fds_json) if args.listen_fds_json else None
    averager = Averager(
        config,
        load_key(),
        args.run_dir,
        endpoints=endpoints,
        listen_fds=listen_fds,
        resume_dir=args.resume_dir,
    )
    _event("endpoints", endpoints=averager.endpoints, round=averager.round)
    summary = None
    try:
        summary = averager.run()
    finally:
        averager.close(summary)
    return 143 if summary["interrupted"] else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="tianjax-role")
    ap.add_argument("role", choices=["actor", "learner", "evaluator", "averager"])
    ap.add_argument("--actor-id", type=int)
    ap.add_argument("--config-json", required=True)
    ap.add_argument("--endpoints-json")
    ap.add_argument(
        "--run-dir", help="learner, evaluator: the run directory (metrics, checkpoints, videos)"
    )
    ap.add_argument(
        "--listen-fds-json",
        help="learner: listening sockets held by the launcher "
        "(channel -> inherited descriptor), for --endpoints-json",
    )
    ap.add_argument("--ipc-dir", help="learner: the launcher's private directory for ipc sockets")
    ap.add_argument("--parent-pid", type=int, help="the launcher's pid: exit if it is gone")
    ap.add_argument(
        "--standby",
        action="store_true",
        help="actor, learner: get ready (imports, envs, compilation), then wait for a line on "
        "standard input before connecting (a learner's: JSON naming the run to resume)",
    )
    ap.add_argument("--group", type=int, help="learner: the learner group it is (groups.count > 1)")
    ap.add_argument("--averager-json", help="learner of a group: the averager's endpoints")
    ap.add_argument("--resume-dir", help="averager: the run resumed's averager directory")
    ap.add_argument(
        "--started-at", type=float, help="learner: when the run began (time.time()), its clock's 0"
    )
    args = ap.parse_args(argv)
    _die_with_parent(args.parent_pid)

    def terminate(signum, frame):
        from tianjax.runtime.process import shutdown

        shutdown.request()

    if args.role != "actor":
        signal.signal(signal.SIGTERM, terminate)
        signal.signal(signal.SIGINT, terminate)  # Ctrl-C reaches the whole process group
    else:
        signal.signal(signal.SIGTERM, stop_actor)
    faulthandler.register(
        signal.SIGUSR1, all_threads=True
    )  # `kill -USR1 PID`: every thread's stack

    from tianjax.config import load_config
    from tianjax.runtime.process import compile_cache

    try:
        if args.role == "actor":
            return _run_actor(args, json.loads(args.config_json))
        if args.role == "evaluator":
            return _run_evaluator(args, json.loads(args.config_json))
        config = load_config(json.loads(args.config_json))
        compile_cache.enable(config.compile_cache)
        if args.role == "averager":
            return _run_averager(args, config)
        return _run_learner(args, config)
    except KeyboardInterrupt:
        return 130 if args.role == "actor" else 143
    except Exception as e:
        # NOTE: the launcher's line on this learner's exit says why: after a full disk or a
        # descriptor limit this process's stderr passes only tianjax's own lines
        # (tianjax.checkpoint.failures.HeldStderr), so the traceback below is not shown
        if args.role != "actor":
            _event("failed", error=_why(e))
        raise


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["EVALUATOR_NICE", "STARTUP_FAILED", "actor_jax", "await_turn", "main", "stop_actor"]
