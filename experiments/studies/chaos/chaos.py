"""The chaos soak: an async run that takes a fault every 30 seconds, against the same run
without faults, on hosts made of network namespaces (tianjax.launch.netns).

    python experiments/studies/chaos/chaos.py [--minutes 30] [--every 30] [--pairs 1]
        [--actors 8] [--dir DIR] [--out FILE]
    python experiments/studies/chaos/chaos.py --table FILE     # a results file's table again

The run: `tianjax train configs/ppo_latency_async.yaml` (latency-bound actors) with the
learner as a child process that is restarted from its newest checkpoint
(`runtime.restart_learner=true`, `checkpoint.every=5`), on a namespace host of its own
("learner"), and each actor process on a host of its own ("a0", "a1", ...), started there
by the launcher through `runtime.actor_wrapper` (`ip netns exec`); the launcher replaces
a dead actor as it does on one machine, by the actor's warm standby on the same host
(`runtime.standby_actors=true`), and a dead learner by its warm standby
(`runtime.standby_learner=true`; --no-standby: both replaced by a cold start). Actors
reach the learner over the hosts' bridge, with curve security. Where namespaces cannot be
made (not root, no iproute2), everything runs on loopback, the link faults are left out,
and the output says so.

The faults, round-robin, one every --every seconds of training, each on the next actor:
kill -9 of an actor; SIGSTOP of an actor for --stop-s (10) seconds; kill -9 of the learner;
an actor host's link cut for --cut-s (20) seconds; that link capped to 1 Mbit/s (tc tbf,
both ways) for --cap-s (20) seconds. A fault starts only if it and 10 s after it fit before
the end.

Each pair runs the same config (same seed) without faults, then with them, for --minutes
of training (from the first record), then stops it with SIGTERM. The report:

- fresh samples/s (samples first learned from in the final parameters' history, per
  second of training), and the chaos run's over the fault-free one's (goal 0.95+);
- the final return (mean of the last 100 episodes), and whether the chaos runs' lie within
  the fault-free runs' spread;
- recovery per fault kind, p50 and p95: an actor's from the kill (or the end of a stop, cut
  or cap) to the first trajectory of that actor id the learner admitted after it (records
  carry each actor id's newest admission time, `actor_admitted_at`), the learner's from the
  kill to the first update of its next incarnation (`unix_time` of its first record);
- the accounting of the final learner incarnation (summary.json): every trajectory
  received was admitted or dropped by a named reason, exactly; trajectories an actor said
  it sent that never came were written off (lost with the process or connection that held
  them); and the samples each killed learner had admitted since its last checkpoint are
  counted lost with it (its records after that checkpoint, metrics.superseded.jsonl).
  A killed actor's unsent work was never sent, and is not counted.

The result goes to --out (JSON), a table to stdout, and a figure of fresh samples/s over
time with the faults marked to FILE.png. Timings on a shared machine are noisy: compare the
ratio, measured alternating in the same invocation.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, REPO)
sys.path.insert(0, HERE)

# the arithmetic on records: soak_records.py, next to this file
import chaos_groups  # noqa: E402
from fault_turns import (  # noqa: E402
    FaultTurns,
    actor_proc,
    drive,
    hit_actor,
    learner_proc,
    shared_overrides,
)
from soak_records import (  # noqa: E402
    accounting,
    all_records,
    fresh_rate,
    percentiles,
    rate_series,
    recovery_s,
    rolled_back,
)

from tianjax.launch import NamespaceCluster, NetnsError  # noqa: E402
from tianjax.metrics import read_metrics  # noqa: E402

CONFIG = os.path.join(REPO, "configs", "ppo_latency_async.yaml")
KINDS = ("actor_kill", "actor_stop", "learner_kill", "link_cut", "link_cap")
LINK_KINDS = ("link_cut", "link_cap")
CAP_RATE = "1mbit"
MARGIN_S = 10.0  # a fault starts only if it and this long after it fit before the end


# ----------------------------------------------------------------------------- one run
class Hosts:
    """Where the run's processes go: namespace hosts (learner, a0, a1, ...), or this
    machine's loopback when namespaces are not available (`why` says why)."""

    def __init__(self, actors: int, loopback: bool = False):
        self.why, self.cluster = "--loopback" if loopback else None, None
        if not loopback:
            cluster = NamespaceCluster(["learner", *(f"a{i}" for i in range(actors))])
            try:
                self.cluster = cluster.start()
            except NetnsError as e:  # not root, no iproute2, ... (start says which)
                self.why = str(e).splitlines()[0]

    def overrides(self) -> list[str]:
        if self.cluster is None:
            return []
        wrapper = [shutil.which("ip") or "ip", "netns", "exec", f"{self.cluster.prefix}-a{{actor}}"]
        return [
            f"runtime.bind_host={self.cluster.addr('learner')}",
            "runtime.actor_wrapper=" + json.dumps(wrapper),
        ]

    def start(self, argv: list[str], env: dict, out, err) -> subprocess.Popen:
        if self.cluster is None:
            return subprocess.Popen(
                argv, env=env, cwd=REPO, stdout=out, stderr=err, start_new_session=True
            )
        return self.cluster.run("learner", argv, env=env, cwd=REPO, stdout=out, stderr=err)

    def close(self) -> None:
        if self.cluster is not None:
            self.cluster.close()


