"""Learner groups against lock-step all-reduce and against one learner, on hosts made of
network namespaces (tianjax.launch.netns), with latency-bound actors.

    python experiments/studies/groups/groups.py [--rows slow samples link] [--repeats 2]
        [--out experiments/studies/groups/results/runs.jsonl]
    python experiments/studies/groups/groups.py --table experiments/studies/groups/results/runs.jsonl

PPO on tianjax/LatencyCartPole-v1 (configs/ppo_latency_async.yaml: 16 envs x 32 steps per
trajectory and actor, 16 ms mean vector steps with hiccups), 8 actors in all. Each row
alternates its two arms (A B A B ...) with seeds 0, 1, ...:

- slow: two groups of 4 actors (groups.count=2, every role its own command as
  docs/multihost.md writes it) against two lock-step learners of 4 actors each
  (jax.distributed, gradients all-reduced every minibatch step), group 1's (learner 1's)
  actors 3x slower (env_options.slow_actors: ids 1, 3, 5, 7). Host0 holds learner or group
  0 with its actors, host1 learner or group 1 with its, host2 the averager; curve
  security. Time to target: from launch to the first moment the moving average of the
  last 100 episodes of all 8 actors (both learners' records list their actors' episodes,
  with the time) reaches 475, then the run is stopped. Traffic between
  learners: the bytes host0 and host1 sent and received on their links (their actors are
  on their own hosts, so that is the learners' traffic: all-reduce and coordination, or
  deltas and averages), per update of a learner, from the run to the target.
- samples: env steps to 475 on one machine (`tianjax train ... stop_at_target=true`), two
  groups of 4 actors (every group's env steps when the moving average over every actor's
  episodes reaches 475) against one learner with the 8 actors.
- link: a 4.2 MB network (network.hidden=[1024, 1024]) and tc tbf at 100 Mbit/s on every
  link: one learner on host0 publishing its parameters after each update to 2 actors on
  host1, which send it their trajectories; the bytes/s on host0's link, both ways, over
  20 s of training, as a fraction of the link rate (12.5 MB/s).

Figures are ratios of arms measured alternating in the same run; seconds are reported
beside them. `--table` prints the medians of a results file.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, REPO)

from tianjax.launch import NamespaceCluster  # noqa: E402
from tianjax.metrics import read_metrics  # noqa: E402

CONFIG = os.path.join(REPO, "configs", "ppo_latency_async.yaml")
ACTORS = 8
TARGET = 475.0
BASE = 5555
LINK_RATE = "100mbit"
LINK_BYTES_S = 100e6 / 8
RESULTS = os.path.join(HERE, "results", "runs.jsonl")


def _env() -> dict:
    env = dict(os.environ)
    env["TIANJAX_RUN_KEY"] = os.urandom(32).hex()
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env["JAX_PLATFORMS"] = "cpu"
    return env


def _reached(recs: list[list[dict]]) -> float | None:
    """The first time (time.time()) at which the moving average of the last 100 episodes
    of every learner's actors reached the target; None if it has not."""
    events = sorted(
        (r["unix_time"], ret) for rec in recs for r in rec for ret in r.get("episode_returns", [])
    )
    window: collections.deque = collections.deque(maxlen=100)
    for t, ret in events:
        window.append(ret)
        if len(window) == 100 and sum(window) / 100 >= TARGET:
            return t
    return None


