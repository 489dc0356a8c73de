"""Soak: a long async run under faults, watched for leaks and stalls.

    python experiments/tools/soak.py [--minutes 10] [--kill-every 30] [--garbage-rate 20]
        [--out FILE]

Starts `tianjax train configs/ppo_cartpole_async.yaml num_actors=4` (a budget that outlasts
--minutes unless --total-env-steps says otherwise) as a child process in its own process
group, and while it runs:

- kills a random actor process (SIGKILL) every --kill-every seconds once training is under
  way; the launcher must restart each one (runtime.max_actor_restarts is set high);
- streams garbage at the learner: it finds the launcher's listening tcp ports on
  127.0.0.1, connects a PUSH and a DEALER socket to each (ZeroMQ's handshake refuses
  incompatible socket types, so only PUSH->PULL (trajectories) and DEALER->ROUTER
  (control) connect; the others are closed after probing) and sends --garbage-rate random
  multi-frame messages a second: noise, empty and single frames, forged and garbled
  headers, tags of the wrong length, oversized headers and large leaves;
- samples every --sample-every seconds: updates per minute (metrics.jsonl `updates`, over
  a trailing --rate-window), the launcher's (= the learner's) resident memory, open file
  descriptors and threads, the actors' memory and how many are alive.

At the end (the run finished, or --minutes passed: SIGTERM, then wait) it prints a table
over time and a summary: actor restarts, messages rejected by the learner (by reason)
against garbage sent, the final return, memory growth (last / first sample after
--warmup seconds of training), the range of file descriptors, whether the bounds held,
and whether any process of the run was left behind. Everything also goes to --out as
JSON.

Counting notes. The learner counts only garbage that ZeroMQ delivered to its sockets: a
message still queued when the learner stops reading (flow control, the end of the run) is
never counted, and a send refused at our own high-water mark is counted as refused, not
sent, so `rejected <= sent`. A run stopped by SIGTERM writes no summary.json: restarts
then come from the launcher's console lines and rejects from the last metrics.jsonl
record (no split by reason); the summary says which source it used.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import zmq

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "ppo_cartpole_async.yaml"
ROLE_MARK = "tianjax.launch.role"
TAG_BYTES = 16
MAX_HEADER_BYTES = 1 << 20  # the codec refuses larger header frames unparsed ("size")
CONTROL_MAX_BYTES = 1 << 16  # the control channel refuses larger messages ("size")


# ----------------------------------------------------------------------------- processes
def _set_parent_death_signal() -> None:
    """In the launcher, before exec: SIGTERM it if this script dies (Linux), so that even
    a SIGKILLed soak leaves no training run behind."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def start_launcher(args, run_dir: Path, log_dir: Path) -> subprocess.Popen:
    overrides = [
        f"num_actors={args.actors}",
        f"runtime.max_actor_restarts={args.max_restarts}",
        f"total_env_steps={args.total_env_steps}",
        f"run_dir={run_dir}",
        *args.set,
    ]
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [
        sys.executable,
        "-m",
        "tianjax.cli",
        "train",
        str(args.config),
        *overrides,
        "--no-progress",
    ]
    with open(log_dir / "launcher.out", "wb") as out, open(log_dir / "launcher.err", "wb") as err:
        # NOTE: preexec_fn is safe here: the launcher starts before this script starts a thread
        return subprocess.Popen(
            cmd,
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=err,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_set_parent_death_signal
            if sys.platform.startswith("linux")  # noqa: PLW1509
            else None,
        )


def _gone(p: psutil.Process) -> bool:
    try:
        return not p.is_running() or p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def actor_processes(pid: int) -> list[psutil.Process]:
    """Live actor processes under the launcher `pid`, found by their command line."""
    out = []
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return out
    for p in children:
        try:
            cmd = p.cmdline()
            if (
                ROLE_MARK in cmd
                and cmd[cmd.index(ROLE_MARK) + 1 :][:1] == ["actor"]
                and not _gone(p)
            ):
                out.append(p)
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            pass
    return out