class Faults(FaultTurns):
    """The single-learner layout's faults, in turn (fault_turns.FaultTurns)."""

    def __init__(self, args, hosts: Hosts, launcher_pid: int):
        kinds = [k for k in args.faults if hosts.cluster is not None or k not in LINK_KINDS]
        super().__init__(args, kinds, MARGIN_S)
        self.hosts, self.pid = hosts, launcher_pid

    def start_next(self) -> dict | None:
        kind, n = self.take_turn()
        actor = n % self.args.actors
        fault = {"kind": kind, "actor": None if kind == "learner_kill" else actor}
        undo = None
        if kind == "learner_kill":
            p = learner_proc(self.pid)
            if p is None:
                return self.skip(fault, "no learner process (restarting)")
            fault["pid"] = p.pid
            p.send_signal(signal.SIGKILL)
        elif kind in ("actor_kill", "actor_stop"):
            p = actor_proc(self.pid, actor)
            if p is None:
                return self.skip(fault, f"no process of actor {actor} (restarting)")
            undo = hit_actor(kind, p, fault)
        elif kind == "link_cut":
            host = f"a{actor}"
            self.hosts.cluster.cut(host)
            undo = functools.partial(self.hosts.cluster.heal, host)
        else:  # link_cap
            host = f"a{actor}"
            self.hosts.cluster.cap(host, CAP_RATE)
            undo = functools.partial(self.hosts.cluster.uncap, host)
        return self.started(fault, undo)


def run_once(args, hosts: Hosts, run_dir: str, chaos: bool) -> dict:
    """One run of --minutes of training, with the faults or without; returns its figures."""
    os.makedirs(run_dir, exist_ok=True)
    overrides = [
        *shared_overrides(args, run_dir),
        "runtime.restart_learner=true",
        "runtime.max_learner_restarts=1000",
        f"runtime.standby_learner={str(not args.no_standby).lower()}",
        *hosts.overrides(),
        *args.set,
    ]
    argv = [sys.executable, "-m", "tianjax.cli", "train", args.config, *overrides, "--no-progress"]
    env = dict(os.environ, PYTHONUNBUFFERED="1", JAX_PLATFORMS="cpu")
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    with (
        open(os.path.join(run_dir, "launcher.out"), "wb") as out,
        open(os.path.join(run_dir, "launcher.err"), "wb") as err,
    ):
        launcher = hosts.start(argv, env, out, err)
    faults = Faults(args, hosts, launcher.pid)
    metrics = os.path.join(run_dir, "metrics.jsonl")
    ended, t_train = "deadline", None
    try:
        ended, t_train = drive(
            args,
            faults,
            chaos,
            gone=lambda: launcher.poll() is not None and f"exited with code {launcher.returncode}",
            training=lambda: os.path.exists(metrics) and os.path.getsize(metrics) > 0,
            name=_target,
        )
    finally:
        faults.end_due(force=True)
        stop_s = None
        if launcher.poll() is None:
            t_stop = time.monotonic()
            launcher.send_signal(signal.SIGTERM)
            try:
                launcher.wait(timeout=args.stop_grace)
                stop_s = time.monotonic() - t_stop
            except subprocess.TimeoutExpired:
                ended += "; killed after the stop grace"
                # every thread's stack into launcher.err first: where the stop hung
                launcher.send_signal(signal.SIGUSR1)
                time.sleep(1.0)
                os.killpg(launcher.pid, signal.SIGKILL)
                launcher.wait()
    out = _figures(args, run_dir, chaos, ended, launcher.returncode, t_train, faults.done)
    return {**out, "stop_s": stop_s, "faults_skipped": faults.skipped}


