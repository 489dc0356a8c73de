"""The chaos soak with learner groups (`chaos.py --groups G`): the run laid out over hosts
as docs/multihost.md writes a groups run, one `tianjax launch --role ...` per process, and
the groups' own faults taking their turns with the actors'.

The hosts (network namespaces): `avg` runs the averager; `g0` ... run the groups'
learners; `a0` ... one actor each, actor k training for group k mod G (its launch process
supervises it, with its warm standby). Curve security, one run key, fixed ports from
BASE_PORT.

The faults, round-robin, one every --every seconds (targets taken in turn), and what a
recovery runs from and to:

- actor_kill: SIGKILL of an actor process; its launch process hands its place to its
  standby. From the kill to the replacement's first trajectory its group admitted.
- actor_stop: SIGSTOP for --stop-s, then SIGCONT. From the SIGCONT to its next admitted
  trajectory.
- averager_kill: SIGKILL of the averager, started again at once from its newest
  checkpoint (`resume=RUN_DIR`), as a scheduler would. From the kill to the restarted
  averager's first round.
- group_cut: a group learner's host cut off for --cut-s, from its actors and from the
  averager. From the heal to the first round that merged that group's delta.
- link_cut, link_cap: an actor host's link cut, or capped to 1 Mbit/s. From the heal or
  uncap to the actor's next admitted trajectory.

A group learner is not killed here: a multi-host group learner is not restarted by
tianjax (a scheduler would start it with `resume=`); tianjax's own restart of a killed
learner is the single-learner soak's learner_kill.

The figures: fresh samples/s is the sum over the groups of each group learner's (samples
first learned from in its kept history, per second of training on the shared clock); the
final return is the mean of the groups' final returns; the accounting is each group's
final learner's (soak_records.accounting), summed, and closes when every group's does.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time

from fault_turns import FaultTurns, actor_proc, drive, hit_actor, shared_overrides
from soak_records import accounting, fresh_rate, rate_series

from tianjax.launch import NamespaceCluster
from tianjax.metrics import read_metrics

GROUP_KINDS = ("actor_kill", "actor_stop", "averager_kill", "group_cut", "link_cut", "link_cap")
BASE_PORT = 5700


def group_of(actor: int, groups: int) -> int:
    return actor % groups


def recovery_s(fault: dict, group_records: list[list[dict]], rounds: list[dict]) -> float | None:
    """Seconds from a fault (a kill) or its end (a stop, cut or cap) to its recovery (the
    table in the module doc); None: not recovered in these records."""
    t = fault["end"]
    if fault["kind"] == "averager_kill":
        after = [r["unix_time"] for r in rounds if r["unix_time"] > t]
        return after[0] - t if after else None
    if fault["kind"] == "group_cut":
        g = fault["group"]
        after = [r["unix_time"] for r in rounds if r["unix_time"] > t and g in r["merged_groups"]]
        return after[0] - t if after else None
    key = str(fault["actor"])
    for r in group_records[group_of(fault["actor"], len(group_records))]:
        at = r.get("actor_admitted_at", {}).get(key)
        if at is not None and at > t:
            return at - t
    return None


def combined_accounting(accounts: list[dict | None]) -> dict | None:
    """The groups' ledgers as one: counts summed, per-actor lines merged (an actor trains
    for one group), and closed when every group's closes."""
    if not accounts or any(a is None for a in accounts):
        return None
    out = {
        "since_update": [a["since_update"] for a in accounts],
        "closes": all(a["closes"] for a in accounts),
        "by_actor": {},
        "sent_unaccounted_by_actor": {},
        "dropped_on_arrival": {},
        "rejected_by_reason": {},
        "samples_lost_with_killed_learners": [],
    }
    for a in accounts:
        for k in ("trajectories_received", "samples_received", "samples_admitted"):
            out[k] = out.get(k, 0) + a[k]
        for k in ("trajectories_written_off", "rejected_messages", "unread_at_stop"):
            out[k] = out.get(k, 0) + a.get(k, 0)
        for k, v in a["dropped_on_arrival"].items():
            out["dropped_on_arrival"][k] = out["dropped_on_arrival"].get(k, 0) + v
        for k, v in a["rejected_by_reason"].items():
            out["rejected_by_reason"][k] = out["rejected_by_reason"].get(k, 0) + v
        out["by_actor"].update(a["by_actor"])
        out["sent_unaccounted_by_actor"].update(a["sent_unaccounted_by_actor"])
    return out


