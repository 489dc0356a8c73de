"""`tianjax replay RUN_DIR`: an async (or sync) run done again in one process, bit for bit,
from its replay log (tianjax.runtime.record.replay_log).

An async run is not reproducible by running it again: which trajectories an update learns
from, and which parameters each was acted with, depend on timing. But each actor process
is deterministic given what it was handed: its envs and action keys start from its seed,
and each rollout is a function of the parameters it acted with (a version per step), the
global env-step count its schedules followed, and the state the previous rollout left.
So the replay:

- builds, per actor process (actor id and incarnation), the same rollout source from the
  same seed, on the actors' platform (runtime.actor_devices), and acts its rollouts again
  in their order, every one of them up to the last one learned from (an unused one moves
  the env state on too), each with the versions and env-step count its log line names;
- keeps the parameters of every version a rollout still to be acted needs, and drops a
  version once none does;
- builds the learner's own update (the same compiled program over the same mesh) from the
  same seed, and applies the updates in the logged order, each on the logged trajectories
  joined in the logged order (a reuse pass on the batch before; off-policy, the buffer
  fills with the logged trajectories and each update samples it with the learner's key);
- hashes the final parameters and compares with the run's (summary.json's
  `params_sha256`, and the log's end).

A host env (envpool, gymnasium) steps outside JAX; it is replayed (each step's versions
too, where actors took newer ones mid-rollout: runtime.param_refresh step) when two copies
made from one seed act the same rollouts bit for bit, which the replay checks first.

What it cannot redo it refuses before it starts, in one line (`ReplayRefused`): a host
env whose copies from one seed differ, a deterministic-lag run (trained again, it gives
the same parameters), a learner restarted from a checkpoint (its pool, and the
rollouts its actors dropped when it went, are gone), several learner processes or
groups, a trajectory lost on the way before one that was learned from (the actor's later
rollouts cannot be acted again without it), a log without its end, or one whose updates
name trajectories it never logged, out of order, or twice.
"""

from __future__ import annotations

import collections
import os
from typing import Any, NamedTuple

import jax
import numpy as np

from tianjax.config import Config, load_config
from tianjax.errors import ReplayRefused
from tianjax.launch.placement import JAX_PLATFORM
from tianjax.runtime.actor.sources import HostSource, make_source
from tianjax.runtime.learner.batches.axes import concat_batches
from tianjax.runtime.learner.inflight import to_host
from tianjax.runtime.learner.prepared import prepare
from tianjax.runtime.modes import MODES
from tianjax.runtime.record.replay_log import REPLAY_LOG, params_sha256, read_events

# backends whose rollouts are JAX programs: the same program on the same inputs gives the
# same bits. A host env's steps happen outside JAX (a C++ thread pool, a library's own
# RNG): it is replayed only when two copies made from one seed agree (`host_env_diverges`)
JAX_BACKENDS = ("gymnax", "jaxmarl", "brax")
# rollouts the probe acts with each copy of a host env
PROBE_ROLLOUTS = 2


def acting_device(config: Config):
    """The device the run's actors acted on: the first of their platform
    (runtime.actor_devices; each actor process saw only its own). Raises ReplayRefused
    where this process cannot see that platform."""
    platform = JAX_PLATFORM.get(config.runtime.actor_device_list.platform, "cpu")
    try:
        return jax.devices(platform)[0]
    except RuntimeError:
        _refuse(f"the actors acted on {platform}, which this process cannot see")


def host_env_diverges(config: Config, seed: int = 0) -> str | None:
    """Whether the configured host env can be acted again bit for bit: two rollout sources
    made from one seed act PROBE_ROLLOUTS rollouts each with the same (initial) parameters;
    None when every field of every rollout agrees bit for bit, else what differed."""
    with jax.default_device(acting_device(config)):
        return _diverges(config, seed)


