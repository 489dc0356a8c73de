"""What the chaos soak's two layouts (chaos.py, chaos_groups.py) share: the settings both
arms of every run take, the fault schedule (the kinds take turns, one fault at each turn;
each fault is a dict with its kind, its target, and when it started and ended,
time.time(); a timed one, a stop, cut or cap, is undone when its time is up or at the
run's end), and the run's clock."""

from __future__ import annotations

import functools
import signal
import time

import psutil

from tianjax.launch import NetnsError

ROLE_MARK = "tianjax.launch.role"  # in every role process's command line


def role_procs(launcher_pid: int, role: str) -> list[psutil.Process]:
    """The live processes of `role` (actor, learner) under a launch process."""
    out = []
    try:
        children = psutil.Process(launcher_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return out
    for p in children:
        try:
            cmd = p.cmdline()
            if ROLE_MARK in cmd and cmd[cmd.index(ROLE_MARK) + 1 :][:1] == [role]:
                if p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
        except psutil.Error:
            pass
    return out


def actor_proc(launcher_pid: int, actor: int) -> psutil.Process | None:
    """The process acting as `actor`: with warm standbys (runtime.standby_actors) there are
    two of that id, and the standby is always the one started after the other."""
    mine = []
    for p in role_procs(launcher_pid, "actor"):
        try:
            cmd = p.cmdline()
            if int(cmd[cmd.index("--actor-id") + 1]) == actor:
                mine.append(((p.create_time(), p.pid), p))
        except (psutil.Error, ValueError, IndexError):
            pass
    return min(mine, key=lambda m: m[0])[1] if mine else None


def learner_proc(launcher_pid: int) -> psutil.Process | None:
    """The working learner process: with a warm standby (runtime.standby_learner) there are
    two, and the standby is always the one started after the other (a standby that took
    over keeps its command line)."""
    mine = []
    for p in role_procs(launcher_pid, "learner"):
        try:
            mine.append(((p.create_time(), p.pid), p))
        except psutil.Error:
            pass
    return min(mine, key=lambda m: m[0])[1] if mine else None


def shared_overrides(args, run_dir: str) -> list[str]:
    """The config overrides of every run, in either layout (the layout adds its own)."""
    return [
        f"num_actors={args.actors}",
        f"total_env_steps={args.total_env_steps}",
        "log_every=1",
        "runtime.max_actor_restarts=1000",
        f"checkpoint.every={args.checkpoint_every}",
        f"runtime.standby_actors={str(not args.no_standby).lower()}",
        f"compile_cache={args.compile_cache}",
        f"seed={args.seed}",
        f"run_dir={run_dir}",
    ]


class FaultTurns:
    """The turns and their bookkeeping; a layout's subclass makes each fault (start_next)."""

    def __init__(self, args, kinds: list[str], margin_s: float):
        """`margin_s`: a fault starts only if it and this long after it fit before the end."""
        self.args, self.kinds, self.margin_s = args, list(kinds), margin_s
        self.done: list[dict] = []
        self.skipped: list[dict] = []
        self.active: list[tuple[float, dict, object]] = []  # (when it ends, fault, undo)
        self._n = 0

    def duration(self, kind: str) -> float:
        a = self.args
        return {
            "actor_stop": a.stop_s,
            "link_cut": a.cut_s,
            "group_cut": a.cut_s,
            "link_cap": a.cap_s,
        }.get(kind, 0.0)

    def next_fits(self, now: float, end: float) -> bool:
        kind = self.kinds[self._n % len(self.kinds)]
        return now + self.duration(kind) + self.margin_s <= end

    def take_turn(self) -> tuple[str, int]:
        """The next turn's kind and number (each layout takes its targets in turn by it)."""
        n, self._n = self._n, self._n + 1
        return self.kinds[n % len(self.kinds)], n

    def started(self, fault: dict, undo=None) -> dict:
        """Records a fault just made; `undo` (a timed one's) is called when its time is up."""
        fault["start"] = fault["end"] = time.time()
        if undo is not None:
            self.active.append((fault["start"] + self.duration(fault["kind"]), fault, undo))
        self.done.append(fault)
        return fault

    def skip(self, fault: dict, why: str) -> None:
        """A fault whose target is not there (still restarting after an earlier one) is
        skipped, and said in the results."""
        self.skipped.append({**fault, "at": time.time(), "why": why})

    def end_due(self, force: bool = False) -> None:
        now = time.time()
        for item in list(self.active):
            ends, fault, undo = item
            if force or now >= ends:
                try:
                    undo()
                except (psutil.Error, OSError, NetnsError) as e:
                    fault["undo_error"] = str(e)
                fault["end"] = time.time()
                self.active.remove(item)


def hit_actor(kind: str, p: psutil.Process, fault: dict):
    """SIGKILL (actor_kill) or SIGSTOP (actor_stop) of the actor process `p`, its pid noted
    in `fault`; returns the stop's undo (SIGCONT), or None."""
    fault["pid"] = p.pid
    p.send_signal(signal.SIGKILL if kind == "actor_kill" else signal.SIGSTOP)
    return functools.partial(p.send_signal, signal.SIGCONT) if kind == "actor_stop" else None


def drive(args, faults: FaultTurns, chaos: bool, gone, training, name) -> tuple[str, float | None]:
    """A run's clock: waits for training to start (`training()` true), then runs --minutes
    of it, a fault every --every s in a chaos run and the timed ones ended when due; it
    stops early when `gone()` says why (a process exited). Returns how it ended and when
    training started (time.time(); None: never). `name(fault)`: its target, for the log."""
    t_launch, t_train, t_next = time.time(), None, 0.0
    while True:
        now = time.time()
        why = gone()
        if why:
            return why, t_train
        if t_train is None:
            if training():
                t_train, t_next = now, now + args.every
            elif now - t_launch > args.start_timeout:
                return "never started training", t_train
        else:
            t_end = t_train + args.minutes * 60
            if now >= t_end:
                return "deadline", t_train
            faults.end_due()
            if chaos and faults.kinds and now >= t_next:
                t_next += args.every
                if faults.next_fits(now, t_end):
                    f = faults.start_next()
                    if f is not None:
                        print(f"  {now - t_train:6.1f} s  {f['kind']} {name(f)}", flush=True)
        time.sleep(0.05)


__all__ = [
    "FaultTurns",
    "actor_proc",
    "drive",
    "hit_actor",
    "learner_proc",
    "role_procs",
    "shared_overrides",
]