def _target(f: dict) -> str:
    return "learner" if f["actor"] is None else f"actor {f['actor']}"


def _figures(args, run_dir, chaos, ended, code, t_train, faults) -> dict:
    kept = [r for r in read_metrics(run_dir) if "unix_time" in r]
    records = all_records(run_dir)
    summary_path = os.path.join(run_dir, "summary.json")
    summary = json.load(open(summary_path)) if os.path.exists(summary_path) else None
    for f in faults:
        f["recovery_s"] = recovery_s(f, records)
    traj_steps = args.num_envs * args.rollout_len
    lost = rolled_back(faults, kept, records)
    t0 = kept[0]["unix_time"] if kept else (t_train or 0.0)
    xs, ys = rate_series(records, t0)
    for f in faults:
        f["at_s"] = f["start"] - t0
        f["for_s"] = f["end"] - f["start"]
    return {
        "chaos": chaos,
        "run_dir": run_dir,
        "ended": ended,
        "exit_code": code,
        "summary_written": summary is not None,
        "training_s": (kept[-1]["unix_time"] - kept[0]["unix_time"]) if len(kept) > 1 else 0.0,
        "fresh_per_s": fresh_rate(kept),
        "final_return": summary and summary.get("final_return"),
        "updates": summary and summary.get("updates"),
        "actor_restarts": summary and summary.get("actor_restarts"),
        "learner_restarts": summary and summary.get("learner_restarts"),
        "learner_restarts_from_standby": summary and summary.get("learner_restarts_from_standby"),
        "faults": faults,
        "accounting": summary and accounting(summary, kept, traj_steps, lost),
        "series": {"t_s": xs, "fresh_per_s": ys},
    }


# ----------------------------------------------------------------------------- report
def kinds_of(args) -> tuple[str, ...]:
    """The fault kinds of the layout: one learner's, or learner groups' (chaos_groups)."""
    return chaos_groups.GROUP_KINDS if getattr(args, "groups", 1) > 1 else KINDS


def report(args, runs: list[dict], where: str) -> dict:
    base = [r for r in runs if not r["chaos"]]
    chaos = [r for r in runs if r["chaos"]]
    ratios = [
        c["fresh_per_s"] / b["fresh_per_s"]
        for b, c in zip(base, chaos)
        if b["fresh_per_s"] and c["fresh_per_s"]
    ]
    spread = [r["final_return"] for r in base if r["final_return"] is not None]
    faults = [f for r in chaos for f in r["faults"]]
    kinds = kinds_of(args)
    rec = {k: percentiles([f["recovery_s"] for f in faults if f["kind"] == k]) for k in kinds}
    for k in kinds:
        rec[k]["faults"] = sum(f["kind"] == k for f in faults)
        rec[k]["unrecovered"] = sum(f["kind"] == k and f["recovery_s"] is None for f in faults)
    return {
        "where": where,
        "retention": {
            "per_pair": ratios,
            "median": float(np.median(ratios)) if ratios else None,
            "goal": 0.95,
        },
        "final_return": {
            "fault_free": spread,
            "chaos": [r["final_return"] for r in chaos],
            "within_fault_free_spread": [
                None
                if not spread or r["final_return"] is None
                else min(spread) <= r["final_return"] <= max(spread)
                for r in chaos
            ],
        },
        "recovery_s": rec,
        "accounting_closes": [bool(r["accounting"] and r["accounting"]["closes"]) for r in chaos],
    }


