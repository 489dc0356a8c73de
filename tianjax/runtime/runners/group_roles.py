"""The roles of a learner-groups run across hosts, one process per command:
`tianjax launch --role averager | learner --group i CONFIG groups.count=G ...` (actors are
`tianjax launch --role actor` as in any multi-host run: tianjax.runtime.runners.multihost).

The config is the whole run's (tianjax.runtime.groups.shares): group i trains
num_actors / G actors for total_env_steps / G env steps, its actors are the ids i, i + G,
..., it listens on base_port + 3i .. + 2 (bound on --bind-host), and writes to
RUN_DIR/group-i. The averager listens on base_port + 3G (deltas) and + 1 (averages) on its
--bind-host and writes to RUN_DIR/averager; the groups reach it at --averager-host. No
jax.distributed and no collectives: a group never waits for another, and a lost one costs
its own share. Every process takes the run key from --key-file or TIANJAX_RUN_KEY;
connections use curve security unless the config says otherwise.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time

from tianjax.config import Config
from tianjax.runtime.groups import shares
from tianjax.runtime.runners.multihost import (
    launch_key,
    learner_endpoints,
    request_stop,
    with_security,
)


def averager_endpoints(host: str, base_port: int, count: int) -> dict:
    ports = shares.averager_ports(base_port, count)
    return {name: f"tcp://{host}:{port}" for name, port in ports.items()}


def run_group_learner(
    config: Config,
    *,
    group: int,
    bind_host: str,
    base_port: int,
    averager_host: str,
    key_file: str | None,
) -> int:
    from tianjax.metrics import Progress, RunLogger, format_summary
    from tianjax.runtime.groups.sync import GroupPlace
    from tianjax.runtime.learner.learner import Learner
    from tianjax.runtime.process import compile_cache
    from tianjax.runtime.runners.groups import group_summary

    compile_cache.enable(config.compile_cache)
    config = with_security(config)
    run_key = launch_key(key_file)
    count = config.groups.count
    root = config.run_dir or "runs/groups"
    gcfg = shares.group_config(_rooted(config, root), group)
    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    logger = RunLogger(gcfg, gcfg.run_dir)
    progress = Progress(gcfg.total_env_steps, name=f"group {group}/{count}")
    averager = averager_endpoints(averager_host, base_port, count)
    learner = Learner(
        gcfg,
        run_key,
        logger,
        progress,
        endpoints=learner_endpoints(bind_host, base_port, group),
        group=GroupPlace(group, averager),
    )
    ids = shares.group_actor_ids(group, count, gcfg.num_actors)
    hint = (
        f"--actor-id {', '.join(map(str, ids))} --learner-host <this host> --base-port {base_port}"
    )
    learner.watch.who = f"group {group}/{count}"
    learner.watch.hint = f"its actors with tianjax launch --role actor {hint}"
    print(
        f"tianjax: group {group}/{count} learner ({gcfg.runtime.security}): its actors are {hint} "
        f"(num_actors={config.num_actors} in the run, {gcfg.num_actors} per group); ports "
        f"{base_port + 3 * group}-{base_port + 3 * group + 2} on {bind_host}; the averager at "
        f"{averager['deltas']}",
        flush=True,
    )
    t0 = time.perf_counter()
    try:
        out = learner.run(t_start=t0)
    finally:
        learner.stop_actors()
        learner.close()
        progress.close()
    summary = group_summary(config, gcfg, group, out)
    summary = logger.write_summary(summary)
    logger.close()
    print(format_summary(summary), flush=True)
    return 130 if out.interrupted else 0


def _rooted(config: Config, root: str) -> Config:
    return dataclasses.replace(config, run_dir=root)


def run_averager(config: Config, *, bind_host: str, base_port: int, key_file: str | None) -> int:
    from tianjax.metrics import format_summary
    from tianjax.runtime.groups.averager import Averager

    config = with_security(config)
    shares.check_split(config)
    run_key = launch_key(key_file)
    count = config.groups.count
    root = config.run_dir or "runs/groups"
    resume = shares.averager_dir(config.resume) if config.resume else None
    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    averager = Averager(
        _rooted(config, root),
        run_key,
        shares.averager_dir(root),
        endpoints=averager_endpoints(bind_host, base_port, count),
        resume_dir=resume if resume and os.path.isdir(resume) else None,
    )
    print(
        f"tianjax: averager of {count} groups ({config.runtime.security}) at round "
        f"{averager.round}: deltas on port {shares.averager_ports(base_port, count)['deltas']}, "
        f"averages on {shares.averager_ports(base_port, count)['averages']}, on {bind_host}; "
        f"the groups start with --averager-host <this host> --base-port {base_port}",
        flush=True,
    )
    summary = None
    try:
        summary = averager.run()
    finally:
        averager.close(summary)
    print(format_summary(summary), flush=True)
    return 130 if summary["interrupted"] else 0


__all__ = ["averager_endpoints", "run_averager", "run_group_learner"]
