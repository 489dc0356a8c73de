"""The cluster model: a discrete-event simulation of tianjax's actors, transport and
learner, checked against the scaling table measured on this machine, then asked about
clusters this machine cannot hold.

    python experiments/studies/scaling/cluster_model.py check
        [--runs experiments/studies/scaling/results/runs.jsonl]
        [--costs experiments/studies/scaling/results/costs.json]
    python experiments/studies/scaling/cluster_model.py predict
        [--actors 64 128 256 512 1024] [--learner-hosts 8]

What is simulated (configs/ppo_latency_async.yaml's run, the mechanics of
tianjax.runtime.actor.actor and tianjax.runtime.learner.learner):

- an actor: waits for a credit (async) or for the parameters after its last trajectory
  (sync); acts T = 32 vector steps, each a policy step plus env dynamics on the CPU
  (`act_cpu_ms_per_step`) and then the simulator's delay, drawn with the env's own
  `draw_delay_s` from the actor's own stream; encodes and sends the trajectory
  (`traj_send_cpu_ms`; the wire: `traj_bytes` at `wire_s_per_byte`);
- the learner: decodes and checks each trajectory (`traj_recv_cpu_ms`), drops one staler
  than `staleness.max_staleness` on arrival (its credit back), takes a batch of k
  trajectories (the oldest first) while at most one update is queued behind the running
  one (QUEUED) and the newest finished update's parameters have gone out, hands their
  credits back, and runs the update (`update_wall_ms` at k trajectories, as CPU work at
  its measured parallelism `update_cpu_over_wall`); its publisher thread sends the newest
  finished parameters beside the next update (`publish_cpu_ms` for the actors
  subscribed). Sync: it waits for one trajectory of the current version from every actor;
- the balance controller: tianjax's own `AdaptiveBalance`, fed every period with the
  staleness consumed and the pace, its window split into per-actor credits as the
  runtime splits it;
- the CPU: every host is a processor-sharing server of `cores` cores (a job runs at
  min(its parallelism, its fair share) cores: this machine's 2 cores shared by N actor
  processes and the learner). Sleeping costs nothing.

What is not simulated, and taken from the measured runs instead: learning. A run
converges once the samples learned after its first update reach what the measured run
of that (case, N, mode) learned by its convergence (fresh/s x conv. from the first
update); the model predicts how long the system takes to deliver and learn them. So
"fresh/s" and "conv. upd." are one check (conv = samples / fresh/s) of the system's
speed, not of PPO's sample efficiency; start-up (processes, imports, compilation) is not
modelled, and the table compares from the end of the first update, as the scaling table
does.

The check runs every (case, N, mode) of the stored scaling study (scaling.py, beside this file,
--out) with 3 seeds of the simulated delays and prints the model's median beside the
measured one, with the relative error of fresh/s; tau, learner busy and the actors'
wait are shown for comparison (the measured wait also counts each actor's start-up wait
for its first parameters, which the model leaves out).

predict: N actors, each on a host of its own (one core: a robot or a game server and the
policy beside it, so no CPU is shared between actors), the learner on `--learner-hosts`
GPU hosts, data-parallel. Its update time on a GPU is an assumption, not a measurement
(no GPU here): `--gpu-update-ms` fixed plus `--gpu-ms-per-traj` per trajectory per host,
plus an all-reduce of `--allreduce-ms` per minibatch step once there is more than one host.
The learner's batch is every actor's trajectory (k = N) in sync mode, and in async mode
too unless `--async-batch` says otherwise (as the shipped config does: a smaller async
batch means more updates per trajectory acted, so staleness ~ N / k, and the controller
then shrinks the window, idling actors, to hold its target). Convergence: sync runs
`--updates` updates; the samples to converge are held equal in both modes, times
`--sample-cost` for async (what its staleness costs in samples: the measured ratio of
async's samples to sync's at 16 and 32 actors is the figure to pass).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import heapq
import json
import math
import os
import statistics
import sys
from dataclasses import dataclass, field

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))

from tianjax.envs import Latency, draw_delay_s  # noqa: E402
from tianjax.runtime import AdaptiveBalance  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
RUNS = os.path.join(HERE, "results", "runs.jsonl")
COSTS = os.path.join(HERE, "results", "costs.json")
CASES = {  # as scaling.py runs them, on the shipped env_options
    "sigma0": dict(sigma=0.0, hiccup_p=0.0),
    "sigma1": {},
    "slow4": dict(slow_actors=(0,), slow_factor=4.0),
}
SHIPPED = dict(step_ms=16.0, sigma=1.0, hiccup_p=0.01, hiccup_ms=300.0)
QUEUED = 1  # tianjax.runtime.learner.learner.QUEUED


# ---------------------------------------------------------------------- the engine
class Engine:
    """Time-ordered callbacks, and processes written as generators that yield requests
    (Sleep, Cpu, Wait) and are resumed when the request is met."""

    def __init__(self):
        self.now = 0.0
        self._heap: list = []
        self._seq = 0

    def at(self, t: float, fn) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, fn))

    def start(self, gen) -> None:
        self.resume(gen)

    def resume(self, gen, value=None) -> None:
        try:
            request = gen.send(value)
        except StopIteration:
            return
        request.schedule(self, gen)

    def run(self, done) -> None:
        """Runs until `done()` holds (checked after every event) or nothing is left."""
        while self._heap and not done():
            t, _, fn = heapq.heappop(self._heap)
            self.now = t
            fn()


@dataclass
class Sleep:
    seconds: float

    def schedule(self, eng: Engine, gen) -> None:
        eng.at(eng.now + max(self.seconds, 0.0), lambda: eng.resume(gen))


class Signal:
    """Wakes every process waiting on it when fired (they re-check their condition)."""

    def __init__(self):
        self.waiting: list = []

    def fire(self, eng: Engine) -> None:
        waiting, self.waiting = self.waiting, []
        for gen in waiting:
            eng.at(eng.now, lambda g=gen: eng.resume(g))


@dataclass
class Wait:
    signal: Signal

    def schedule(self, eng: Engine, gen) -> None:
        self.signal.waiting.append(gen)


class Host:
    """A CPU of `cores` cores (`inf`: every job a core of its own), with two kinds of job,
    as Linux's scheduler treats them:

    - priority 0, a short burst after a sleep (an actor's step, a message): served first
      come, first served, each on a core of its own (bursts of a millisecond or two end
      within the scheduler's time slice, and a thread that wakes from a sleep preempts one
      that has been running);
    - priority 1, a long computation (the update): the cores the bursts leave, shared
      fairly, each job at most at its parallelism (water-filling), and never less than its
      threads' fair share among all runnable threads (the scheduler's fairness).

    So on a saturated machine the update gets about the share one more runnable thread
    would, far less than it needs."""

    def __init__(self, eng: Engine, cores: float):
        self.eng, self.cores = eng, cores
        self.jobs: dict[int, list] = {}  # id: [remaining core-seconds, parallelism, process, rate]
        self._last = 0.0
        self._token = 0
        self._ids = 0

    def _advance(self) -> None:
        dt = self.eng.now - self._last
        if dt > 0:
            for job in self.jobs.values():
                job[0] -= job[3] * dt
        self._last = self.eng.now

    def _share(self) -> None:
        bursts = [j for j in self.jobs.values() if j[4] == 0]  # in arrival order (dicts keep it)
        jobs = sorted((j for j in self.jobs.values() if j[4] == 1), key=lambda j: j[1])
        # the computations' floor: their threads' fair share among every runnable thread
        threads = sum(j[1] for j in jobs)
        floor = (
            min(threads, self.cores * threads / (len(bursts) + threads))
            if jobs and math.isfinite(self.cores)
            else 0
        )
        left = self.cores - floor
        for job in bursts:
            job[3] = min(job[1], left)
            left -= job[3]
        left += floor
        for i, job in enumerate(jobs):
            job[3] = min(job[1], left / (len(jobs) - i))
            left -= job[3]

    def _reschedule(self) -> None:
        self._token += 1
        if not self.jobs:
            return
        self._share()
        running = [j for j in self.jobs.values() if j[3] > 0]
        t = min(max(j[0], 0.0) / j[3] for j in running)
        token = self._token
        self.eng.at(self.eng.now + t, lambda: self._complete(token))

    def _complete(self, token: int) -> None:
        if token != self._token:
            return
        self._advance()
        done = [k for k, j in self.jobs.items() if j[0] <= 1e-12]
        if not done:  # rounding: the nearest one of those running
            done = [
                min(
                    (k for k in self.jobs if self.jobs[k][3] > 0),
                    key=lambda k: self.jobs[k][0] / self.jobs[k][3],
                )
            ]
        gens = [self.jobs.pop(k)[2] for k in done]
        self._reschedule()
        for gen in gens:
            self.eng.resume(gen)

    def submit(self, work_s: float, parallelism: float, gen, priority: int = 0) -> None:
        self._advance()
        self._ids += 1
        self.jobs[self._ids] = [max(work_s, 1e-12), parallelism, gen, 0.0, priority]
        self._reschedule()


@dataclass
class Cpu:
    host: Host
    work_s: float  # core-seconds
    parallelism: float = 1.0
    priority: int = 0  # 0: a burst after a sleep; 1: a long computation (see Host)

    def schedule(self, eng: Engine, gen) -> None:
        self.host.submit(self.work_s, self.parallelism, gen, self.priority)


# ---------------------------------------------------------------------- the costs
@dataclass
class Costs:
    """Measured here by cluster_costs.py (milliseconds unless said)."""

    act_cpu_ms_per_step: float  # policy step + env dynamics + the actor's Python, one vector step
    traj_send_cpu_ms: float  # encode and send one trajectory (actor)
    traj_recv_cpu_ms: float  # receive, check and decode one (learner)
    traj_bytes: float
    wire_s_per_byte: float  # loopback: the wall time of a message per byte beyond the CPU above
    update_wall_ms: dict  # trajectories per batch -> wall ms of one update (alone on the machine)
    update_cpu_over_wall: (
        float  # the update's parallelism (XLA:CPU's threads), where update_cpu_ms is not given
    )
    publish_fit_a_ms: float
    publish_fit_b_ms_per_sub: float
    update_cpu_ms: dict | None = (
        None  # trajectories per batch -> CPU ms of one update (all its threads)
    )
    param_take_cpu_ms: float = (
        0.0  # an actor taking a newer version of the parameters (decode, check)
    )

    @classmethod
    def load(cls, path: str) -> "Costs":
        with open(path) as f:
            c = json.load(f)
        wire = c.get("traj_wire_s_per_byte")
        if wire is None:  # the message's wall time beyond its two sides' CPU, per byte
            extra = (
                c.get("traj_wall_ms_median", c.get("traj_wall_ms", 0.0))
                - c["traj_send_cpu_ms"]
                - c["traj_recv_cpu_ms"]
            )
            wire = max(extra, 0.0) / 1e3 / c["traj_bytes"]
        # an actor's CPU per vector step in a run: acting (policy, env dynamics, Python) plus
        # what waking from each simulated delay costs (cluster_costs.py measures both)
        act = c.get("actor_cpu_ms_per_step", c["act_cpu_ms_per_step"])
        cpu = c.get("update_cpu_ms")
        return cls(
            act_cpu_ms_per_step=act,
            traj_send_cpu_ms=c["traj_send_cpu_ms"],
            traj_recv_cpu_ms=c["traj_recv_cpu_ms"],
            traj_bytes=c["traj_bytes"],
            wire_s_per_byte=wire,
            update_wall_ms={int(k): v for k, v in c["update_wall_ms"].items()},
            update_cpu_over_wall=c.get("update_cpu_over_wall_median", 1.0),
            publish_fit_a_ms=c["publish_fit_a_ms"],
            publish_fit_b_ms_per_sub=c["publish_fit_b_ms_per_sub"],
            update_cpu_ms=None if cpu is None else {int(k): v for k, v in cpu.items()},
            param_take_cpu_ms=c.get("param_take_cpu_ms", 0.0),
        )

    def update_ms(self, k: int) -> float:
        """Wall ms of an update on k trajectories (alone on the machine)."""
        return interpolate(self.update_wall_ms, k)

    def update_parallelism(self, k: int) -> float:
        """Cores the update keeps busy: its CPU over its wall time."""
        if self.update_cpu_ms is None:
            return self.update_cpu_over_wall
        return interpolate(self.update_cpu_ms, k) / interpolate(self.update_wall_ms, k)

    def publish_ms(self, subscribers: int) -> float:
        return self.publish_fit_a_ms + self.publish_fit_b_ms_per_sub * subscribers


def interpolate(points: dict, k: float) -> float:
    """The measured point at k, or linear between the two nearest (beyond the ends: the
    nearest segment's slope)."""
    pts = sorted(points.items())
    if k in points:
        return points[k]
    if len(pts) == 1:
        return pts[0][1]
    below = [p for p in pts if p[0] < k]
    above = [p for p in pts if p[0] > k]
    if not above:
        (k0, v0), (k1, v1) = pts[-2], pts[-1]
    elif not below:
        (k0, v0), (k1, v1) = pts[0], pts[1]
    else:
        (k0, v0), (k1, v1) = below[-1], above[0]
    return v0 + (v1 - v0) * (k - k0) / (k1 - k0)


@dataclass
class Setup:
    """One simulated run."""

    mode: str  # sync | async
    n: int  # actors
    latency: Latency
    costs: Costs
    samples: float  # fresh samples to learn after the first update (then: converged)
    cores: float = 2.0  # this machine; math.inf: every actor on a host of its own
    seed: int = 0
    envs: int = 16
    rollout: int = 32
    batch: int | None = None  # trajectories per update (None: one per actor)
    credits_per_actor: int = 2
    max_staleness: int = 8
    target_staleness: float = 2.0
    update_ms: object = None  # callable k -> ms (None: the measured CPU update)
    update_parallelism: float | None = None  # None: the measured CPU one
    learner_cores: float | None = None  # None: the learner shares `cores` with the actors
    learner_hosts: int = 1  # data-parallel learner processes, each with its actors' share
    gpu: bool = False  # the update runs on an accelerator of its own (update_ms), not the CPU
    # lock-step learners (jax.distributed): actor i feeds learner i mod lockstep, and an
    # update takes batch / lockstep trajectories from each learner's own pool
    lockstep: int = 1
    steps_per_traj: int = field(init=False)

    def __post_init__(self):
        self.steps_per_traj = self.envs * self.rollout


@dataclass
class Traj:
    actor: int
    version: int


def simulate(s: Setup) -> dict:
    """Runs `s` until its samples are learned after the first update; returns what the
    scaling table reports (fresh/s and conv. from the end of the first update, mean tau of
    the consumed samples, the learner's busy fraction and the actors' wait fraction over
    the same stretch)."""
    eng = Engine()
    costs, n = s.costs, s.n
    k = s.batch or n
    shared = math.isfinite(s.cores)
    actor_hosts = [Host(eng, s.cores)] * n if shared else [Host(eng, 1.0) for _ in range(n)]
    learner_host = (
        actor_hosts[0]
        if shared and s.learner_cores is None
        else Host(eng, s.learner_cores or s.cores)
    )
    update_ms = s.update_ms or costs.update_ms

    def parallelism(k: int) -> float:
        par = s.update_parallelism or costs.update_parallelism(k)
        return min(par, s.cores) if shared else par

    update_host = Host(eng, 1.0) if s.gpu else learner_host
    # each learner process publishes to its own actors, beside the others
    publish_ms = costs.publish_ms(math.ceil(n / s.learner_hosts))

    st = dict(
        published=0,
        finished=0,
        dispatched=0,
        fresh=0,
        first_end=None,
        first_fresh=0,
        busy=0.0,
        busy_first=0.0,
        tau_sum=0.0,
        tau_n=0,
        dropped=0,
        done=False,
        t_end=None,
        wait=0.0,
        wait_first=None,
        credit_wait=0.0,
    )
    pool: collections.deque = collections.deque()
    pools = [collections.deque() for _ in range(s.lockstep)]  # lock-step: one per learner
    queue: collections.deque = collections.deque()
    inflight = [0] * n  # trajectories acted, in flight or pooled, per actor (credits taken)
    held = [0] * n  # the parameter version each actor holds
    waiting_since = [None] * n  # an actor's current wait (credit / parameters) began then
    credit_sig = [Signal() for _ in range(n)]
    param_sig, pool_sig, update_sig, publish_sig = Signal(), Signal(), Signal(), Signal()
    ctrl = AdaptiveBalance(
        adaptive=True,
        target_staleness=s.target_staleness,
        batch_trajectories=k,
        max_credits_per_actor=s.credits_per_actor,
        max_publish_every=1,
        max_reuse=0,
        n_actors=n,
        period_s=1.0,
    )

    def credits(i: int) -> int:
        return ctrl.actions.credits(i, n) if s.mode == "async" else 1

    def waits_now() -> float:
        return st["wait"] + sum(eng.now - w for w in waiting_since if w is not None)

    def actor(i: int):
        rng = np.random.default_rng([i, s.seed, 0x1A7E])
        factor = s.latency.factor(i)
        host = actor_hosts[i]
        step_s = costs.act_cpu_ms_per_step / 1e3
        while True:
            if s.mode == "async":
                if inflight[i] >= credits(i):
                    waiting_since[i] = eng.now
                    while inflight[i] >= credits(i):
                        yield Wait(credit_sig[i])
                    st["wait"] += eng.now - waiting_since[i]
                    st["credit_wait"] += eng.now - waiting_since[i]
                    waiting_since[i] = None
            inflight[i] += 1
            version = st["published"]
            if version != held[i]:  # a newer version waits: taken (decoded, checked) first
                held[i] = version
                if costs.param_take_cpu_ms:
                    yield Cpu(host, costs.param_take_cpu_ms / 1e3)
                version = st["published"]
            if shared:
                for _ in range(s.rollout):
                    yield Cpu(host, step_s)
                    yield Sleep(draw_delay_s(rng, s.latency, factor))
                yield Cpu(host, costs.traj_send_cpu_ms / 1e3)
            else:  # a core of its own: nothing to share, one event per trajectory
                delays = sum(draw_delay_s(rng, s.latency, factor) for _ in range(s.rollout))
                yield Sleep(s.rollout * step_s + delays + costs.traj_send_cpu_ms / 1e3)
            eng.start(deliver(Traj(i, version)))
            if s.mode == "sync":
                waiting_since[i] = eng.now
                while st["published"] < version + 1:
                    yield Wait(param_sig)
                st["wait"] += eng.now - waiting_since[i]
                waiting_since[i] = None

    def deliver(traj: Traj):
        yield Sleep(costs.traj_bytes * costs.wire_s_per_byte)
        yield Cpu(learner_host, costs.traj_recv_cpu_ms / 1e3)
        if s.mode == "async" and st["dispatched"] - traj.version > s.max_staleness:
            st["dropped"] += 1  # too stale on arrival: dropped, its credit back
            inflight[traj.actor] -= 1
            credit_sig[traj.actor].fire(eng)
            return
        (pools[traj.actor % s.lockstep] if s.lockstep > 1 else pool).append(traj)
        pool_sig.fire(eng)

    def take() -> list | None:
        if s.mode == "sync":
            current = [t for t in pool if t.version == st["finished"]]
            if len(current) < n or queue:
                return None
            for t in current:
                pool.remove(t)
            return current
        # at most QUEUED updates behind the running one, and only once the parameters of the
        # newest finished update have gone out (the credits handed back are acted with them)
        if s.lockstep > 1:  # every learner's share, from its own actors (the oldest first)
            share = k // s.lockstep
            if any(len(p) < share for p in pools) or len(queue) > QUEUED:
                return None
            if st["published"] < st["finished"]:
                return None
            return [p.popleft() for p in pools for _ in range(share)]
        if len(pool) < k or len(queue) > QUEUED or st["published"] < st["finished"]:
            return None
        return [pool.popleft() for _ in range(k)]

    def learner():
        while not st["done"]:
            batch = take()
            if batch is None:
                yield Wait(pool_sig)
                continue
            taus = [max(st["dispatched"] - t.version, 0) for t in batch]
            st["dispatched"] += 1
            ctrl.consumed(float(sum(taus)) * s.steps_per_traj, len(taus) * s.steps_per_traj)
            for t in batch:
                inflight[t.actor] -= 1
                credit_sig[t.actor].fire(eng)
            queue.append((batch, taus))
            update_sig.fire(eng)

    def updater():
        while True:
            while not queue:
                yield Wait(update_sig)
            batch, taus = queue[0]
            t0 = eng.now
            wall_s, par = update_ms(len(batch)) / 1e3, parallelism(len(batch))
            yield Cpu(update_host, wall_s * par, par, priority=1)
            st["busy"] += eng.now - t0
            queue.popleft()
            st["finished"] += 1
            publish_sig.fire(eng)
            if st["first_end"] is None:
                st["first_end"], st["busy_first"], st["wait_first"] = (
                    eng.now,
                    st["busy"],
                    waits_now(),
                )
                st["first_fresh"] = len(batch) * s.steps_per_traj
            else:
                st["fresh"] += len(batch) * s.steps_per_traj
                st["tau_sum"] += sum(taus) * s.steps_per_traj
                st["tau_n"] += len(taus) * s.steps_per_traj
                if st["fresh"] >= s.samples:
                    st["done"], st["t_end"] = True, eng.now
            pool_sig.fire(eng)

    def publisher():
        # the publisher thread: the newest finished parameters, encoded once and sent to
        # every subscriber, beside the next update (an older version not yet sent is skipped)
        while True:
            while st["published"] >= st["finished"]:
                yield Wait(publish_sig)
            version = st["finished"]
            yield Cpu(learner_host, publish_ms / 1e3)
            st["published"] = version
            param_sig.fire(eng)
            pool_sig.fire(eng)

    def controller():
        wall0 = eng.now
        while not st["done"]:
            yield Sleep(1.0)
            ctrl.decide(
                eng.now,
                busy_s=st["busy"],
                credit_wait_s=st["credit_wait"]
                + sum(eng.now - w for w in waiting_since if w is not None),
                actor_wall_s=n * (eng.now - wall0),
            )
            for sig in credit_sig:
                sig.fire(eng)

    for i in range(n):
        eng.start(actor(i))
    eng.start(learner())
    eng.start(updater())
    eng.start(publisher())
    if s.mode == "async":
        eng.start(controller())
    eng.run(lambda: st["done"])
    span = (st["t_end"] or eng.now) - st["first_end"]
    return {
        "fresh": st["fresh"] / span,
        "conv": span,
        "tau": st["tau_sum"] / st["tau_n"] if st["tau_n"] else 0.0,
        "busy": (st["busy"] - st["busy_first"]) / span,
        "wait": (waits_now() - st["wait_first"]) / (n * span),
        "dropped": st["dropped"],
        "window": ctrl.actions.window,
    }


# ---------------------------------------------------------------------- check
def latency_of(case: str, overrides: dict | None = None) -> Latency:
    return Latency(**{**SHIPPED, **CASES[case], **(overrides or {})})


def measured_table(paths: list[str]) -> dict:
    rows = []
    for path in paths:
        with open(path) as f:
            rows += [json.loads(line) for line in f if line.strip()]
    table: dict = {}
    for r in rows:
        if r.get("fresh") and r.get("conv"):
            table.setdefault((r["case"], r["n"], r["mode"]), []).append(r)
    return table


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def actor_cpu_ms_per_step(run: dict) -> float:
    """An actor's CPU ms per vector step in a measured run: the actors' CPU time (their
    heartbeats', summed) over the vector steps they made."""
    s = run["summary"]
    return s["actor_time_s"]["cpu"] / (s["env_steps"] / 16) * 1e3


def check(args) -> None:
    costs = Costs.load(args.costs)
    table = measured_table(args.runs)

    def shown(path: str) -> str:  # the repository's files by their place in it
        rel = os.path.relpath(os.path.abspath(path), os.path.join(HERE, "..", "..", ".."))
        return path if rel.startswith("..") else rel

    print(
        f"The model against the measured scaling table ({', '.join(map(shown, args.runs))}); costs from "
        f"{shown(args.costs)}, "
        f"an actor's CPU per vector step {'as each row measured it' if args.actor_cpu == 'runs' else 'from it'}; "
        f"{args.cores:g} cores; model: median of {args.seeds} simulated seeds, the samples each row learned"
    )
    print(
        f"{'case':<7}{'N':>3} {'mode':<6}{'runs':>5}{'fresh/s':>9}{'model':>9}{'error':>8}"
        f"{'conv. upd.':>11}{'model':>7}{'tau':>6}{'model':>6}{'busy':>6}{'model':>6}{'wait':>6}{'model':>6}"
    )
    worst = 0.0
    for case, n, mode in sorted(
        table, key=lambda c: (list(CASES).index(c[0]), c[1], c[2] == "async")
    ):
        rs = table[case, n, mode]
        samples = med([r["fresh"] * r["conv"] for r in rs])
        row_costs = costs
        if args.actor_cpu == "runs":
            row_costs = dataclasses.replace(
                costs, act_cpu_ms_per_step=med([actor_cpu_ms_per_step(r) for r in rs])
            )
        sims = [
            simulate(
                Setup(mode, n, latency_of(case), row_costs, samples, cores=args.cores, seed=seed)
            )
            for seed in range(args.seeds)
        ]
        m = {key: med([x[key] for x in sims]) for key in ("fresh", "conv", "tau", "busy", "wait")}
        fresh = med([r["fresh"] for r in rs])
        err = m["fresh"] / fresh - 1
        worst = max(worst, abs(err))
        print(
            f"{case:<7}{n:>3} {mode:<6}{len(rs):>5}{fresh:>9,.0f}{m['fresh']:>9,.0f}{err:>+8.0%}"
            f"{med([r['conv'] for r in rs]):>11.1f}{m['conv']:>7.1f}{med([r['tau'] for r in rs]):>6.2f}"
            f"{m['tau']:>6.2f}{med([r['busy'] for r in rs]):>6.2f}{m['busy']:>6.2f}"
            f"{med([r['wait'] for r in rs]) or 0:>6.2f}{m['wait']:>6.2f}",
            flush=True,
        )
    print(
        f"\nlargest |error| of fresh/s (and so of conv. from the first update): {worst:.0%}"
        f" ({'within' if worst <= 0.2 else 'NOT within'} 20% on every row)"
    )


# ---------------------------------------------------------------------- predict
def sample_cost(paths: list[str], case: str) -> float | None:
    """Async's samples learned to converge over sync's, in the stored runs of `case` at
    their two largest N (medians): what async's staleness costs in samples at scale."""
    try:
        table = measured_table(paths)
    except FileNotFoundError:
        return None
    ns = sorted(
        {
            n
            for (c, n, _m) in table
            if c == case and (c, n, "sync") in table and (c, n, "async") in table
        }
    )
    ratios = []
    for n in ns[-2:]:
        a, b = (med([r["fresh"] * r["conv"] for r in table[case, n, m]]) for m in ("async", "sync"))
        ratios.append(a / b)
    return med(ratios)


def predict(args) -> None:
    costs = Costs.load(args.costs)
    lat = latency_of(args.case)
    if args.sample_cost is None:
        args.sample_cost = sample_cost(args.runs, args.case) or 1.0
    hosts = args.learner_hosts
    steps = 4 * 8  # PPO: epochs x minibatches, each an all-reduce across the learner hosts

    def gpu_ms(k: int) -> float:
        return (
            args.gpu_update_ms
            + args.gpu_ms_per_traj * k / hosts
            + (args.allreduce_ms * steps if hosts > 1 else 0)
        )

    print(
        f"Prediction: actors on hosts of their own (1 core each, {costs.act_cpu_ms_per_step:.2f} ms CPU per vector "
        f"step as measured here), case {args.case}: {lat.step_ms:g} ms sigma {lat.sigma:g} simulators with "
        f"{lat.hiccup_p:.0%} hiccups of {lat.hiccup_ms:g} ms"
        + (
            f", actors {list(lat.slow_actors)} {lat.slow_factor:g}x slower"
            if lat.slow_actors
            else ""
        )
        + f"; learner on {hosts} GPU host(s), assumed update "
        f"{args.gpu_update_ms:g} ms + {args.gpu_ms_per_traj:g} ms per trajectory per host"
        + (f" + {steps} all-reduces of {args.allreduce_ms:g} ms" if hosts > 1 else "")
        + f"; async batch {args.async_batch or 'N'} trajectories; median of {args.seeds} seeds"
    )
    print(
        f"{'N':>5} {'sync fresh/s':>13}{'async fresh/s':>14}{'ratio':>7}{'async tau':>10}{'async busy':>11}"
        f"{'sync upd. ms':>13}{'conv. ratio':>12}"
    )
    for n in args.actors:
        sync_samples = args.updates * n * 512  # sync: the same number of updates at every N
        out = {}
        for mode in ("sync", "async"):
            k = n if mode == "sync" or args.async_batch is None else min(args.async_batch, n)
            sims = [
                simulate(
                    Setup(
                        mode,
                        n,
                        lat,
                        costs,
                        sync_samples,
                        cores=math.inf,
                        seed=seed,
                        batch=k,
                        update_ms=gpu_ms,
                        update_parallelism=1.0,
                        learner_cores=float(hosts),
                        learner_hosts=hosts,
                        gpu=True,
                    )
                )
                for seed in range(args.seeds)
            ]
            out[mode] = {key: med([x[key] for x in sims]) for key in ("fresh", "tau", "busy")}
        r = out["async"]["fresh"] / out["sync"]["fresh"]
        print(
            f"{n:>5} {out['sync']['fresh']:>13,.0f}{out['async']['fresh']:>14,.0f}{r:>7.2f}"
            f"{out['async']['tau']:>10.2f}{out['async']['busy']:>11.2f}{gpu_ms(n):>13.1f}"
            f"{r / args.sample_cost:>12.2f}",
            flush=True,
        )
    print(
        "\nconv. ratio: sync/async time to converge, with the same samples to learn in both modes times "
        f"async's measured sample cost {args.sample_cost:.2f}. The paper (TianJi, 8 nodes): 7.13x throughput, "
        "4.37x convergence, against its baselines."
    )


# ---------------------------------------------------------------------- learner groups
GROUPS_RUNS = os.path.join(HERE, "..", "groups", "results", "runs.jsonl")


def _group_latency(lat: Latency, group: int, count: int, n: int) -> Latency:
    """Group `group`'s actors (ids group, group + count, ...) renumbered 0..n-1, as one
    group's simulation sees them: slow ones keep their factor."""
    ids = [group + count * j for j in range(n)]
    slow = tuple(j for j, i in enumerate(ids) if i in lat.slow_actors)
    return dataclasses.replace(lat, slow_actors=slow)


def groups_pace(count: int, n: int, lat: Latency, costs: Costs, seed: int, **setup) -> float:
    """Learner groups: `count` learners of `n` actors each, none waiting for another, so the
    run's fresh samples/s is the sum of its groups'; each group is simulated alone, with
    its share of a machine's cores (`setup["cores"]` / count) or on hosts of its own. The
    averager costs a group nothing it waits for (a delta is sent without waiting; merging
    an average is one add on the device), and is left out."""
    cores = setup.pop("cores", math.inf)
    samples = setup.pop("samples_per_group", 40 * n * 512)
    total, seen = 0.0, {}
    for g in range(count):
        glat = _group_latency(lat, g, count, n)
        key = (glat.slow_actors, glat.slow_factor)
        if key not in seen:  # identical groups are simulated once
            sim = simulate(
                Setup("async", n, glat, costs, samples, cores=cores / count, seed=seed + g, **setup)
            )
            seen[key] = sim["fresh"]
        total += seen[key]
    return total


def lockstep_pace(count: int, n: int, lat: Latency, costs: Costs, seed: int, **setup) -> float:
    """Lock-step learners: `count` learners of `n` actors each (actor i feeds learner i mod
    count), one update over every learner's batch of n trajectories from its own actors;
    each learner updates on its share, in parallel (`update_ms` of n trajectories), plus
    `allreduce_ms` per update."""
    allreduce_ms = setup.pop("allreduce_ms", 0.0)
    base = setup.pop("update_ms", None) or costs.update_ms
    samples = setup.pop("samples", 40 * count * n * 512)
    sim = simulate(
        Setup(
            "async",
            count * n,
            lat,
            costs,
            samples,
            seed=seed,
            batch=count * n,
            lockstep=count,
            update_ms=lambda k: base(k // count) + allreduce_ms,
            **setup,
        )
    )
    return sim["fresh"]


def groups_check(args) -> None:
    """The model against the measured slow-group rows of experiments/studies/groups."""
    costs = Costs.load(args.costs)
    with open(args.runs) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    rows = [r for r in rows if r["row"] == "slow" and r["time_to_target_s"]]
    print(
        f"Learner groups against lock-step learners: the model against {len(rows)} measured runs "
        f"({os.path.relpath(args.runs)}); 2 x 4 actors, the group 1's {rows[0]['slow_factor']:g}x "
        f"slower, {args.cores:g} cores; fresh samples/s from the first update to the target; "
        f"model: median of {args.seeds} seeds"
    )
    print(f"{'arm':<10}{'runs':>5}{'fresh/s':>9}{'model':>9}{'error':>8}")
    worst = 0.0
    for arm in ("groups", "lockstep"):
        rs = [r for r in rows if r["arm"] == arm]
        if not rs:
            continue
        fresh = med([r["env_steps"] / (r["time_to_target_s"] - r["first_update_s"]) for r in rs])
        lat = latency_of(
            "sigma1", {"slow_actors": (1, 3, 5, 7), "slow_factor": rs[0]["slow_factor"]}
        )
        pace = groups_pace if arm == "groups" else lockstep_pace
        model = med([pace(2, 4, lat, costs, seed, cores=args.cores) for seed in range(args.seeds)])
        err = model / fresh - 1
        worst = max(worst, abs(err))
        print(f"{arm:<10}{len(rs):>5}{fresh:>9,.0f}{model:>9,.0f}{err:>+8.0%}", flush=True)
    print(
        f"\nlargest |error|: {worst:.0%} ({'within' if worst <= 0.2 else 'NOT within'} 20% on every row)"
    )


def groups_predict(args) -> None:
    """Groups of 32 actors on hosts of their own, each group's learner on a GPU host,
    against as many lock-step learners (the same actors, one all-reduced update)."""
    costs = Costs.load(args.costs)
    n = args.group_actors
    gpu = dict(update_ms=lambda k: args.gpu_update_ms + args.gpu_ms_per_traj * k, gpu=True)
    print(
        f"Prediction: groups of {n} actors, each actor on a host of its own (1 core, "
        f"{costs.act_cpu_ms_per_step:.2f} ms CPU per vector step as measured here), sigma1 "
        f"simulators; each learner on a GPU host, assumed update {args.gpu_update_ms:g} ms + "
        f"{args.gpu_ms_per_traj:g} ms per trajectory, lock-step adding {args.allreduce_ms:g} ms "
        f"of all-reduce per update; the averager left out (groups never wait for it); "
        f"samples to the target: groups {args.sample_cost_even:.2f}x lock-step's with even "
        f"groups, {args.sample_cost_slow:.2f}x with a slow one (as measured in "
        f"experiments/studies/groups); median of {args.seeds} seeds"
    )
    print(
        f"{'groups':>7}{'actors':>7}  {'case':<16}{'lock-step/s':>12}{'groups/s':>10}"
        f"{'throughput':>11}{'to target':>10}"
    )
    for count in args.groups:
        for case, slow, cost in (
            ("even", 1.0, args.sample_cost_even),
            ("one group 3x", 3.0, args.sample_cost_slow),
        ):
            lat = latency_of(
                "sigma1",
                {
                    "slow_actors": tuple(range(1, count * n, count)) if slow > 1 else (),
                    "slow_factor": slow,
                },
            )
            ls, gr = [], []
            for seed in range(args.seeds):
                ls.append(
                    lockstep_pace(
                        count,
                        n,
                        lat,
                        costs,
                        seed,
                        cores=math.inf,
                        allreduce_ms=args.allreduce_ms,
                        samples=args.updates * count * n * 512,
                        **{k: v for k, v in gpu.items() if k != "update_ms"},
                        update_ms=gpu["update_ms"],
                    )
                )
                gr.append(
                    groups_pace(
                        count,
                        n,
                        lat,
                        costs,
                        seed,
                        samples_per_group=args.updates * n * 512,
                        **gpu,
                    )
                )
            a, b = med(ls), med(gr)
            print(
                f"{count:>7}{count * n:>7}  {case:<16}{a:>12,.0f}{b:>10,.0f}{b / a:>10.2f}x"
                f"{b / a / cost:>9.2f}x",
                flush=True,
            )
    print(
        "\nthroughput: groups' fresh samples/s over lock-step's; to target: that over the groups' "
        "sample cost. Traffic between learners per update: a group sends a delta and receives an "
        "average every groups.sync_every updates (2 x parameters / sync_every), a lock-step "
        "learner all-reduces every update (measured here: 4.6 x parameters per update at 2 "
        "learners, growing toward 2 x that with the learners' count in a ring). TianJi (8 nodes): "
        "1.6x convergence and 7.13x throughput over XingTian."
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="the model against the stored scaling study")
    c.add_argument("--runs", nargs="+", default=[RUNS])
    c.add_argument("--costs", default=COSTS)
    c.add_argument("--cores", type=float, default=2.0)
    c.add_argument("--seeds", type=int, default=3)
    c.add_argument(
        "--actor-cpu",
        choices=["runs", "costs"],
        default="runs",
        help="an actor's CPU per vector step: as each row's runs measured it (default), or "
        "cluster_costs.py's one-actor figure for every row",
    )
    p = sub.add_parser(
        "predict", help="clusters: actors on hosts of their own, learners on GPU hosts"
    )
    p.add_argument("--costs", default=COSTS)
    p.add_argument("--actors", type=int, nargs="+", default=[32, 64, 128, 256, 512, 1024])
    p.add_argument("--learner-hosts", type=int, default=8)
    p.add_argument(
        "--gpu-update-ms", type=float, default=4.0, help="assumed: fixed cost of one update"
    )
    p.add_argument(
        "--gpu-ms-per-traj", type=float, default=0.05, help="assumed: per trajectory per host"
    )
    p.add_argument(
        "--allreduce-ms", type=float, default=0.1, help="assumed: one gradient all-reduce"
    )
    p.add_argument(
        "--async-batch",
        type=int,
        default=None,
        help="async: trajectories per update (default: "
        "one per actor, as the shipped config and sync)",
    )
    p.add_argument("--updates", type=int, default=30, help="sync updates simulated per point")
    p.add_argument(
        "--sample-cost",
        type=float,
        default=None,
        help="async samples to converge / sync's (default: "
        "the stored runs' ratio at their two largest N)",
    )
    p.add_argument("--runs", nargs="+", default=[RUNS])
    p.add_argument("--case", choices=list(CASES), default="sigma1", help="the simulators' delays")
    p.add_argument("--seeds", type=int, default=3)
    gc = sub.add_parser("groups-check", help="the model against the measured groups study")
    gc.add_argument("--runs", default=GROUPS_RUNS)
    gc.add_argument("--costs", default=COSTS)
    gc.add_argument("--cores", type=float, default=2.0)
    gc.add_argument("--seeds", type=int, default=3)
    gp = sub.add_parser("groups-predict", help="8, 16, 64 groups of 32 actors on a cluster")
    gp.add_argument("--costs", default=COSTS)
    gp.add_argument("--groups", type=int, nargs="+", default=[8, 16, 64])
    gp.add_argument("--group-actors", type=int, default=32)
    gp.add_argument("--gpu-update-ms", type=float, default=4.0)
    gp.add_argument("--gpu-ms-per-traj", type=float, default=0.05)
    gp.add_argument("--allreduce-ms", type=float, default=3.2, help="assumed: 32 x 0.1 ms")
    gp.add_argument("--updates", type=int, default=20)
    gp.add_argument(
        "--sample-cost-even",
        type=float,
        default=1.0,
        help="groups' samples to the target over one learner's (lock-step's) with even groups",
    )
    gp.add_argument(
        "--sample-cost-slow",
        type=float,
        default=1.31,
        help="groups' samples to the target over lock-step's with one group 3x slower",
    )
    gp.add_argument("--seeds", type=int, default=1)
    args = ap.parse_args()
    {"check": check, "predict": predict, "groups-check": groups_check}.get(
        args.cmd, groups_predict
    )(args)


if __name__ == "__main__":
    main()