# ----------------------------------------------------------------------------- the hosts
class GroupHosts:
    """The namespace hosts of a groups run: avg, g0 .. g{G-1}, a0 .. a{N-1}."""

    def __init__(self, groups: int, actors: int):
        self.groups, self.actors = groups, actors
        names = ["avg", *(f"g{g}" for g in range(groups)), *(f"a{k}" for k in range(actors))]
        self.cluster = NamespaceCluster(names).start()  # NetnsError says why it cannot

    def close(self) -> None:
        self.cluster.close()


class GroupRun:
    """The role processes of one run, each `tianjax launch --role ...` on its host."""

    def __init__(self, args, hosts: GroupHosts, run_dir: str):
        self.args, self.hosts, self.run_dir = args, hosts, run_dir
        self.c = hosts.cluster
        self.env = dict(os.environ, PYTHONUNBUFFERED="1", JAX_PLATFORMS="cpu")
        self.env["PYTHONPATH"] = args.repo + os.pathsep + self.env.get("PYTHONPATH", "")
        self.env["TIANJAX_RUN_KEY"] = os.urandom(32).hex()
        self.common = [
            args.config,
            *shared_overrides(args, run_dir),
            f"groups.count={hosts.groups}",
            *args.set,
        ]
        self.procs: dict[str, subprocess.Popen] = {}
        self.averager_restarts = 0

    def _argv(self, name: str, resume: bool = False) -> tuple[str, list[str]]:
        cli = [sys.executable, "-m", "tianjax.cli", "launch"]
        common = [*self.common, *([f"resume={self.run_dir}"] if resume else [])]
        port = ["--base-port", str(BASE_PORT)]
        bind = ["--bind-host", "0.0.0.0"]
        if name == "averager":
            return "avg", [*cli, "--role", "averager", *common, *port, *bind]
        kind, index = name.split("-")
        i = int(index)
        if kind == "group":
            averager = ["--averager-host", self.c.addr("avg")]
            return f"g{i}", [
                *cli,
                "--role",
                "learner",
                *common,
                "--group",
                index,
                *port,
                *bind,
                *averager,
            ]
        learner = ["--learner-host", self.c.addr(f"g{group_of(i, self.hosts.groups)}")]
        return f"a{i}", [*cli, "--role", "actor", *common, "--actor-id", index, *port, *learner]

    def start(self, name: str, resume: bool = False) -> None:
        host, argv = self._argv(name, resume)
        with (
            open(os.path.join(self.run_dir, f"{name}.out"), "ab") as out,
            open(os.path.join(self.run_dir, f"{name}.err"), "ab") as err,
        ):
            self.procs[name] = self.c.run(
                host, argv, env=self.env, cwd=self.args.repo, stdout=out, stderr=err
            )

    def start_all(self) -> None:
        os.makedirs(self.run_dir, exist_ok=True)
        self.start("averager")
        for g in range(self.hosts.groups):
            self.start(f"group-{g}")
        for k in range(self.hosts.actors):
            self.start(f"actor-{k}")

    def learners_alive(self) -> bool:
        return all(self.procs[f"group-{g}"].poll() is None for g in range(self.hosts.groups))

    def stop(self, grace_s: float) -> str:
        """The learners first (each checkpoints, writes its summary and tells its actors to
        stop), then the averager, then what is left; killed past the grace."""
        order = [
            [n for n in self.procs if n.startswith("group")],
            ["averager"],
            [n for n in self.procs if n.startswith("actor")],
        ]
        late = []
        for names in order:
            for n in names:
                if self.procs[n].poll() is None:
                    self.procs[n].send_signal(signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            for n in names:
                try:
                    self.procs[n].wait(timeout=max(deadline - time.monotonic(), 0.1))
                except subprocess.TimeoutExpired:
                    late.append(n)
                    os.killpg(self.procs[n].pid, signal.SIGKILL)
                    self.procs[n].wait()
        return f"; killed after the stop grace: {late}" if late else ""


# ----------------------------------------------------------------------------- the faults
class GroupFaults(FaultTurns):
    """The groups layout's faults, in turn (fault_turns.FaultTurns), each on the next
    target."""

    def __init__(self, args, run: GroupRun, kinds: list[str], margin_s: float, cap_rate: str):
        super().__init__(args, kinds, margin_s)
        self.run, self.cap_rate = run, cap_rate

    def start_next(self) -> dict | None:
        kind, n = self.take_turn()
        actor = n % self.run.hosts.actors
        group = n % self.run.hosts.groups
        fault = {"kind": kind, "actor": None, "group": None}
        undo = None
        c = self.run.c
        if kind in ("actor_kill", "actor_stop"):
            fault["actor"] = actor
            p = actor_proc(self.run.procs[f"actor-{actor}"].pid, actor)
            if p is None:
                return self.skip(fault, f"no process of actor {actor} (restarting)")
            undo = hit_actor(kind, p, fault)
        elif kind == "averager_kill":
            p = self.run.procs["averager"]
            fault["pid"] = p.pid
            p.send_signal(signal.SIGKILL)
            p.wait()
            self.run.start("averager", resume=True)  # a scheduler's restart, at once
            self.run.averager_restarts += 1
        elif kind == "group_cut":
            fault["group"] = group
            c.cut(f"g{group}")
            undo = functools.partial(c.heal, f"g{group}")
        elif kind == "link_cut":
            fault["actor"] = actor
            c.cut(f"a{actor}")
            undo = functools.partial(c.heal, f"a{actor}")
        else:  # link_cap
            fault["actor"] = actor
            c.cap(f"a{actor}", self.cap_rate)
            undo = functools.partial(c.uncap, f"a{actor}")
        return self.started(fault, undo)


def target(f: dict) -> str:
    if f["kind"] == "averager_kill":
        return "averager"
    return f"group {f['group']}" if f["group"] is not None else f"actor {f['actor']}"


# ----------------------------------------------------------------------------- one run
def run_once(args, hosts: GroupHosts, run_dir: str, chaos: bool, margin_s: float, cap_rate: str):
    """One groups run of --minutes of training, with the faults or without."""
    run = GroupRun(args, hosts, run_dir)
    kinds = [k for k in args.faults if k in GROUP_KINDS]
    faults = GroupFaults(args, run, kinds, margin_s, cap_rate)
    dirs = [os.path.join(run_dir, f"group-{g}") for g in range(hosts.groups)]
    metrics = [os.path.join(d, "metrics.jsonl") for d in dirs]
    run.start_all()
    ended = "deadline"
    try:
        ended, _ = drive(
            args,
            faults,
            chaos,
            gone=lambda: not run.learners_alive() and "a group's learner exited",
            training=lambda: all(os.path.exists(m) and os.path.getsize(m) > 0 for m in metrics),
            name=target,
        )
    finally:
        faults.end_due(force=True)
        ended += run.stop(args.stop_grace)
    out = figures(args, run, dirs, chaos, ended, faults.done)
    return {**out, "faults_skipped": faults.skipped}


def figures(args, run: GroupRun, dirs: list[str], chaos, ended, faults) -> dict:
    kept = [[r for r in read_metrics(d) if "unix_time" in r] for d in dirs]
    rounds = [r for r in read_metrics(os.path.join(run.run_dir, "averager")) if "unix_time" in r]
    summaries = []
    for d in dirs:
        path = os.path.join(d, "summary.json")
        summaries.append(json.load(open(path)) if os.path.exists(path) else None)
    for f in faults:
        f["recovery_s"] = recovery_s(f, kept, rounds)
    traj_steps = args.num_envs * args.rollout_len
    firsts = [k[0]["unix_time"] for k in kept if k]
    t0 = min(firsts) if firsts else 0.0
    bins: dict[float, float] = {}
    for k in kept:
        for x, y in zip(*rate_series(k, t0)):
            bins[x] = bins.get(x, 0.0) + y
    for f in faults:
        f["at_s"] = f["start"] - t0
        f["for_s"] = f["end"] - f["start"]
    rates = [fresh_rate(k) for k in kept]
    returns = [s.get("final_return") for s in summaries if s]
    done = [s for s in summaries if s]
    restarts = 0
    for k in range(run.hosts.actors):
        path = os.path.join(run.run_dir, f"actor-{k}.err")
        if os.path.exists(path):
            restarts += open(path, errors="replace").read().count(") restarted")
    return {
        "chaos": chaos,
        "run_dir": run.run_dir,
        "ended": ended,
        "exit_code": [run.procs[f"group-{g}"].returncode for g in range(len(dirs))],
        "summary_written": all(s is not None for s in summaries),
        "training_s": max(
            (k[-1]["unix_time"] - k[0]["unix_time"] for k in kept if len(k) > 1), default=0.0
        ),
        "fresh_per_s": sum(rates) if all(r is not None for r in rates) else None,
        "fresh_per_s_by_group": rates,
        "final_return": sum(returns) / len(returns) if returns and None not in returns else None,
        "final_return_by_group": returns,
        "updates": sum(s["updates"] for s in done) if done else None,
        "rounds": len(rounds),
        "actor_restarts": restarts,
        "learner_restarts": run.averager_restarts,
        "faults": faults,
        "accounting": combined_accounting(
            [s and accounting(s, k, traj_steps, []) for s, k in zip(summaries, kept)]
        ),
        "series": {"t_s": sorted(bins), "fresh_per_s": [bins[x] for x in sorted(bins)]},
    }


__all__ = [
    "GROUP_KINDS",
    "GroupHosts",
    "combined_accounting",
    "recovery_s",
    "run_once",
]
