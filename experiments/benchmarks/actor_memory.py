"""Memory, threads and descriptors per actor process, and the learner's, as actors are added.

    python experiments/benchmarks/actor_memory.py [--actors 8 16 32]
        [--config configs/ppo_latency_async.yaml] [--steps 200000] [key=value ...]

Runs `tianjax train CONFIG num_actors=N` as a user would, and samples every process of the
run with psutil twice a second while it trains (after every actor has registered and
compiled: the samples taken once the first metrics record is written). Per actor process:
RSS (resident pages, shared libraries counted in every process), PSS (each shared page
split between the processes that map it: what N actors cost together is N x PSS) and USS
(pages only this process holds), threads and open descriptors; per learner process the
same, to show what grows with N. Also the run's own figures: learner CPU seconds per
trajectory received, trajectories received against admitted (nothing lost or counted
twice), and the summary's actor wait fractions.

Medians over the samples of each process, then the median (and max) over the actors.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import psutil

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MIB = 2**20


def _is_actor(p: psutil.Process) -> bool:
    try:
        cmd = p.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
    return "tianjax.launch.role" in cmd and "actor" in cmd


def _sample(p: psutil.Process) -> dict | None:
    try:
        with p.oneshot():
            full = p.memory_full_info()
            return {
                "rss": full.rss / MIB,
                "pss": full.pss / MIB,
                "uss": full.uss / MIB,
                "threads": p.num_threads(),
                "fds": p.num_fds(),
            }
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def measure(config: str, n: int, steps: int, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as d:
        run_dir = os.path.join(d, "run")
        cmd = [
            sys.executable,
            "-m",
            "tianjax.cli",
            "train",
            config,
            f"num_actors={n}",
            f"total_env_steps={steps}",
            f"run_dir={run_dir}",
            "target_return=null",
            *extra,
        ]
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT
        )
        learner = psutil.Process(proc.pid)
        actors: dict[int, list[dict]] = {}
        mine: list[dict] = []
        metrics = os.path.join(run_dir, "metrics.jsonl")
        while proc.poll() is None:
            time.sleep(0.5)
            if not os.path.exists(metrics) or os.path.getsize(metrics) == 0:
                continue  # still starting: imports, compilation, registration
            try:
                children = learner.children(recursive=True)
            except psutil.NoSuchProcess:
                break
            for c in children:
                if _is_actor(c) and (s := _sample(c)) is not None:
                    actors.setdefault(c.pid, []).append(s)
            if (s := _sample(learner)) is not None:
                mine.append(s)
        proc.wait()
        with open(os.path.join(run_dir, "summary.json")) as f:
            summary = json.load(f)
    per_actor = {
        pid: {k: statistics.median(x[k] for x in xs) for k in xs[0]}
        for pid, xs in actors.items()
        if xs
    }
    from tianjax.config import load_config

    c = load_config(config, [f"num_actors={n}", *extra])
    return {
        "n": n,
        "traj_steps": c.num_envs * c.rollout_len,
        "actors_sampled": len(per_actor),
        "per_actor": list(per_actor.values()),
        "learner": {k: max(x[k] for x in mine) for k in mine[0]} if mine else {},
        "summary": summary,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--actors", type=int, nargs="+", default=[8, 16, 32])
    ap.add_argument("--config", default="configs/ppo_latency_async.yaml")
    ap.add_argument("--steps", type=int, default=200_000)
    ap.add_argument("overrides", nargs="*", help="more key=value overrides for every run")
    args = ap.parse_args()
    rows = [measure(args.config, n, args.steps, args.overrides) for n in args.actors]
    print(
        f"\n{args.config}, {args.steps:,} env steps per run; MiB and counts per process while training "
        "(actors: median over actors of each one's median, [max]; learner: its max)"
    )
    print(
        f"{'actors':>6}{'sampled':>8}{'RSS':>14}{'PSS':>14}{'USS':>14}{'threads':>9}{'fds':>6}"
        f"{'learner RSS':>13}{'thr':>5}{'fds':>6}{'cpu ms/traj':>12}{'received':>9}{'admitted':>9}"
        f"{'wait':>6}{'busy':>6}"
    )
    for r in rows:
        a, lr, s = r["per_actor"], r["learner"], r["summary"]

        def col(k, spec=".0f"):
            vals = [x[k] for x in a]
            return f"{statistics.median(vals):{spec}} [{max(vals):{spec}}]" if vals else "-"

        traj = s.get("trajectories_received") or 0
        admitted = s["env_steps"] // r["traj_steps"]
        cpu = s.get("learner_cpu_s")
        print(
            f"{r['n']:>6}{r['actors_sampled']:>8}{col('rss'):>14}{col('pss'):>14}{col('uss'):>14}"
            f"{col('threads', '.0f'):>9}{statistics.median(x['fds'] for x in a) if a else 0:>6.0f}"
            f"{lr.get('rss', 0):>13.0f}{lr.get('threads', 0):>5}{lr.get('fds', 0):>6}"
            f"{1e3 * cpu / traj if cpu and traj else float('nan'):>12.2f}{traj:>9}"
            f"{admitted:>9}"
            f"{s.get('actor_wait_fraction', float('nan')):>6.2f}{s.get('learner_busy_fraction', 0):>6.2f}"
        )


if __name__ == "__main__":
    main()
