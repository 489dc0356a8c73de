"""Multi-host roles: `tianjax launch --role learner|actor CONFIG ...`, one process per command.

Learner processes call `jax.distributed.initialize` (an explicit coordinator address,
process count and id, or the cluster's auto-detection, e.g. SLURM) and form one global
mesh; the update is data-parallel over it, gradients are all-reduced by XLA, and the
parameters stay identical on every learner process. Learner process i binds three ports,
`base_port + 3 i` (parameters), `+1` (trajectories), `+2` (control), on `bind_host`
(loopback unless set). Actor k connects, over tcp, to learner `k mod num_learners`.

The per-run key comes from `--key-file` or the TIANJAX_RUN_KEY environment variable, the
same on every process; it is never printed.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

from tianjax.config import Config, ConfigError


def _terminate(signum, frame):
    from tianjax.runtime import shutdown

    shutdown.request()


def learner_endpoints(host: str, base_port: int, index: int) -> dict:
    p = base_port + 3 * index
    return {"params": f"tcp://{host}:{p}", "traj": f"tcp://{host}:{p + 1}", "control": f"tcp://{host}:{p + 2}"}


def _key(key_file: str | None):
    from tianjax.transport.auth import KEY_ENV, load_key

    if key_file is None and not os.environ.get(KEY_ENV):
        raise ConfigError(f"launch: no run key: pass --key-file FILE or set {KEY_ENV} (the same on every process)")
    return load_key(key_file)


def run_learner(config: Config, *, coordinator: str | None, num_processes: int | None,
                process_id: int | None, bind_host: str, base_port: int, key_file: str | None) -> int:
    import jax

    from tianjax.runtime import compile_cache

    compile_cache.enable(config.compile_cache)
    run_key = _key(key_file)
    if coordinator is not None or num_processes is not None:
        if coordinator is None or num_processes is None or process_id is None:
            raise ConfigError("launch: --coordinator, --num-processes and --process-id go together")
        jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                                   process_id=process_id)
    else:
        jax.distributed.initialize()  # cluster auto-detection (SLURM, ...)
    index = jax.process_index()
    # NOTE: set after jax.distributed.initialize, which installs its own SIGTERM handling
    signal.signal(signal.SIGTERM, _terminate)
    from tianjax.metrics import Progress, RunLogger, format_summary
    from tianjax.runtime.learner import Learner, save_params

    run_dir = os.path.join(config.run_dir or "runs/multihost", f"learner-{index}")
    logger = RunLogger(config, run_dir)
    progress = Progress(config.total_env_steps, enabled=False if index else None,
                        desc=f"learner {index}/{jax.process_count()}")
    # every learner process writes (its shards of) the same checkpoints: the run's root
    learner = Learner(config, run_key, logger, progress,
                      endpoints=learner_endpoints(bind_host, base_port, index),
                      checkpoint_root=os.path.dirname(logger.run_dir))
    print(f"tianjax: learner {index}/{jax.process_count()} on {learner.mesh.devices.size} devices, "
          f"actors connect to {learner.endpoints['params'].rsplit(':', 1)[0]} ports "
          f"{base_port + 3 * index}-{base_port + 3 * index + 2}", flush=True)
    t0 = time.perf_counter()
    try:
        out = learner.run(t_start=t0)
    finally:
        learner.stop_actors()
        learner.close()
        progress.close()
    save_params(os.path.join(logger.run_dir, "final_params.npz"), out["params"])
    summary = {"mode": config.mode, "algo": config.algo, "env": config.env,
               "process_index": index, "process_count": jax.process_count(),
               **{k: out[k] for k in ("env_steps", "updates", "env_steps_per_s", "final_return",
                                      "convergence_time_s", "convergence_env_steps", "compile_time_s",
                                      "skipped_updates", "episodes")},
               "wall_time_s": time.perf_counter() - t0, "target_return": config.target_return,
               "interrupted": out.get("interrupted", False),
               **out["extra_summary"]}
    summary = logger.write_summary(summary)
    logger.close()
    print(format_summary(summary), flush=True)
    jax.distributed.shutdown()
    return 130 if out.get("interrupted") else 0


def run_actor(config: Config, *, actor_id: int, learner_host: str, base_port: int, num_learners: int,
              key_file: str | None) -> int:
    """Runs actor `actor_id` as a supervised child process: restarted when it dies, up to
    `runtime.max_actor_restarts` times, until the learner tells it to stop (exit code 0)."""
    from tianjax.runtime.supervisor import ActorSupervisor

    run_key = _key(key_file)
    endpoints = learner_endpoints(learner_host, base_port, actor_id % num_learners)
    print(f"tianjax: actor {actor_id} -> {json.dumps(endpoints)}", flush=True)
    sup = ActorSupervisor(config, endpoints, run_key)
    signal.signal(signal.SIGTERM, _terminate)
    try:
        sup.start(actor_id)
        while True:
            time.sleep(0.2)
            changes = sup.check()
            for i, why in changes.restarted.items():
                print(f"tianjax: warning: actor {i} ({why}) restarted "
                      f"({sup.restarts[i]}/{config.runtime.max_actor_restarts})", file=sys.stderr, flush=True)
            if changes.lost:
                why = changes.lost[actor_id]
                print(f"tianjax: error: actor {actor_id} ({why}) is out of restarts", file=sys.stderr, flush=True)
                return 1
            if not sup.procs:  # it exited 0: told to stop by the learner
                return 0
    except KeyboardInterrupt:
        return 143
    finally:
        sup.stop(grace_s=2.0)