def actor_id(p: psutil.Process) -> int | None:
    try:
        cmd = p.cmdline()
        return int(cmd[cmd.index("--actor-id") + 1])
    except (ValueError, IndexError, psutil.Error):
        return None


def alive_pid(pid: int) -> bool:
    try:
        return not _gone(psutil.Process(pid))
    except psutil.Error:
        return False


def group_members(pgid: int) -> list[dict]:
    """Live processes in process group `pgid` (zombies hold nothing but a pid: not counted)."""
    out = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if os.getpgid(p.pid) == pgid and not _gone(p):
                out.append({"pid": p.pid, "cmdline": " ".join(p.info["cmdline"] or [])[:200]})
        except (ProcessLookupError, psutil.Error):
            pass
    return out


def listening_ports(pid: int) -> list[int]:
    try:
        conns = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.Error:
        return []
    return sorted(
        {
            c.laddr.port
            for c in conns
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.ip == "127.0.0.1"
        }
    )


def read_records(run_dir: Path) -> list[dict]:
    """metrics.jsonl so far (a half-written last line is skipped)."""
    from tianjax.metrics import read_metrics

    return read_metrics(str(run_dir))


class RecordTail:
    """Reads metrics.jsonl incrementally; keeps the newest record."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / "metrics.jsonl"
        self._pos = 0
        self._partial = b""
        self.latest: dict | None = None
        self.count = 0

    def poll(self) -> dict | None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._pos)
                chunk = f.read()
        except FileNotFoundError:
            return self.latest
        self._pos += len(chunk)
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        for line in lines:
            try:
                self.latest = json.loads(line)
                self.count += 1
            except ValueError:
                pass
        return self.latest


# ----------------------------------------------------------------------------- garbage
GARBAGE_KINDS = {  # kind -> weight
    "noise": 3,  # 1-6 frames of random bytes
    "one_frame": 2,  # a single frame: too few to be a message
    "empty_frames": 1,  # 1-64 empty frames
    "forged": 3,  # a well-formed header with a random tag
    "garbled_header": 2,  # a cut or bit-flipped header behind a random tag
    "bad_tag_len": 1,  # a tag frame of the wrong length
    "oversized": 0.5,  # a header frame over the codec's limit
    "large": 0.5,  # 1-3 MiB of leaves behind a random tag: the learner must MAC them
}


class GarbageStreamer(threading.Thread):
    """Connects PUSH and DEALER sockets to the learner's ports and sends random messages."""

    def __init__(self, ports: list[int], rate: float, seed: int, probe_s: float = 10.0):
        super().__init__(name="garbage", daemon=True)
        self.ports, self.rate, self.probe_s = ports, rate, probe_s
        self.rng = random.Random(seed)
        self._pool = os.urandom(4 << 20)  # slices of it make the large frames
        self._halt = threading.Event()
        self.connected: list[dict] = []  # {"type", "port"} pairs whose handshake succeeded
        self.refused_pairs: list[dict] = []
        self.sent = 0
        self.sent_bytes = 0
        self.refused_hwm = 0
        self.by_target = {"PUSH": 0, "DEALER": 0}
        self.by_kind = dict.fromkeys(GARBAGE_KINDS, 0)
        self.error: str | None = None
        # without the run's credentials every handshake is refused (the learner's
        # gatekeeper): then the garbage goes over raw TCP, at ZeroMQ's handshake parser
        self.handshake_refused = False
        self.raw_sent = 0

    def stop(self) -> None:
        self._halt.set()

    def _rand(self, n: int) -> bytes:
        return self.rng.randbytes(n)

    def _slice(self, n: int) -> memoryview:
        off = self.rng.randrange(len(self._pool) - n + 1)
        return memoryview(self._pool)[off : off + n]

    def _header(self, kind: str) -> bytes:
        n_leaves = self.rng.randrange(0, 8)
        h = {
            "m": "tianjax",
            "p": 2,
            "kind": kind,
            "schema": self._rand(8).hex(),
            "version": self.rng.randrange(-5, 10**6),
            "sender": f"actor-{self.rng.randrange(8)}",
            "seq": time.time_ns() + self.rng.randrange(-(10**9), 10**9),
            "nonce": self._rand(16).hex(),
            "leaves": [["float32", [self.rng.randrange(64), 16]] for _ in range(n_leaves)],
            "nbytes": self.rng.randrange(10**6),
        }
        if kind == "ctrl.up":
            h["body"] = {
                "type": self.rng.choice(["register", "heartbeat", "stop", "credit"]),
                "actor": self.rng.randrange(8),
            }
        return json.dumps(h).encode()

    def message(self, target: str) -> tuple[str, list]:
        kind = self.rng.choices(list(GARBAGE_KINDS), weights=list(GARBAGE_KINDS.values()))[0]
        rand, r = self._rand, self.rng
        hkind = "ctrl.up" if target == "DEALER" else "traj"
        if kind == "noise":
            frames = [rand(r.randrange(2049)) for _ in range(r.randrange(1, 7))]
        elif kind == "one_frame":
            frames = [rand(r.randrange(513))]
        elif kind == "empty_frames":
            frames = [b""] * r.randrange(1, 65)
        elif kind == "forged":
            frames = [rand(TAG_BYTES), self._header(hkind)] + [
                rand(r.randrange(4097)) for _ in range(r.randrange(0, 4))
            ]
        elif kind == "garbled_header":
            h = bytearray(self._header(hkind))
            if r.random() < 0.5:
                h = h[: r.randrange(len(h))]  # cut
            else:
                for _ in range(r.randrange(1, 8)):  # flip bytes
                    h[r.randrange(len(h))] = r.randrange(256)
            frames = [rand(TAG_BYTES), bytes(h), rand(r.randrange(1025))]
        elif kind == "bad_tag_len":
            n = r.choice([0, 1, 15, 17, 32, 64])
            frames = [rand(n), self._header(hkind)]
        elif kind == "oversized":
            limit = CONTROL_MAX_BYTES if target == "DEALER" else MAX_HEADER_BYTES
            frames = [rand(TAG_BYTES), self._slice(limit + r.randrange(1, 64 << 10))]
        else:  # large
            frames = [rand(TAG_BYTES), self._header(hkind)] + [
                self._slice(r.randrange(256 << 10, 1 << 20)) for _ in range(r.randrange(1, 4))
            ]
        return kind, frames

    def _connect_all(self, ctx: zmq.Context) -> list[tuple[str, int, zmq.Socket]]:
        """Both socket types to every port. With IMMEDIATE a socket is writable only over a
        completed connection, i.e. once the handshake accepted its type."""
        pending = []
        for port in self.ports:
            for name, kind in (("PUSH", zmq.PUSH), ("DEALER", zmq.DEALER)):
                s = ctx.socket(kind)
                s.linger = 0
                s.immediate = 1
                s.sndhwm = 8
                s.connect(f"tcp://127.0.0.1:{port}")
                pending.append((name, port, s))
        return pending

    def run(self) -> None:
        ctx = zmq.Context()
        pending = self._connect_all(ctx)
        live: list[tuple[str, zmq.Socket]] = []
        probe_until = time.monotonic() + self.probe_s
        try:
            period = 1.0 / self.rate
            t_next = time.monotonic()
            while not self._halt.is_set():
                now = time.monotonic()
                if pending:  # sockets whose handshake has not succeeded (yet)
                    for item in list(pending):
                        name, port, s = item
                        if s.poll(0, zmq.POLLOUT):
                            pending.remove(item)
                            live.append((name, s))
                            self.connected.append({"type": name, "port": port})
                        elif now > probe_until:  # refused: stop its reconnect attempts
                            pending.remove(item)
                            self.refused_pairs.append({"type": name, "port": port})
                            s.close(linger=0)
                    if not pending and not live:
                        self.handshake_refused = True
                        self._raw_garbage()
                        return
                if not live or now < t_next:
                    self._halt.wait(0.05 if not live else min(t_next - now, 0.05))
                    continue
                t_next = max(t_next + period, now - 1.0)  # catch up at most 1 s of backlog
                name, sock = self.rng.choice(live)
                kind, frames = self.message(name)
                size = sum(len(f) for f in frames)
                try:
                    sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=size < (64 << 10))
                except zmq.Again:
                    self.refused_hwm += 1
                    continue
                self.sent += 1
                self.sent_bytes += size
                self.by_target[name] += 1
                self.by_kind[kind] += 1
        except Exception as e:  # noqa: BLE001 - reported in the summary, never kills the soak
            self.error = f"{type(e).__name__}: {e}"
        finally:
            for _, _, s in pending:
                s.close(linger=0)
            for _, s in live:
                s.close(linger=0)
            ctx.term()

    def _raw_garbage(self) -> None:
        """Random bytes on fresh TCP connections (half behind a valid NULL greeting)."""
        greeting = b"\xff" + bytes(8) + b"\x7f\x03\x00" + b"NULL".ljust(20, b"\0") + bytes(32)
        period = 1.0 / self.rate
        while not self._halt.wait(period):
            port = self.rng.choice(self.ports)
            data = (greeting if self.rng.random() < 0.5 else b"") + self._rand(
                self.rng.randrange(1, 4097)
            )
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1.0) as s:
                    s.sendall(data)
            except OSError:
                continue  # closed by the learner mid-send: it is meant to
            self.sent += 1
            self.raw_sent += 1
            self.sent_bytes += len(data)

    def report(self) -> dict:
        return {
            "sent": self.sent,
            "raw_sent": self.raw_sent,
            "handshake_refused": self.handshake_refused,
            "sent_mib": self.sent_bytes / 2**20,
            "refused_at_hwm": self.refused_hwm,
            "by_target": {
                "PUSH->PULL (trajectories)": self.by_target["PUSH"],
                "DEALER->ROUTER (control)": self.by_target["DEALER"],
            },
            "by_kind": self.by_kind,
            "connected": self.connected,
            "refused_pairs": self.refused_pairs,
            "ports": self.ports,
            "error": self.error,
        }