def _f(x, spec=".2f") -> str:
    return "-" if x is None else format(x, spec)


def print_table(args, res: dict) -> None:
    s = res["summary"]
    groups = getattr(args, "groups", 1)
    layout = f"{groups} learner groups, " if groups > 1 else ""
    print(
        f"\nchaos soak: {s['where']}; {layout}{args.actors} actors, {args.minutes:g} min of "
        "training"
    )
    print(f"a fault every {args.every:g} s; {len(res['runs']) // 2 or 1} pair(s)\n")
    print(f"{'run':<12}{'fresh/s':>10}{'final ret':>11}{'updates':>9}{'faults':>8}  ended")
    for r in res["runs"]:
        name = "chaos" if r["chaos"] else "fault-free"
        print(
            f"{name:<12}{_f(r['fresh_per_s'], ',.0f'):>10}{_f(r['final_return'], '.1f'):>11}"
            f"{_f(r['updates'], 'd'):>9}{len(r['faults']):>8}  {r['ended']}"
        )
    ret = s["retention"]
    print(
        f"\nfresh samples/s retained: {_f(ret['median'], '.3f')} (per pair "
        + ", ".join(_f(x, ".3f") for x in ret["per_pair"])
        + f"; goal {ret['goal']})"
    )
    fr = s["final_return"]
    print(
        f"final return: chaos {[_f(x, '.1f') for x in fr['chaos']]}, fault-free "
        f"{[_f(x, '.1f') for x in fr['fault_free']]}; within the fault-free spread: "
        f"{fr['within_fault_free_spread']}"
    )
    print(
        f"\n{'fault':<14}{'n':>4}{'p50 s':>8}{'p95 s':>8}{'max s':>8}{'unrecov.':>10}  recovery from"
    )
    since = {
        "actor_kill": "the kill to the replacement's first admitted trajectory",
        "actor_stop": f"SIGCONT ({args.stop_s:g} s stop) to its first admitted trajectory",
        "learner_kill": "the kill to the restarted learner's first update",
        "link_cut": f"the heal ({args.cut_s:g} s cut) to its first admitted trajectory",
        "link_cap": f"the uncap ({CAP_RATE} for {args.cap_s:g} s) to its first admitted",
        "averager_kill": "the kill to the restarted averager's first round",
        "group_cut": f"the heal ({args.cut_s:g} s cut) to the group's first merged delta",
    }
    for k, v in s["recovery_s"].items():
        print(
            f"{k:<14}{v['faults']:>4}{_f(v['p50']):>8}{_f(v['p95']):>8}{_f(v['max']):>8}"
            f"{v['unrecovered']:>10}  {since[k]}"
        )
    for r in res["runs"]:
        for f in r.get("faults_skipped", []):
            print(f"skipped: {f['kind']} ({f['why']})")
    for r in res["runs"]:
        a = r["accounting"]
        if not r["chaos"] or a is None:
            continue
        d = a["dropped_on_arrival"]
        print(
            f"\naccounting (final learner incarnation, from update {a['since_update']}): "
            f"{a['trajectories_received']:,} trajectories received = {a['samples_received']:,} "
            f"samples = {a['samples_admitted']:,} admitted + {d['too_stale_or_beyond_budget']:,} "
            f"too stale or beyond the budget + {d['nonfinite']:,} non-finite + "
            f"{d['bad_versions']:,} bad versions + {a.get('unread_at_stop', 0):,} unread at the stop"
        )
        sent = sum(c.get("sent", 0) for c in a["by_actor"].values())
        print(
            f"  actors' current processes said they sent {sent:,}; sent but never came (lost "
            f"with the actor process or connection that held them, written off): "
            f"{a['trajectories_written_off']}; unaccounted: {a['sent_unaccounted_by_actor'] or 0}"
        )
        print(
            f"  lost with killed learners (admitted after their last checkpoint): "
            f"{a['samples_lost_with_killed_learners']} samples; messages rejected: "
            f"{a['rejected_by_reason'] or 0}; closes: {a['closes']}"
        )
    print(f"\njson {args.out}\nfigure {res['figure']}")


