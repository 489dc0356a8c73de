"""Command line: `tianjax train CONFIG [key=value ...]`, `tianjax configs`, `tianjax show
CONFIG`, `tianjax launch ...`, `tianjax eval RUN_DIR`, `tianjax report RUN_DIR [RUN_DIR ...]`,
`tianjax sweep CONFIG key=v1,v2 ...`, `tianjax replay RUN_DIR`.

Every bad input (unknown key, wrong type, missing file, bad env id, impossible sizes) ends
with a one-line message and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import sys

from tianjax.errors import ReplayRefused, RunFailed


def _sigterm(signum, frame):
    # unwind like Ctrl-C, so every role's cleanup (stop actors, close sockets, a final
    # checkpoint) runs; the flag covers the case where the exception is swallowed, or
    # deferred out of a critical section (see tianjax.runtime.process.shutdown)
    from tianjax.runtime.process import shutdown

    shutdown.request(signal.Signals(signum).name)


def _own_compile_cache() -> None:
    """A process of our own: re-runs (and the actors it starts) load their programs from the
    compile cache unless the config or the variable names another directory, or none (false, "off")."""
    from tianjax.runtime.process import compile_cache

    os.environ.setdefault(compile_cache.ENV, compile_cache.DEFAULT)


def _train(args) -> int:
    if args.dry_run:
        return _dry_run(args)
    from tianjax.train import train

    _own_compile_cache()
    result = train(args.config, args.overrides, progress=None if not args.no_progress else False)
    if result.summary.get("interrupted"):
        print(
            "tianjax: interrupted; the run directory has its summary and a final checkpoint "
            f"(continue with resume={result.run_dir})",
            file=sys.stderr,
        )
        return 130
    return 0


def _dry_run(args) -> int:
    from tianjax.config import load_config
    from tianjax.runtime.runners.dryrun import dry_run

    print(dry_run(load_config(args.config, args.overrides)).text(), flush=True)
    return 0


def _configs(args) -> int:
    """One line per shipped config: name, mode, algorithm, env, and the extra it needs."""
    import importlib.util

    from tianjax.config import library
    from tianjax.runtime.runners.preflight import BACKEND_EXTRAS

    infos = [library.describe(n) for n in library.names()]
    width = max((len(i.name) for i in infos), default=10)
    for i in infos:
        env = f"{i.env} ({i.env_backend})"
        module, extra = BACKEND_EXTRAS.get(i.env_backend, (None, None))
        need = ""
        if module is not None and importlib.util.find_spec(module) is None:
            need = f"  needs .[{extra}]"
        print(f"{i.name:<{width}}  {i.mode:<5}  {i.algo:<6}  {env}{need}")
    print(
        f"({len(infos)} configs in {library.configs_dir()}; `tianjax show NAME` prints one, "
        "`tianjax train NAME` trains it)",
        file=sys.stderr,
    )
    return 0


def _show(args) -> int:
    from tianjax.config import load_config
    from tianjax.config.describe import render
    from tianjax.config.library import resolve

    path = resolve(args.config)
    config = load_config(path, args.overrides)
    with open(path) as f:
        text = f.read()
    header = f"{args.config}" + (f" with {' '.join(args.overrides)}" if args.overrides else "")
    header += "\nthe resolved config: only the sections this run reads (--all: every section)"
    print(render(config, read_only=not args.all, header=header, source_text=text), end="")
    return 0


def _launch(args) -> int:
    from tianjax.config import load_config
    from tianjax.runtime.runners import multihost, preflight

    config = load_config(args.config, args.overrides)
    if config.mode == "fused":
        from tianjax.config import ConfigError

        raise ConfigError("config key 'mode': a multi-host launch runs mode sync or async")
    preflight.check(config)  # before anything is written or bound
    if args.groups is not None:
        import dataclasses

        from tianjax.config import GroupsConfig

        groups = dataclasses.asdict(config.groups) | {"count": args.groups}
        config = dataclasses.replace(config, groups=GroupsConfig(**groups))
    if args.role is None:
        return _launch_slurm(args, config)
    if config.groups.enabled and args.role in ("learner", "averager"):
        return _launch_group_role(args, config)
    if args.role == "averager":
        from tianjax.config import ConfigError

        raise ConfigError("launch: --role averager is for learner groups (groups.count > 1)")
    if args.role == "learner":
        return multihost.run_learner(
            config,
            coordinator=args.coordinator,
            num_processes=args.num_processes,
            process_id=args.process_id,
            bind_host=args.bind_host or "127.0.0.1",
            base_port=args.base_port,
            key_file=args.key_file,
        )
    if args.actor_id is None:
        from tianjax.config import ConfigError

        raise ConfigError("launch: --role actor needs --actor-id")
    return multihost.run_actor(
        config,
        actor_id=args.actor_id,
        learner_host=args.learner_host,
        base_port=args.base_port,
        num_learners=args.num_learners,
        key_file=args.key_file,
    )


def _launch_group_role(args, config) -> int:
    """A role of a learner-groups run across hosts (tianjax/runtime/runners/group_roles.py)."""
    from tianjax.config import ConfigError
    from tianjax.runtime.runners import group_roles

    if args.role == "averager":
        return group_roles.run_averager(
            config,
            bind_host=args.bind_host or "127.0.0.1",
            base_port=args.base_port,
            key_file=args.key_file,
        )
    if args.group is None:
        raise ConfigError(
            f"launch: a learner of groups.count={config.groups.count} groups needs --group "
            f"(0-{config.groups.count - 1})"
        )
    return group_roles.run_group_learner(
        config,
        group=args.group,
        bind_host=args.bind_host or "127.0.0.1",
        base_port=args.base_port,
        averager_host=args.averager_host,
        key_file=args.key_file,
    )


def _launch_slurm(args, config) -> int:
    """`srun tianjax launch CONFIG ...`: this task's role from the SLURM environment
    (tianjax/launch/slurm.py), then the same learner or actor as `--role` starts."""
    import dataclasses
    import socket

    from tianjax.launch import slurm
    from tianjax.runtime.runners import multihost

    task = slurm.slurm_task(os.environ)
    if config.groups.enabled:
        return _launch_slurm_groups(args, config, task)
    role = slurm.role_of(task, args.learners)
    root = config.run_dir or os.path.join("runs", f"slurm-{task.job.split('.')[0]}")
    key_file = args.key_file or os.path.join(root, f"run-{task.job}.key")
    config = dataclasses.replace(
        config,
        run_dir=root,
        num_actors=role.actors_per_learner,
        total_env_steps=config.total_env_steps // role.num_learners,
    )
    if task.rank == 0 and args.key_file is None:
        slurm.write_key_file(key_file)
    else:
        slurm.wait_for_key_file(key_file, config.runtime.connect_timeout_s)
    what = (
        f"learner {role.index}/{role.num_learners}"
        if role.role == "learner"
        else f"actor {role.index} (of learner {role.index % role.num_learners} on {role.learner_host})"
    )
    print(
        f"tianjax: SLURM task {task.rank}/{task.ntasks} on {task.host}: {what}; {role.actors_per_learner} "
        f"actors and {config.total_env_steps:,} env steps per learner",
        flush=True,
    )
    if role.role == "learner":
        port = args.coordinator_port or args.base_port + 3 * role.num_learners
        return multihost.run_learner(
            config,
            coordinator=f"{socket.gethostbyname(role.coordinator_host)}:{port}",
            num_processes=role.num_learners,
            process_id=role.index,
            bind_host=args.bind_host or socket.gethostbyname(role.learner_host),
            base_port=args.base_port,
            key_file=key_file,
        )
    return multihost.run_actor(
        config,
        actor_id=role.index,
        learner_host=socket.gethostbyname(role.learner_host),
        base_port=args.base_port,
        num_learners=role.num_learners,
        key_file=key_file,
    )


def _launch_slurm_groups(args, config, task) -> int:
    """`srun tianjax launch CONFIG --groups G`: tasks 0..G-1 are the groups' learners, task
    G the averager, the rest the actors (tianjax/launch/slurm.py role_of_groups)."""
    import dataclasses
    import socket

    from tianjax.launch import slurm
    from tianjax.runtime.runners import group_roles, multihost

    role = slurm.role_of_groups(task, config.groups.count)
    root = config.run_dir or os.path.join("runs", f"slurm-{task.job.split('.')[0]}")
    key_file = args.key_file or os.path.join(root, f"run-{task.job}.key")
    config = dataclasses.replace(config, run_dir=root, num_actors=role.num_actors)
    if task.rank == 0 and args.key_file is None:
        slurm.write_key_file(key_file)
    else:
        slurm.wait_for_key_file(key_file, config.runtime.connect_timeout_s)
    g = config.groups.count
    what = {
        "learner": f"the learner of group {role.index}/{g}",
        "averager": f"the averager of {g} groups",
        "actor": f"actor {role.index} (of group {role.index % g} on {role.learner_host})",
    }[role.role]
    print(
        f"tianjax: SLURM task {task.rank}/{task.ntasks} on {task.host}: {what}; "
        f"{role.num_actors // g} actors and {config.total_env_steps // g:,} env steps per group",
        flush=True,
    )
    if role.role == "averager":
        return group_roles.run_averager(
            config,
            bind_host=args.bind_host or socket.gethostbyname(task.host),
            base_port=args.base_port,
            key_file=key_file,
        )
    if role.role == "learner":
        return group_roles.run_group_learner(
            config,
            group=role.index,
            bind_host=args.bind_host or socket.gethostbyname(task.host),
            base_port=args.base_port,
            averager_host=socket.gethostbyname(role.averager_host),
            key_file=key_file,
        )
    return multihost.run_actor(
        config,
        actor_id=role.index,
        learner_host=socket.gethostbyname(role.learner_host),
        base_port=args.base_port,
        num_learners=g,
        key_file=key_file,
    )


def _report(args) -> int:
    from tianjax.metrics.report import ReportError, write_report

    try:
        report = write_report(args.run_dirs, args.out)
    except ReportError as e:
        print(f"tianjax: error: {e}", file=sys.stderr)
        return 2
    print(f"report: {report.markdown} ({len(report.rows)} runs, {len(report.figures)} figures)")
    for note in report.notes:
        print(f"tianjax: note: {note[2:]}", file=sys.stderr)
    return 0


def _eval(args) -> int:
    from tianjax.config import ConfigError
    from tianjax.config import parse_override as parse
    from tianjax.runtime.record.saved_runs import evaluate_run

    opts = {"episodes": 10, "greedy": True, "seed": None}
    for text in args.options:
        path, value = parse(text)
        key = ".".join(path)
        if key not in opts:
            raise ConfigError(f"eval option '{key}': unknown (known: {sorted(opts)})")
        if (
            key == "greedy"
            and not isinstance(value, bool)
            or key != "greedy"
            and (not isinstance(value, int) or isinstance(value, bool))
        ):
            raise ConfigError(f"eval option '{key}': got {value!r}")
        opts[key] = value
    result = evaluate_run(args.path, **opts)
    print(result.line(), flush=True)
    return 0


def _replay(args) -> int:
    from tianjax.runtime.runners.rerun import replay_run

    try:
        outcome = replay_run(args.run_dir)
    except ReplayRefused as e:
        print(f"tianjax: cannot replay {args.run_dir}: {e}", file=sys.stderr, flush=True)
        return 2
    print(outcome.line(), flush=True)
    return 0 if outcome.equal else 1


_KEYS_EPILOG = (
    "CONFIG is a shipped config's name (`tianjax configs` lists them) or a YAML file. "
    "Every key, with its value and what it does: `tianjax show CONFIG [key=value ...]`. "
    "Common ones: total_env_steps, seed, mode (fused|sync|async), num_actors, num_envs, "
    "rollout_len, run_dir, loggers, ppo.lr, staleness.schedule."
)


def _add_info_commands(sub) -> None:
    c = sub.add_parser("configs", help="list the shipped configs, one line each")
    c.set_defaults(handler=_configs)
    s = sub.add_parser(
        "show",
        help="print a resolved config with each key's comment: tianjax show CONFIG [key=value ...]",
        epilog=_KEYS_EPILOG,
    )
    s.add_argument("config", help="a shipped config's name or a YAML file")
    s.add_argument("overrides", nargs="*", help="dotted overrides, e.g. ppo.lr=1e-3 num_envs=8")
    s.add_argument(
        "--all", action="store_true", help="every section, also those this run does not read"
    )
    s.set_defaults(handler=_show)


def _add_sweep(sub) -> None:
    s = sub.add_parser(
        "sweep",
        help="a grid of fused runs in as few programs as shapes allow: "
        "tianjax sweep CONFIG ppo.lr=1e-3,3e-3 num_seeds=4",
    )
    s.add_argument("config", help="a fused config (YAML)")
    s.add_argument(
        "assignments",
        nargs="*",
        metavar="key=v1,v2,...",
        help="a comma-separated value list is a grid axis; a single value overrides every point",
    )
    s.add_argument("--out", help="the sweep directory (default runs/<algo>_<env>_sweep_<time>)")


def _sweep(args) -> int:
    from tianjax.runtime.runners.sweep import run_sweep, use_cpu_cores

    use_cpu_cores()  # a CPU host's cores as devices, each running its share of the points
    _own_compile_cache()
    run_sweep(args.config, args.assignments, out=args.out)
    return 0


def main(argv=None) -> int:
    from tianjax._version import __version__

    parser = argparse.ArgumentParser(
        prog="tianjax", description="Fast distributed RL training in JAX."
    )
    parser.add_argument("--version", action="version", version=f"tianjax {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "train", help="train a config: tianjax train CONFIG [key=value ...]", epilog=_KEYS_EPILOG
    )
    p.add_argument("config", help="a shipped config's name (tianjax configs) or a YAML file")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. ppo.lr=1e-3 num_envs=8")
    p.add_argument("--no-progress", action="store_true", help="no live progress bar")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="check everything and build the env and network, without training or writing",
    )
    _add_info_commands(sub)
    q = sub.add_parser(
        "launch",
        help="run one role of a multi-host run (without --role: each task of "
        "`srun tianjax launch CONFIG` finds its own; docs/multihost.md)",
    )
    q.add_argument(
        "--role",
        choices=["learner", "actor", "averager"],
        help="this process's role (omit under srun: from SLURM_PROCID, SLURM_NTASKS and the "
        "node list); averager: that of learner groups (groups.count > 1)",
    )
    q.add_argument("config")
    q.add_argument("overrides", nargs="*")
    q.add_argument(
        "--coordinator", help="learner 0's host:port for jax.distributed (omit: auto-detect)"
    )
    q.add_argument("--num-processes", type=int, help="learner processes in the run")
    q.add_argument("--process-id", type=int, help="this learner's index")
    q.add_argument(
        "--bind-host",
        help="learner: interface to bind (default loopback; under srun: the "
        "learner's host address)",
    )
    q.add_argument("--learner-host", default="127.0.0.1", help="actor: host of the learners")
    q.add_argument(
        "--num-learners", type=int, default=1, help="actor: learner processes to spread over"
    )
    q.add_argument(
        "--base-port", type=int, default=5555, help="learner i uses base+3i .. base+3i+2"
    )
    q.add_argument("--actor-id", type=int)
    q.add_argument(
        "--key-file",
        help="the run key (hex); default: $TIANJAX_RUN_KEY (under srun: a file task 0 "
        "writes, RUN_DIR/run-<job>.<step>.key)",
    )
    q.add_argument(
        "--learners",
        type=int,
        default=1,
        help="under srun: the first N tasks are learners, the rest actors (default 1)",
    )
    q.add_argument(
        "--group", type=int, help="learner groups: the group this learner is (0 .. count - 1)"
    )
    q.add_argument(
        "--averager-host",
        default="127.0.0.1",
        help="learner groups: the averager's host (its ports: base + 3 x groups, + 1)",
    )
    q.add_argument(
        "--groups",
        type=int,
        help="learner groups (sets groups.count); under srun: tasks 0..G-1 are the groups' "
        "learners, task G the averager, the rest actors",
    )
    q.add_argument(
        "--coordinator-port",
        type=int,
        help="under srun: jax.distributed's port on task 0's host "
        "(default base_port + 3 x learners)",
    )
    e = sub.add_parser(
        "eval", help="play a trained policy: tianjax eval RUN_DIR_OR_CHECKPOINT [episodes=N]"
    )
    e.add_argument(
        "path",
        metavar="RUN_DIR_OR_CHECKPOINT",
        help="a run directory (its newest checkpoint) or RUN_DIR/checkpoints/STEP",
    )
    e.add_argument(
        "options", nargs="*", help="episodes=N (default 10), greedy=false (sample), seed=S"
    )
    r = sub.add_parser(
        "report", help="plots and a summary table of runs: tianjax report RUN_DIR ..."
    )
    r.add_argument(
        "run_dirs", nargs="*", metavar="RUN_DIR", help="run directories (as `train` writes them)"
    )
    r.add_argument(
        "--out",
        help="output directory (default: RUN_DIR/report for one run, "
        "reports/report_<time> for several)",
    )
    rp = sub.add_parser(
        "replay",
        help="redo an async run from its replay log in one process and compare its final "
        "parameters bit for bit: tianjax replay RUN_DIR (exit 0 equal, 1 different, 2 refused)",
    )
    rp.add_argument("run_dir", metavar="RUN_DIR", help="an async or sync run's directory")
    rp.set_defaults(handler=_replay)
    _add_sweep(sub)
    args, extra = parser.parse_known_args(argv)
    # overrides may follow an option (`train NAME --dry-run ppo.lr=1e-3`): argparse leaves those over
    if (
        extra
        and hasattr(args, "overrides")
        and all("=" in a and not a.startswith("-") for a in extra)
    ):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")

    from tianjax.checkpoint.store import CheckpointError
    from tianjax.config import ConfigError

    signal.signal(signal.SIGTERM, _sigterm)
    signal.signal(signal.SIGINT, _sigterm)  # Ctrl-C: the same orderly stop
    # `kill -USR1 PID` prints every thread's Python stack to stderr (a run that seems stuck)
    try:
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    except (ValueError, OSError, AttributeError):
        pass  # stderr is not a file (captured, as when main() runs inside another program)
    try:
        if getattr(args, "handler", None) is not None:
            return args.handler(args)
        if args.command == "train":
            return _train(args)
        if args.command == "launch":
            return _launch(args)
        if args.command == "report":
            return _report(args)
        if args.command == "eval":
            return _eval(args)
        if args.command == "sweep":
            return _sweep(args)
    except (ConfigError, CheckpointError) as e:
        print(f"tianjax: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tianjax: interrupted", file=sys.stderr)
        return 130
    except OSError as e:
        from tianjax.runtime.process.resources import describe_os_error

        line = describe_os_error(e)
        if line is None:
            raise
        print(f"tianjax: error: {line}", file=sys.stderr, flush=True)
        # NOTE: exit handlers (the TensorBoard writer's flush) would only fail again on
        # the same full disk or descriptor limit, with tracebacks: leave without them
        sys.stdout.flush()
        os._exit(1)
    except MemoryError as e:
        print(
            f"tianjax: error: out of memory ({e}); lower num_envs, rollout_len or the network size",
            file=sys.stderr,
        )
        return 1
    except (
        RunFailed
    ) as e:  # a run that cannot go on (an actor died in sync mode, no actor delivers)
        print(f"tianjax: error: {e}", file=sys.stderr)
        return 1
    except RuntimeError as e:
        if "RESOURCE_EXHAUSTED" in str(e):  # XLA could not allocate: sizes beyond this machine
            first = str(e).strip().splitlines()[0].rstrip(".")
            print(
                f"tianjax: error: {first}; lower num_envs, rollout_len or the network size",
                file=sys.stderr,
            )
            return 1
        raise
    return 1


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["main"]