# ----------------------------------------------------------------------------- sampling
def sample(
    launcher: psutil.Process,
    t: float,
    tail: RecordTail,
    garbage: GarbageStreamer | None,
    kills: int,
) -> dict:
    rec = tail.poll()
    s = {
        "t": round(t, 2),
        "updates": rec["updates"] if rec else None,
        "env_steps": rec["env_steps"] if rec else None,
        "return_mean_100": rec.get("return_mean_100") if rec else None,
        "rejected": rec.get("rejected_messages") if rec else None,
        "garbage_sent": garbage.sent if garbage else 0,
        "kills": kills,
    }
    try:
        with launcher.oneshot():
            s.update(
                launcher_rss_mib=launcher.memory_info().rss / 2**20,
                fds=launcher.num_fds(),
                threads=launcher.num_threads(),
            )
    except psutil.Error:
        s.update(launcher_rss_mib=None, fds=None, threads=None)
    rss = []
    for a in actor_processes(launcher.pid):
        try:
            rss.append(a.memory_info().rss / 2**20)
        except psutil.Error:
            pass
    s.update(
        actors_alive=len(rss), actors_rss_mib=sum(rss), actor_rss_max_mib=max(rss, default=None)
    )
    return s


def add_rates(samples: list[dict], window: float) -> None:
    """updates/min of each sample over the trailing window (script clock)."""
    for i, s in enumerate(samples):
        s["updates_per_min"] = None
        if s["updates"] is None:
            continue
        j = i - 1
        while j > 0 and samples[j]["t"] > s["t"] - window:
            j -= 1
        if j < 0:
            continue
        before = samples[j]["updates"] or 0  # no record yet: no update yet
        s["updates_per_min"] = 60.0 * (s["updates"] - before) / (s["t"] - samples[j]["t"])