def _link_bytes(cluster: NamespaceCluster, host: str) -> tuple[int, int]:
    """(received, sent) bytes of `host`'s link so far."""
    out = subprocess.run(
        ["ip", "-n", cluster.netns(host), "-s", "-j", "link", "show", "eth0"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    stats = json.loads(out)[0]["stats64"]
    return stats["rx"]["bytes"], stats["tx"]["bytes"]


class Run:
    """Processes on a cluster's hosts, their output in `log_dir`."""

    def __init__(self, cluster: NamespaceCluster, log_dir: str):
        self.cluster, self.log_dir, self.procs = cluster, log_dir, {}
        self.env = _env()

    def start(self, name: str, host: str, args: list[str]) -> None:
        with (
            open(os.path.join(self.log_dir, f"{name}.out"), "wb") as out,
            open(os.path.join(self.log_dir, f"{name}.err"), "wb") as err,
        ):
            self.procs[name] = self.cluster.run(
                host,
                [sys.executable, "-m", "tianjax.cli", "launch", *args],
                env=self.env,
                cwd=REPO,
                stdout=out,
                stderr=err,
            )

    def failed(self) -> str | None:
        for name, p in self.procs.items():
            if p.poll() not in (None, 0):
                with open(os.path.join(self.log_dir, f"{name}.err")) as f:
                    return f"{name} exited {p.returncode}: {f.read()[-1500:]}"
        return None

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for p in self.procs.values():
            try:
                p.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)


# ---------------------------------------------------------------------------- slow group
def _common(seed: int, run_dir: str, slow: float) -> list[str]:
    return [
        CONFIG,
        f"seed={seed}",
        f"run_dir={run_dir}",
        "log_every=1",
        f"env_options.slow_actors=[{','.join(str(k) for k in range(1, ACTORS, 2))}]",
        f"env_options.slow_factor={slow}",
    ]


def start_groups(
    run: Run, seed: int, run_dir: str, slow: float, sync_every: int, extra: tuple = ()
) -> list[str]:
    common = [
        *_common(seed, run_dir, slow),
        "groups.count=2",
        f"groups.sync_every={sync_every}",
        *extra,
        f"num_actors={ACTORS}",
        "total_env_steps=600000",
        "--base-port",
        str(BASE),
    ]
    bind = ["--bind-host", "0.0.0.0"]
    run.start("averager", "host2", ["--role", "averager", *common, *bind])
    for g in (0, 1):
        where = f"host{g}"
        run.start(
            f"group-{g}",
            where,
            ["--role", "learner", *common, "--group", str(g), "--averager-host", "host2", *bind],
        )
    for k in range(ACTORS):
        where = f"host{k % 2}"
        run.start(
            f"actor-{k}",
            where,
            ["--role", "actor", *common, f"--actor-id={k}", "--learner-host", where],
        )
    return [os.path.join(run_dir, f"group-{g}") for g in (0, 1)]


def start_lockstep(
    run: Run, seed: int, run_dir: str, slow: float, sync_every: int, extra: tuple = ()
) -> list[str]:
    common = [
        *_common(seed, run_dir, slow),
        f"num_actors={ACTORS // 2}",  # per learner
        "total_env_steps=300000",  # per learner
        "--base-port",
        str(BASE),
    ]
    for i in (0, 1):
        run.start(
            f"learner-{i}",
            f"host{i}",
            [
                "--role",
                "learner",
                *common,
                "--coordinator",
                f"host0:{BASE + 20}",
                "--num-processes",
                "2",
                "--process-id",
                str(i),
                "--bind-host",
                "0.0.0.0",
            ],
        )
    for k in range(ACTORS):
        where = f"host{k % 2}"
        run.start(
            f"actor-{k}",
            where,
            [
                "--role",
                "actor",
                *common,
                f"--actor-id={k}",
                "--num-learners",
                "2",
                "--learner-host",
                where,
            ],
        )
    return [os.path.join(run_dir, f"learner-{i}") for i in (0, 1)]


def slow_arm(
    arm: str, seed: int, slow: float, timeout_s: float, sync_every: int = 4, extra: tuple = ()
) -> dict:
    with tempfile.TemporaryDirectory() as tmp, NamespaceCluster(3, hosts_style="own") as cluster:
        run = Run(cluster, tmp)
        run_dir = os.path.join(tmp, "run")
        t0 = time.time()
        start = start_groups if arm == "groups" else start_lockstep
        dirs = start(run, seed, run_dir, slow, sync_every, extra if arm == "groups" else ())
        first = None
        reached = None
        while time.time() - t0 < timeout_s:
            time.sleep(0.25)
            if (why := run.failed()) is not None:
                raise RuntimeError(f"{arm}: {why}")
            recs = [read_metrics(d) for d in dirs]
            if first is None and all(recs):
                first = min(r[0]["unix_time"] for r in recs) - t0
            if (when := _reached(recs)) is not None:
                reached = when - t0
                break
        bytes_ = [sum(_link_bytes(cluster, h)) for h in ("host0", "host1")]
        recs = [read_metrics(d) for d in dirs]
        run.stop()
    updates = [r[-1]["updates"] if r else 0 for r in recs]
    env_steps = sum(r[-1]["env_steps"] for r in recs if r)
    if arm == "groups":  # per update of each group, the mean of the two
        per_update = statistics.mean(b / max(u, 1) for b, u in zip(bytes_, updates))
    else:  # learner 1's link carries what it exchanges with learner 0 (and the coordinator)
        per_update = bytes_[1] / max(updates[1], 1)
    return dict(
        row="slow",
        arm=arm,
        seed=seed,
        sync_every=sync_every if arm == "groups" else None,
        groups_set=list(extra) if arm == "groups" else [],
        slow_factor=slow,
        time_to_target_s=reached,
        first_update_s=first,
        updates=updates,
        env_steps=env_steps,
        learner_bytes=bytes_,
        bytes_per_update=per_update,
    )


# ---------------------------------------------------------------------------- samples
def samples_arm(arm: str, seed: int, timeout_s: float, sync_every: int = 4) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = os.path.join(tmp, "run")
        extra = ["groups.count=2", f"groups.sync_every={sync_every}"] if arm == "groups" else []
        cmd = [
            sys.executable,
            "-m",
            "tianjax.cli",
            "train",
            CONFIG,
            f"seed={seed}",
            f"num_actors={ACTORS}",
            "total_env_steps=600000",
            "stop_at_target=true",
            f"run_dir={run_dir}",
            *extra,
            "--no-progress",
        ]
        subprocess.run(
            cmd,
            env=_env(),
            cwd=REPO,
            timeout=timeout_s,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        with open(os.path.join(run_dir, "summary.json")) as f:
            s = json.load(f)
    return dict(
        row="samples",
        arm=arm,
        seed=seed,
        sync_every=sync_every if arm == "groups" else None,
        convergence_env_steps=s["convergence_env_steps"],
        convergence_time_s=s["convergence_time_s"],
        final_return=s["final_return"],
        rounds=s.get("rounds"),
    )


# ---------------------------------------------------------------------------- link rate
def link_arm(seed: int, window_s: float = 20.0, timeout_s: float = 300.0) -> dict:
    with tempfile.TemporaryDirectory() as tmp, NamespaceCluster(2, hosts_style="own") as cluster:
        for h in cluster.hosts:
            cluster.cap(h, LINK_RATE)
        run = Run(cluster, tmp)
        run_dir = os.path.join(tmp, "run")
        common = [
            CONFIG,
            f"seed={seed}",
            f"run_dir={run_dir}",
            "log_every=1",
            "num_actors=2",
            "total_env_steps=2000000",
            "network.hidden=[1024,1024]",
            "ppo.num_epochs=1",
            "ppo.num_minibatches=4",
            "runtime.heartbeat_timeout_s=600",
        ]
        one = ["--coordinator", f"host0:{BASE + 20}", "--num-processes", "1", "--process-id", "0"]
        run.start(
            "learner", "host0", ["--role", "learner", *common, *one, "--bind-host", "0.0.0.0"]
        )
        for k in range(2):
            run.start(
                f"actor-{k}",
                "host1",
                ["--role", "actor", *common, f"--actor-id={k}", "--learner-host", "host0"],
            )
        learner_dir = os.path.join(run_dir, "learner-0")
        t0 = time.monotonic()
        while len(read_metrics(learner_dir)) < 3:  # past the first updates and joins
            if (why := run.failed()) is not None or time.monotonic() - t0 > timeout_s:
                raise RuntimeError(f"link: {why or 'no updates'}")
            time.sleep(0.5)
        time.sleep(2.0)
        b0, u0, t_start = (
            _link_bytes(cluster, "host0"),
            read_metrics(learner_dir)[-1],
            time.monotonic(),
        )
        time.sleep(window_s)
        b1, u1, t_end = (
            _link_bytes(cluster, "host0"),
            read_metrics(learner_dir)[-1],
            time.monotonic(),
        )
        run.stop()
    dt = t_end - t_start
    rx, tx = (b1[0] - b0[0]) / dt, (b1[1] - b0[1]) / dt
    return dict(
        row="link",
        arm="learner",
        seed=seed,
        link_bytes_per_s=LINK_BYTES_S,
        sent_per_s=tx,
        received_per_s=rx,
        sent_fraction=tx / LINK_BYTES_S,
        received_fraction=rx / LINK_BYTES_S,
        updates_per_s=(u1["updates"] - u0["updates"]) / dt,
        param_mb=4.2,
    )


# ---------------------------------------------------------------------------- the table
def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def table(path: str) -> str:
    with open(path) as f:
        runs = [json.loads(line) for line in f if line.strip()]
    lines = []
    slow = [r for r in runs if r["row"] == "slow"]
    ls = [r for r in slow if r["arm"] == "lockstep"]
    tl = _median([r["time_to_target_s"] for r in ls])
    fl = _median([r["time_to_target_s"] - r["first_update_s"] for r in ls if r["time_to_target_s"]])
    bl = _median([r["bytes_per_update"] for r in ls])
    variants = sorted(
        {(r["sync_every"], " ".join(r.get("groups_set", []))) for r in slow if r["arm"] == "groups"}
    )
    for k, more in variants:
        g = [
            r
            for r in slow
            if r["arm"] == "groups"
            and (r["sync_every"], " ".join(r.get("groups_set", []))) == (k, more)
        ]
        tg = _median([r["time_to_target_s"] for r in g])
        fg = _median(
            [r["time_to_target_s"] - r["first_update_s"] for r in g if r["time_to_target_s"]]
        )
        bg = _median([r["bytes_per_update"] for r in g])
        lines += [
            f"slow group (group 1's 4 actors {slow[0]['slow_factor']:g}x slower), 2 x 4 actors, "
            f"groups.sync_every={k}{' ' + more if more else ''}, medians of {len(g)} and "
            f"{len(ls)} runs, alternating:",
            f"  time to 475: groups {tg:.1f} s, lock-step {tl:.1f} s from launch: groups "
            f"{tl / tg:.2f}x sooner ({fl / fg:.2f}x from the first update: {fg:.1f} s and {fl:.1f} s)"
            if tg and tl and fg and fl
            else f"  time to 475: groups {tg}, lock-step {tl}",
            f"  traffic between learners per update: groups {bg / 1e3:,.1f} kB, lock-step "
            f"{bl / 1e3:,.1f} kB: {bl / bg:.1f}x less"
            if bg and bl
            else "",
            f"  reached: groups {sum(r['time_to_target_s'] is not None for r in g)}/{len(g)}, "
            f"lock-step {sum(r['time_to_target_s'] is not None for r in ls)}/{len(ls)}",
        ]
    samples = [r for r in runs if r["row"] == "samples"]
    one = _median([r["convergence_env_steps"] for r in samples if r["arm"] == "single"])
    for k in sorted({r["sync_every"] for r in samples if r["arm"] == "groups"}):
        gs = [r for r in samples if r["arm"] == "groups" and r["sync_every"] == k]
        g = _median([r["convergence_env_steps"] for r in gs])
        lines += [
            f"samples to 475, 8 actors, groups.sync_every={k}, medians of {len(gs)} and "
            f"{sum(r['arm'] == 'single' for r in samples)}: groups {g:,.0f}, one learner "
            f"{one:,.0f}: {g / one:.2f}x (final returns: groups "
            f"{_median([r['final_return'] for r in gs]):.0f}, one learner "
            f"{_median([r['final_return'] for r in samples if r['arm'] == 'single']):.0f})"
            if g and one
            else f"samples: groups {g}, one learner {one}",
        ]
    link = [r for r in runs if r["row"] == "link"]
    if link:
        sent = _median([r["sent_fraction"] for r in link])
        got = _median([r["received_fraction"] for r in link])
        lines += [
            f"link rate, tbf {LINK_RATE}, 4.2 MB parameters to 2 actors, {len(link)} runs: the "
            f"learner's link sends {sent:.2f} of the link rate (parameters) and receives "
            f"{got:.3f} (trajectories); {_median([r['updates_per_s'] for r in link]):.2f} updates/s",
        ]
    return "\n".join(line for line in lines if line)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", nargs="+", default=["slow", "samples", "link"])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--slow-factor", type=float, default=3.0)
    ap.add_argument("--sync-every", type=int, default=4, help="groups.sync_every of the groups")
    ap.add_argument(
        "--arms", nargs="+", help="only these arms (groups, lockstep, single; default all)"
    )
    ap.add_argument(
        "--groups-set", nargs="*", default=[], help="more groups.* overrides for the slow row"
    )
    ap.add_argument("--out", default=RESULTS)
    ap.add_argument("--table")
    ap.add_argument("--timeout-s", type=float, default=300.0)
    args = ap.parse_args(argv)
    if args.table:
        print(table(args.table))
        return 0
    if shutil.which("ip") is None or os.geteuid() != 0:
        print("groups.py: needs root and iproute2 (network namespace hosts)", file=sys.stderr)
        return 2
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)

    def keep(result: dict) -> None:
        with open(args.out, "a") as f:
            f.write(json.dumps(result) + "\n")
        print(json.dumps(result), flush=True)

    for seed in range(args.repeats):
        if "slow" in args.rows:
            for arm in args.arms or ("groups", "lockstep"):
                if arm in ("groups", "lockstep"):
                    keep(
                        slow_arm(
                            arm,
                            seed,
                            args.slow_factor,
                            args.timeout_s,
                            args.sync_every,
                            tuple(args.groups_set),
                        )
                    )
        if "samples" in args.rows:
            for arm in args.arms or ("groups", "single"):
                if arm in ("groups", "single"):
                    keep(samples_arm(arm, seed, args.timeout_s, args.sync_every))
        if "link" in args.rows:
            keep(link_arm(seed))
    print(table(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