def _diverges(config: Config, seed: int) -> str | None:
    first, second = (make_source(config, seed=seed) for _ in range(2))
    try:
        params = jax.jit(first.algo.init)(jax.random.key(0)).params
        for r in range(PROBE_ROLLOUTS):
            a, b = (s(params, 0, 0) for s in (first, second))
            for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(a)[0], jax.tree.leaves(b)):
                if np.asarray(x).tobytes() != np.asarray(y).tobytes():
                    return (
                        f"env '{config.env}' ({config.env_backend}) is not deterministic: two "
                        f"copies made from one seed differ in rollout {r}'s "
                        f"{jax.tree_util.keystr(path)}"
                    )
        return None
    finally:
        first.close()
        second.close()


class ReplayOutcome(NamedTuple):
    params_sha256: str  # of the replayed final parameters
    recorded_sha256: str  # the run's, as its learner logged it
    equal: bool
    updates: int  # applied
    rollouts: int  # acted again (every one up to each actor process's last one learned from)
    params: Any  # the replayed final parameters (host arrays)

    def line(self) -> str:
        same = "equal" if self.equal else "DIFFERENT"
        return (
            f"replay: {self.updates} updates on {self.rollouts} rollouts acted again; "
            f"params sha256 {self.params_sha256[:16]} vs the run's {self.recorded_sha256[:16]}: "
            f"{same}"
        )


class Plan(NamedTuple):
    """What a replay will do, checked before it starts."""

    config: Config
    events: list[dict]  # the learner's: updates (and the trajectories they name)
    trajectories: dict[int, dict]  # index in the log -> its line
    rollouts: dict[tuple, list[dict]]  # (actor, incarnation) -> its lines, by rollout index
    acted: dict[tuple, int]  # (actor, incarnation) -> rollouts to act (up to the last needed)
    needed: set[int]  # trajectories an update (or the replay buffer) takes
    recorded_sha256: str


def _refuse(reason: str):
    raise ReplayRefused(reason)