# ----------------------------------------------------------------------------- report
def _fmt(v, spec=",.0f"):
    return "-" if v is None else format(v, spec)


def table(samples: list[dict], max_rows: int) -> list[str]:
    rows = samples
    if len(rows) > max_rows > 1:  # evenly thinned, first and last kept
        step = (len(rows) - 1) / (max_rows - 1)
        rows = [rows[round(i * step)] for i in range(max_rows)]
    lines = [
        (
            f"{'t s':>7} {'phase':<7}{'updates':>8}{'upd/min':>9}{'RSS MiB':>9}{'actors MiB':>11}"
            f"{'fds':>5}{'thr':>5}{'actors':>7}{'kills':>6}{'garbage':>8}{'rejected':>9}"
        )
    ]
    for s in rows:
        lines.append(
            f"{s['t']:>7.1f} {s['phase']:<7}{_fmt(s['updates']):>8}{_fmt(s['updates_per_min']):>9}"
            f"{_fmt(s['launcher_rss_mib']):>9}{_fmt(s['actors_rss_mib']):>11}{_fmt(s['fds']):>5}"
            f"{_fmt(s['threads']):>5}{s['actors_alive']:>7}{s['kills']:>6}{s['garbage_sent']:>8}"
            f"{_fmt(s['rejected']):>9}"
        )
    return lines