def plot(res: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = dict(zip(KINDS, ["tab:red", "tab:orange", "tab:purple", "tab:blue", "tab:green"]))
    colours.update(averager_kill="tab:brown", group_cut="tab:cyan")
    fig, ax = plt.subplots(figsize=(10, 4))
    for i, r in enumerate(res["runs"]):
        label = f"{'chaos' if r['chaos'] else 'fault-free'} {i // 2 + 1}"
        ax.plot(
            r["series"]["t_s"],
            r["series"]["fresh_per_s"],
            label=label,
            lw=1,
            color="black" if r["chaos"] else "grey",
            alpha=1.0 if r["chaos"] else 0.6,
        )
    seen = set()
    for r in res["runs"]:
        for f in r["faults"]:
            k = f["kind"]
            ax.axvspan(
                f["at_s"],
                f["at_s"] + max(f["for_s"], 0.5),
                color=colours[k],
                alpha=0.25,
                label=None if k in seen else k.replace("_", " "),
            )
            seen.add(k)
    ax.set_xlabel("seconds of training")
    ax.set_ylabel("fresh samples/s (5 s bins)")
    ax.set_title("chaos soak: fresh samples/s, faults marked")
    ax.legend(loc="lower right", fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ----------------------------------------------------------------------------- main
def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=30.0, help="training time per run")
    ap.add_argument("--every", type=float, default=30.0, help="seconds between faults")
    ap.add_argument("--pairs", type=int, default=1, help="(fault-free, chaos) pairs, alternating")
    ap.add_argument("--no-baseline", action="store_true", help="chaos runs only (no ratio)")
    ap.add_argument("--actors", type=int, default=8)
    ap.add_argument(
        "--groups",
        type=int,
        default=1,
        help="learner groups (> 1: the groups' layout and faults, chaos_groups.py)",
    )
    ap.add_argument(
        "--loopback", action="store_true", help="one machine's loopback, no link faults"
    )
    ap.add_argument(
        "--faults",
        type=lambda s: [k.strip() for k in s.split(",") if k.strip()],
        default=None,
        help=f"the fault kinds to take turns, comma-separated (default: all of {','.join(KINDS)}; "
        f"with --groups, of {','.join(chaos_groups.GROUP_KINDS)})",
    )
    ap.add_argument("--stop-s", type=float, default=10.0, help="how long an actor stays stopped")
    ap.add_argument("--cut-s", type=float, default=20.0, help="how long a link stays cut")
    ap.add_argument(
        "--cap-s", type=float, default=20.0, help=f"how long a link stays at {CAP_RATE}"
    )
    ap.add_argument(
        "--checkpoint-every",
        type=int,
        default=5,
        help="updates between checkpoints (5: near Young's sqrt(2 x save x time between learner "
        "kills) = sqrt(2 x 0.075 s x 150 s) = 4.7 s, about 7 updates of 0.64 s)",
    )
    ap.add_argument(
        "--no-standby",
        action="store_true",
        help="no warm standbys (runtime.standby_actors=false, runtime.standby_learner=false): "
        "killed actors and learners are replaced cold",
    )
    ap.add_argument("--config", default=CONFIG)
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="more overrides")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dir", default=None, help="runs go here (default: runs/chaos_<time>)")
    ap.add_argument("--out", default=None, help="JSON results (default: DIR/chaos.json)")
    ap.add_argument("--start-timeout", type=float, default=300.0)
    ap.add_argument("--stop-grace", type=float, default=90.0)
    args = ap.parse_args(argv)
    kinds = kinds_of(args)
    if args.faults is None:
        args.faults = list(kinds)
    unknown = [k for k in args.faults if k not in kinds]
    if unknown or not args.faults:
        ap.error(
            f"--faults: unknown kind(s) {unknown or '(none given)'}; known: {', '.join(kinds)}"
        )
    if args.groups > 1 and (args.loopback or args.actors % args.groups):
        ap.error("--groups: namespace hosts only (no --loopback), and --actors a multiple of it")
    args.repo = REPO
    args.dir = os.path.abspath(
        args.dir or os.path.join(REPO, "runs", time.strftime("chaos_%Y%m%d_%H%M%S"))
    )
    args.out = os.path.abspath(args.out or os.path.join(args.dir, "chaos.json"))
    args.compile_cache = os.path.join(args.dir, "xla")
    # a budget the run cannot spend in its time: it ends by time, so both arms alike
    args.total_env_steps = int(args.minutes * 60 * 100_000)
    from tianjax.config import load_config

    config = load_config(args.config, args.set)
    args.num_envs, args.rollout_len = config.num_envs, config.rollout_len
    return args