def plan_replay(run_dir: str) -> Plan:
    """Reads RUN_DIR's config and replay log and checks that they can be replayed bit for
    bit; raises ReplayRefused with the reason where not."""
    path = os.path.join(run_dir, "config.yaml")
    if not os.path.exists(path):
        _refuse(f"{run_dir} is not a run directory (no config.yaml)")
    config = load_config(path, saved=True, resume=None)
    if config.mode not in MODES:
        _refuse(
            f"mode '{config.mode}' has no actors: a {config.mode} run is redone by training again"
        )
    if config.runtime.deterministic:
        _refuse(
            "runtime.deterministic: the run's parameters depend on its config alone; it is "
            "redone by training it again (any number of actor processes)"
        )
    if not os.path.exists(os.path.join(run_dir, REPLAY_LOG)):
        _refuse(f"no {REPLAY_LOG} in {run_dir} (runtime.replay_log was off)")
    events = list(read_events(run_dir))
    starts = [e for e in events if e.get("e") == "start"]
    if not starts:
        _refuse(f"{REPLAY_LOG} has no start: the learner never began training")
    if len(starts) > 1 or starts[0].get("resumed_from") is not None:
        steps = [e.get("resumed_from") for e in starts if e.get("resumed_from") is not None]
        _refuse(
            f"the learner restarted (from checkpoint {steps[-1] if steps else 'none'}): the "
            "trajectories "
            "it held were lost with it, and the rollouts its actors dropped then cannot be "
            "acted again"
        )
    if starts[0].get("processes") != 1 or starts[0].get("group"):
        _refuse("the run had several learner processes or learner groups: not replayable here")
    ends = [e for e in events if e.get("e") == "end"]
    if not ends:
        _refuse(f"{REPLAY_LOG} has no end: the learner did not finish (killed?)")
    trajectories: dict[int, dict] = {}
    rollouts: dict[tuple, dict[int, dict]] = collections.defaultdict(dict)
    needed: set[int] = set()
    learner_events, updates, pool_taken = [], 0, set()
    for n, e in enumerate(events):
        kind = e.get("e")
        if kind == "traj":
            i, r = e.get("i"), e.get("rollout")
            if i in trajectories or not isinstance(r, int):
                _refuse(
                    f"{REPLAY_LOG} line {n + 1}: a trajectory logged twice or without its rollout"
                )
            newest = max(v for v, _ in e["v"])
            if newest > updates:
                _refuse(
                    f"{REPLAY_LOG} line {n + 1}: trajectory {i} was acted with version {newest} "
                    f"before {newest} updates were taken (the log is out of order)"
                )
            key = (e.get("actor"), e.get("inc"))
            if r in rollouts[key]:
                _refuse(f"{REPLAY_LOG} line {n + 1}: actor {key[0]} rollout {r} logged twice")
            trajectories[i] = e
            rollouts[key][r] = e
            if e.get("to") == "replay":
                needed.add(i)
                learner_events.append(e)
        elif kind == "update":
            for i in e.get("items", []):
                t = trajectories.get(i)
                if t is None or t.get("to") != "pool" or i in pool_taken:
                    _refuse(
                        f"{REPLAY_LOG} line {n + 1}: update {updates + 1} takes trajectory {i}, "
                        "which was not pooled before it, or was taken already (the log is "
                        "out of order)"
                    )
                pool_taken.add(i)
                needed.add(i)
            updates += 1
            learner_events.append(e)
    acted = {}
    for key, by_index in rollouts.items():
        wanted = [r for r, t in by_index.items() if t["i"] in needed]
        if not wanted:
            continue
        last = max(wanted)
        missing = [r for r in range(last + 1) if r not in by_index]
        if missing:
            _refuse(
                f"actor {key[0]} (process {key[1]}) rollout {missing[0]} never arrived (lost on "
                f"the way): its rollouts after it, up to {last}, which the run learned from, "
                "cannot be acted again"
            )
        acted[key] = last + 1
    if config.env_backend not in JAX_BACKENDS:
        seed = next(iter(trajectories.values()), {}).get("seed", 0)
        if (differs := host_env_diverges(config, seed)) is not None:
            _refuse(differs)
    return Plan(
        config,
        learner_events,
        trajectories,
        {k: [v[r] for r in sorted(v)] for k, v in rollouts.items()},
        acted,
        needed,
        ends[-1]["params_sha256"],
    )