def summarise(args, samples, ended, summary, records, err_text, garbage, kills, leftovers) -> dict:
    steady = [s for s in samples if s["phase"] == "steady"]
    out: dict = {"ended": ended, "kills": len(kills)}
    # restarts: summary.json when the run wrote one, else the launcher's console lines
    console_restarts = err_text.count(") restarted; see ")
    if summary is not None:
        out.update(
            restarts=summary.get("actor_restarts"),
            actors_lost=summary.get("actors_lost"),
            restarts_source="summary.json",
        )
    else:
        out.update(
            restarts=console_restarts,
            actors_lost=err_text.count("is out of restarts"),
            restarts_source="launcher console (no summary.json)",
        )
    out["console_restarts"] = console_restarts
    last = records[-1] if records else {}
    if summary is not None:
        out.update(
            rejected=summary.get("rejected_messages"),
            rejected_by_reason=summary.get("rejected_by_reason"),
            rejected_source="summary.json",
            final_return=summary.get("final_return"),
            updates=summary.get("updates"),
            env_steps=summary.get("env_steps"),
        )
    else:
        out.update(
            rejected=last.get("rejected_messages"),
            rejected_by_reason=None,
            rejected_source="last metrics.jsonl record (no summary.json)",
            final_return=last.get("return_mean_100"),
            updates=last.get("updates"),
            env_steps=last.get("env_steps"),
        )
    g = garbage.report() if garbage else None
    out["garbage"] = g
    out["rejected_share_of_sent"] = (
        (out["rejected"] / g["sent"]) if g and g["sent"] and out["rejected"] is not None else None
    )
    rates = [s["updates_per_min"] for s in steady]
    out["steady_samples"] = len(steady)
    out["updates_per_min"] = {
        "min": min(rates, default=None),
        "median": statistics.median(rates) if rates else None,
        "max": max(rates, default=None),
        "all_positive": bool(rates) and all(r is not None and r > 0 for r in rates),
    }
    rss = [s["launcher_rss_mib"] for s in steady if s["launcher_rss_mib"] is not None]
    fds = [s["fds"] for s in steady if s["fds"] is not None]
    growth = rss[-1] / rss[0] if len(rss) >= 2 else None
    spread = max(fds) - min(fds) if fds else None
    out["rss_mib"] = {
        "first": rss[0] if rss else None,
        "last": rss[-1] if rss else None,
        "max": max(rss, default=None),
        "growth": growth,
        "bound": args.max_rss_growth,
        "held": growth is not None and growth <= args.max_rss_growth,
    }
    actor_rss = [s["actor_rss_max_mib"] for s in steady if s["actor_rss_max_mib"] is not None]
    out["actor_rss_max_mib"] = max(actor_rss, default=None)
    out["fds"] = {
        "min": min(fds, default=None),
        "max": max(fds, default=None),
        "spread": spread,
        "first": fds[0] if fds else None,
        "last": fds[-1] if fds else None,
        "bound": args.max_fd_spread,
        "held": spread is not None and spread <= args.max_fd_spread,
    }
    threads = [s["threads"] for s in steady if s["threads"] is not None]
    out["threads"] = {"min": min(threads, default=None), "max": max(threads, default=None)}
    out["actors_alive_min"] = min((s["actors_alive"] for s in steady), default=None)
    out["tracebacks_in_launcher_stderr"] = err_text.count("Traceback")
    out["leftover_processes"] = leftovers
    return out