def main(argv=None) -> dict:
    args = parse(argv)
    os.makedirs(args.dir, exist_ok=True)
    if args.groups > 1:
        try:
            hosts = chaos_groups.GroupHosts(args.groups, args.actors)
        except NetnsError as e:
            sys.exit(f"chaos: --groups needs namespace hosts: {str(e).splitlines()[0]}")
        one_run = functools.partial(chaos_groups.run_once, margin_s=MARGIN_S, cap_rate=CAP_RATE)
        args.netns_prefix = hosts.cluster.prefix
        where = (
            f"namespace hosts (averager + {args.groups} group learner hosts + {args.actors} "
            "actor hosts, curve)"
        )
    else:
        hosts = Hosts(args.actors, loopback=args.loopback)
        one_run = run_once
        args.netns_prefix = hosts.cluster and hosts.cluster.prefix
        where = (
            f"namespace hosts (learner + {args.actors} actor hosts, curve)"
            if hosts.cluster is not None
            else f"loopback ({hosts.why}: link faults left out)"
        )
    print(f"chaos soak on {where}; runs in {args.dir}", flush=True)
    res = {"args": dict(vars(args)), "runs": []}
    res["figure"] = os.path.splitext(args.out)[0] + ".png"
    try:
        for i in range(args.pairs):
            arms = [True] if args.no_baseline else [False, True]
            for chaos in arms:
                name = f"{'chaos' if chaos else 'free'}-{i}"
                print(f"{name}: {args.minutes:g} min", flush=True)
                res["runs"].append(one_run(args, hosts, os.path.join(args.dir, name), chaos))
                # written after every run: a long study stopped part-way keeps what it has
                res["summary"] = report(args, res["runs"], where)
                with open(args.out, "w") as f:
                    json.dump(repo_relative(res), f, indent=1)
    finally:
        hosts.close()
    plot(res, res["figure"])
    print_table(args, res)
    return res


def repo_relative(obj):
    """`obj` with every path under the repository written relative to it (the repository
    itself as "."), so that a results file names no folder of the machine it ran on."""
    if isinstance(obj, dict):
        return {k: repo_relative(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [repo_relative(v) for v in obj]
    if isinstance(obj, str) and (obj == REPO or obj.startswith(REPO + os.sep)):
        return os.path.relpath(obj, REPO)
    return obj


def table(path: str) -> None:
    """Prints the table of a results file again."""
    with open(path) as f:
        res = json.load(f)
    print_table(argparse.Namespace(**{**res["args"], "out": path}), res)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--table"]:
        table(sys.argv[2])
    else:
        main()