class _Actors:
    """The run's actor processes acted again: one rollout source per (actor, incarnation),
    the parameters of each version still to be acted with, and the rollouts acted but not
    yet taken."""

    def __init__(self, plan: Plan, params0):
        self.plan = plan
        # (the sources act on it, as the actors did: a learner on a GPU, actors on CPUs)
        self.device = acting_device(plan.config)
        self.sources: dict[tuple, Any] = {}
        self.next: dict[tuple, int] = collections.defaultdict(int)
        self.ready: dict[int, Any] = {}  # trajectory index -> its batch
        self.uses = collections.Counter()  # version -> rollouts still to act with it
        for key, n in plan.acted.items():
            for t in plan.rollouts[key][:n]:
                self.uses.update(v for v, _ in t["v"])
        self.params: dict[int, Any] = {}
        self.template = None
        self.acted = 0
        self.offer(0, params0)

    def offer(self, version: int, params) -> None:
        """The parameters of `version`, kept if a rollout still to be acted needs them."""
        if self.uses[version] > 0 and version not in self.params:
            self.params[version] = jax.device_get(params)

    def take(self, i: int):
        """Trajectory `i`'s batch (numpy [T, B] leaves): acted now, with every rollout of
        its actor process before it, unless acted already."""
        if i not in self.ready:
            t = self.plan.trajectories[i]
            key = (t["actor"], t["inc"])
            while self.next[key] <= t["rollout"]:
                self._act(key)
        return self.ready.pop(i)

    def _act(self, key: tuple) -> None:
        with jax.default_device(self.device):
            self._act_next(key)

    def _act_next(self, key: tuple) -> None:
        t = self.plan.rollouts[key][self.next[key]]
        self.next[key] += 1
        if key not in self.sources:
            source = make_source(self.plan.config, seed=int(t["seed"]))
            if self.template is None:
                self.template = jax.eval_shape(source.algo.init, jax.random.key(0)).params
            source.compile(self.template)  # (as an actor compiles it: the same program)
            self.sources[key] = source
        versions = [v for v, _ in t["v"]]
        missing = [v for v in versions if v not in self.params]
        if missing:
            raise ReplayRefused(
                f"actor {key[0]} rollout {t['rollout']} was acted with version {missing[0]}, "
                "which the replayed updates never reached (the log does not match the run)"
            )
        source = self.sources[key]
        put = jax.device_put(self.params[versions[0]], self.device)
        args = (put, versions[0], int(t["act_steps"]))
        if len(versions) > 1:
            if not isinstance(source, HostSource):
                raise ReplayRefused(
                    f"actor {key[0]} rollout {t['rollout']} holds several versions: a JAX "
                    "rollout has one (the log does not match the run)"
                )
            args += (self._refresh([v for v, n in t["v"] for _ in range(n)]),)
        rollout = source(*args)
        self.acted += 1
        for v in versions:
            self.uses[v] -= 1
            if self.uses[v] <= 0:
                self.params.pop(v, None)  # no rollout still to act needs it
        if t["i"] in self.plan.needed:
            self.ready[t["i"]] = rollout.batch

    def _refresh(self, stamps: list[int]):
        """What a host source asks before each vector step after the first
        (runtime.param_refresh: step): the logged version of that step, as the actor took
        it, where it changes."""
        steps, held = iter(stamps[1:]), [stamps[0]]

        def refresh():
            v = next(steps)
            if v == held[0]:
                return None
            held[0] = v
            return jax.device_put(self.params[v], self.device), v

        return refresh

    def close(self) -> None:
        for source in self.sources.values():
            source.close()


def replay_run(run_dir: str | os.PathLike) -> ReplayOutcome:
    """Replays RUN_DIR (an async or sync run with its replay log) in this process and
    compares the final parameters' hash with the run's. Raises ReplayRefused, before any
    work, where the run cannot be replayed bit for bit."""
    plan = plan_replay(os.fspath(run_dir))
    config = plan.config
    # the learner's own parts, built as the learner builds them
    parts = prepare(config)
    parts.compile()
    replay, sgd, state = parts.replay, parts.sgd, parts.state
    place = sgd.placer() or (lambda tree: tree)
    actors = _Actors(plan, to_host(state.params))
    samples = config.rollout_len * config.num_envs
    last, updates = None, 0
    try:
        for e in plan.events:
            if e["e"] == "traj":  # (off-policy) into the buffer, as it arrived
                batch = place((actors.take(e["i"]),))[0]
                replay.add(batch, samples, float(e["scale"]))
                continue
            if replay is not None:
                batch = sgd.global_batch(replay.sample().batch)
                reuse = False
            elif e.get("reuse"):
                if last is None:
                    _refuse("the log's first update is a reuse pass (the log does not match)")
                batch, reuse = (None if sgd.split else sgd.global_batch(last)), True
            else:
                last = concat_batches([place((actors.take(i),))[0] for i in e["items"]])
                batch, reuse = sgd.global_batch(last), False
            state, _ = sgd(state, batch, reuse)
            updates += 1
            version = int(to_host(state.version))
            if actors.uses[version] > 0:
                actors.offer(version, state.params)
    finally:
        actors.close()
    params = to_host(state.params)
    digest = params_sha256(params)
    return ReplayOutcome(
        digest,
        plan.recorded_sha256,
        digest == plan.recorded_sha256,
        updates,
        actors.acted,
        params,
    )


__all__ = ["ReplayOutcome", "acting_device", "host_env_diverges", "plan_replay", "replay_run"]