def print_report(args, res: dict, samples: list[dict]) -> None:
    s = res["summary"]
    e = s["ended"]
    print(
        f"\nsoak: async PPO, envpool CartPole-v1, {args.actors} actors, {res['duration_s']:.0f} s "
        f"(asked {args.minutes:g} min), a kill every {args.kill_every:g} s, {args.garbage_rate:g} garbage msgs/s"
    )
    print(f"run: {e['how']}, exit code {e['exit_code']}; run dir {res['run_dir']}")
    print()
    print("\n".join(table(samples, args.table_rows)))
    print(
        f"(phase: warmup = the first {args.warmup:g} s of training; ending = the run had made its last "
        "update and was stopping; bounds and rates use the steady samples)"
    )
    print()
    print(
        f"actor restarts      {_fmt(s['restarts'])} ({s['restarts_source']}) for {s['kills']} kills; "
        f"actors lost {_fmt(s['actors_lost'])}; fewest alive after warm-up {_fmt(s['actors_alive_min'])}"
    )
    g = s["garbage"]
    if g:
        reasons = (
            ", ".join(f"{k} {v}" for k, v in sorted((s["rejected_by_reason"] or {}).items()))
            if s["rejected_by_reason"] is not None
            else "- (only summary.json has them)"
        )
        pairs = ", ".join(f"{c['type']}->{c['port']}" for c in g["connected"]) or "none"
        print(
            f"garbage sent        {g['sent']:,} msgs ({g['sent_mib']:.1f} MiB; "
            + ", ".join(f"{k} {v:,}" for k, v in g["by_target"].items())
            + f"); refused at our HWM {g['refused_at_hwm']:,}; connected {pairs}"
        )
        share = s["rejected_share_of_sent"]
        print(
            f"learner rejected    {_fmt(s['rejected'])} ({s['rejected_source']}): "
            f"{_fmt(share, '.1%') if share is not None else '-'} of sent; by reason: {reasons}"
        )
        if e["how"] == "finished":
            print(
                "                    (sent includes what came while the finished run was stopping its actors, "
                "no longer read)"
            )
        if g["error"]:
            print(f"garbage error       {g['error']}")
    print(
        f"final return        {_fmt(s['final_return'], '.1f')} after {_fmt(s['updates'])} updates, "
        f"{_fmt(s['env_steps'])} env steps"
    )
    u = s["updates_per_min"]
    print(
        f"updates/min         after warm-up ({s['steady_samples']} samples): min {_fmt(u['min'])}, "
        f"median {_fmt(u['median'])}, max {_fmt(u['max'])}; always > 0: {u['all_positive']}"
    )
    r = s["rss_mib"]
    print(
        f"learner RSS         {_fmt(r['first'])} -> {_fmt(r['last'])} MiB (max {_fmt(r['max'])}), "
        f"growth x{_fmt(r['growth'], '.3f')}; bound x{r['bound']:g}: {'held' if r['held'] else 'NOT held'}"
    )
    f = s["fds"]
    print(
        f"learner fds         {_fmt(f['min'])}..{_fmt(f['max'])} (first {_fmt(f['first'])}, last "
        f"{_fmt(f['last'])}), spread {_fmt(f['spread'])}; bound {f['bound']}: {'held' if f['held'] else 'NOT held'}"
    )
    print(
        f"learner threads     {_fmt(s['threads']['min'])}..{_fmt(s['threads']['max'])}; "
        f"actor RSS max {_fmt(s['actor_rss_max_mib'])} MiB"
    )
    print(
        f"left behind         {len(s['leftover_processes'])} processes of the run's group; "
        f"{s['tracebacks_in_launcher_stderr']} tracebacks in the launcher's stderr"
    )
    print(f"json                {args.out}")


# ----------------------------------------------------------------------------- main
def _on_signal(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--minutes", type=float, default=10.0, help="soak length from launch (default 10)"
    )
    ap.add_argument(
        "--kill-every", type=float, default=30.0, help="seconds between actor kills (0: none)"
    )
    ap.add_argument(
        "--garbage-rate", type=float, default=20.0, help="garbage messages per second (0: none)"
    )
    ap.add_argument("--actors", type=int, default=4)
    ap.add_argument(
        "--total-env-steps",
        type=int,
        default=None,
        help="the run's budget (default: 200k per second of --minutes, far more than it can do, "
        "so the soak ends by time)",
    )
    ap.add_argument("--sample-every", type=float, default=5.0, help="seconds between samples")
    ap.add_argument(
        "--rate-window", type=float, default=10.0, help="seconds over which updates/min is taken"
    )
    ap.add_argument(
        "--warmup",
        type=float,
        default=30.0,
        help="seconds of training (from the first metrics record) before samples count",
    )
    ap.add_argument(
        "--max-rss-growth", type=float, default=1.25, help="bound on last/first RSS after warm-up"
    )
    ap.add_argument(
        "--max-fd-spread", type=int, default=32, help="bound on max - min fds after warm-up"
    )
    ap.add_argument("--max-restarts", type=int, default=100_000, help="runtime.max_actor_restarts")
    ap.add_argument("--config", default=str(CONFIG))
    ap.add_argument(
        "--set", nargs="*", default=[], metavar="KEY=VALUE", help="more config overrides"
    )
    ap.add_argument(
        "--dir", default=None, help="where the run and logs go (default: runs/soak_<time>)"
    )
    ap.add_argument("--out", default=None, help="JSON results (default: DIR/soak.json)")
    ap.add_argument("--seed", type=int, default=0, help="seeds the kills and the garbage")
    ap.add_argument(
        "--stop-grace", type=float, default=60.0, help="seconds the run gets to stop after SIGTERM"
    )
    ap.add_argument("--table-rows", type=int, default=40)
    args = ap.parse_args()
    if args.total_env_steps is None:
        args.total_env_steps = int(args.minutes * 60 * 200_000)
    base = Path(args.dir or REPO / "runs" / time.strftime("soak_%Y%m%d_%H%M%S")).resolve()
    base.mkdir(parents=True, exist_ok=True)
    run_dir = base / "run"
    args.out = str(Path(args.out).resolve() if args.out else base / "soak.json")
    rng = random.Random(args.seed)

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    t0 = time.monotonic()
    proc = start_launcher(args, run_dir, base)
    (base / "launcher.pid").write_text(f"{proc.pid}\n")
    launcher = psutil.Process(proc.pid)
    tail = RecordTail(run_dir)
    garbage: GarbageStreamer | None = None
    samples: list[dict] = []
    kills: list[dict] = []
    seen_actor_pids: set[int] = set()
    ended = {"how": None, "exit_code": None, "sigterm_sent": False}
    t_train = None  # when the first metrics record appeared
    t_next_sample = t_next_kill = None
    t_next_scan = t0
    deadline = t0 + args.minutes * 60
    try:
        while True:
            now = time.monotonic()
            code = proc.poll()
            if code is not None:
                ended.update(how="finished" if code == 0 else "failed", exit_code=code)
                break
            if now >= deadline:
                ended["how"] = "deadline"
                break
            if garbage is None and args.garbage_rate > 0:
                ports = listening_ports(proc.pid)
                if len(ports) >= 3:  # the learner binds its three sockets together
                    garbage = GarbageStreamer(ports, args.garbage_rate, seed=rng.randrange(2**32))
                    garbage.start()
            if now >= t_next_scan:  # every actor process that ever ran, to check at the end
                t_next_scan = now + 0.5
                seen_actor_pids.update(a.pid for a in actor_processes(proc.pid))
            if t_train is None and tail.poll() is not None:
                t_train = now
                t_next_kill = now + args.kill_every if args.kill_every > 0 else None
            if t_next_kill is not None and now >= t_next_kill:
                t_next_kill += args.kill_every
                victims = actor_processes(proc.pid)
                if victims:
                    v = rng.choice(victims)
                    try:
                        aid = actor_id(v)
                        v.send_signal(signal.SIGKILL)
                        kills.append({"t": round(now - t0, 2), "pid": v.pid, "actor": aid})
                    except psutil.Error:
                        pass
            if t_next_sample is None or now >= t_next_sample:
                t_next_sample = (t_next_sample or now) + args.sample_every
                s = sample(launcher, now - t0, tail, garbage, len(kills))
                s["phase"] = (
                    "startup"
                    if t_train is None
                    else ("warmup" if now - t_train < args.warmup else "steady")
                )
                samples.append(s)
            time.sleep(0.1)
    except KeyboardInterrupt:
        ended["how"] = "interrupted"
    finally:

        def _hurry(signum, frame):  # a second Ctrl-C or SIGTERM: no more grace
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

        signal.signal(signal.SIGTERM, _hurry)
        signal.signal(signal.SIGINT, _hurry)
        if garbage is not None:
            garbage.stop()
        if proc.poll() is None:
            ended["sigterm_sent"] = True
            try:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=args.stop_grace)
            except subprocess.TimeoutExpired:
                ended["killed_after_grace"] = True
        # the run's own cleanup must have ended every process of its group; whatever is
        # left is recorded, then killed
        leftovers = group_members(proc.pid)
        if leftovers or proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            ended["exit_code"] = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        if garbage is not None:
            garbage.join(timeout=10)
    t_end = time.monotonic()

    # samples that saw the run's last record were taken after its last update, while the
    # launcher wrote its final checkpoint and stopped its actors. That holds also when the
    # deadline's SIGTERM came during that stop (a run stopped mid-training writes its last
    # record after the SIGTERM, so no sample saw it)
    records = read_records(run_dir)
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
    if summary is not None and records:
        final = records[-1]["updates"]
        for s in samples:
            if s["phase"] in ("warmup", "steady") and s["updates"] == final:
                s["phase"] = "ending"
    add_rates(samples, args.rate_window)
    err_text = (base / "launcher.err").read_text(errors="replace")
    still = [pid for pid in sorted(seen_actor_pids) if alive_pid(pid)]
    res = {
        "args": vars(args),
        "run_dir": str(run_dir),
        "launcher_pid": proc.pid,
        "duration_s": t_end - t0,
        "training_started_s": None if t_train is None else t_train - t0,
        "samples": samples,
        "kill_events": kills,
        "actor_pids_seen": sorted(seen_actor_pids),
        "actor_pids_alive_at_end": still,
        "summary": summarise(
            args, samples, ended, summary, records, err_text, garbage, kills, leftovers
        ),
        "run_summary": summary,
    }
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print_report(args, res, samples)
    return 0 if ended["how"] in ("finished", "deadline") else 1


if __name__ == "__main__":
    sys.exit(main())
