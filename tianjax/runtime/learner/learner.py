"""The learner role: an event loop around a zmq poller that fills a sample pool from any
actor and runs the jitted update on whatever the pool holds (TianJi's relaxed assignment
dependencies), or, in sync mode, on exactly one fresh trajectory from every actor.

    async: update as soon as `batch_trajectories` admitted trajectories are pooled, from
           any actors and of any (admitted) versions; the staleness of each sample feeds
           the loss's weights; parameters are published every `publish_every` updates.
    sync:  wait for one trajectory from every actor made with the current version, update,
           publish, repeat (strict assignment dependencies: the baseline TianJi beats).
    replay (off-policy, either mode): admitted trajectories go to a replay buffer (of
           transitions, or of sequences for recurrent agents: QMIX), and gradient steps are
           paced against arrivals so that samples learned per sample produced (after the
           replay section's `learning_starts`) hold the replay ratio; while the learner
           is behind by more than a trajectory per actor, the actors' credits are held back.

The budget holds in every mode: credits are granted only while the env steps admitted
plus those in flight stay within the fresh-step budget, so the actors
stop producing when it is spent, and a run ends with `total_env_steps` env steps admitted
to within one batch. Every parameter message carries the learner's count of admitted env
steps, the global clock of actor-side schedules (epsilon).

`Learner` only moves data between its parts, one module each of tianjax.runtime.learner
unless named: the `ingress` (credits, admission, control; its `receiver` thread), the batch
strategies (`batches.onpolicy`, `batches.replay`), the update over the device mesh
(`sharded_update`), the `publisher` and `inflight` threads, the balance controllers
(tianjax.runtime.balance), what it measures (`report`) and the run's record: episodes,
metrics, checkpoints, result (tianjax.runtime.record.recorder).

Evaluation (the `eval` section): the evaluator process sends each evaluation's fields as a
control message, which the loop logs as a record of its own (a malformed one is dropped
and counted: `evaluations_rejected`); once training ends, the learner evaluates its final
parameters itself (`on_trained` first lets a launcher stop the evaluator).

A learner of a group (`group`, learner groups: tianjax.runtime.groups) also calls its
GroupSync at every update boundary, which sends its deltas and hands back the parameters
merged with a new average.
"""

from __future__ import annotations

import collections
import time
from typing import Callable

import jax
import numpy as np

from tianjax.config import Config
from tianjax.core import lag
from tianjax.core.staleness import staleness
from tianjax.errors import OrderBroken
from tianjax.metrics import Progress, RunLogger
from tianjax.runtime.balance.controller import AdaptiveBalance
from tianjax.runtime.balance.limits import Limits
from tianjax.runtime.evaluation.play import Evaluation
from tianjax.runtime.groups.sync import GroupPlace, GroupSync
from tianjax.runtime.learner.batches.onpolicy import Choice
from tianjax.runtime.learner.inflight import InFlight, to_host
from tianjax.runtime.learner.ingress import Ingress
from tianjax.runtime.learner.io import LearnerIO
from tianjax.runtime.learner.prepared import Prepared, prepare
from tianjax.runtime.learner.stats import LearnerStats
from tianjax.runtime.learner.watchdog import ArrivalWatch
from tianjax.runtime.modes import mode_of
from tianjax.runtime.process import shutdown
from tianjax.runtime.process.resources import warn
from tianjax.runtime.record.evaluations import from_message
from tianjax.runtime.record.outcome import RunOutcome
from tianjax.runtime.record.recorder import RunRecorder
from tianjax.runtime.record.replay_log import ReplayLog, params_sha256

# Updates dispatched behind the running one. One: when an update ends the next is already
# on the device, so the learner does not idle between them, and the loop takes the batch
# after it (handing its credits back) when the running one ends. With a window of one batch
# (k trajectories), the actors then have about two updates' time to deliver the batch after
# next, and its samples are about two updates stale when learned from (one for the update
# it waits behind, one for the parameters it was acted with, published as an update ends).
# More would add staleness, never busy time, while the actors keep up.
# NOTE: where a learner-bound run's idle time came from with a window of one batch (the
# 256x256 CartPole run, experiments/studies/learner_busy): not from the window, since a
# batch was already taken one update ahead; the loop waited for the running update in a
# device read (the staleness of the next batch), so it dispatched that batch only after the
# update ended (about 2 ms of idle device per update); the first batch's join and that
# staleness op compiled when it was taken (0.6 s); and a batch was late only where the
# actors took longer than two updates to deliver it.
QUEUED = 1
# at most this long before a take for the parameters of the update that just ended to go
# out (a few ms for a small network's MAC; a large one's must not hold the credits back long)
PUBLISH_WAIT_S = 0.02


class Learner:
    """The learner process's state and loop. `endpoints` are where actors connect."""

    def __init__(
        self,
        config: Config,
        run_key,
        logger: RunLogger | None = None,
        progress: Progress | None = None,
        endpoints: dict | None = None,
        checkpoint_root: str | None = None,
        ipc_dir: str | None = None,
        listen_fds: dict | None = None,
        group: GroupPlace | None = None,
        prepared: Prepared | None = None,
    ):
        """`checkpoint_root`: the run directory whose checkpoints/ this learner writes
        (default: the logger's run directory; none without a logger). In a multi-process
        run every learner process must name the same one. `ipc_dir`: where ipc sockets
        go (the launcher's private directory). `listen_fds`: listening sockets the launcher
        holds for `endpoints` (channel name -> descriptor; see tianjax.launch.ports). `group`:
        this learner is that group's, and syncs with its averager. `prepared`: its update,
        built (and perhaps compiled) ahead for this config (tianjax.runtime.learner.prepared)."""
        self.config = config
        self.mode = mode_of(config)
        rt = config.runtime
        # built ahead by a warm standby, or now
        self.prepared = prepared if prepared is not None else prepare(config)
        p = self.prepared
        self.algo, self.template, self.replay, self.sgd = p.algo, p.template, p.replay, p.sgd
        self.mesh = self.sgd.mesh
        self.state = p.state
        # deterministic-lag mode: the last k + 1 versions, which every parameter message
        # carries (an actor acts rollout r with version max(0, r - k) from it)
        self.lag_ring = self._push = None
        if self.mode.fixed_order:
            k = rt.deterministic_lag
            self.lag_ring = lag.init(self.state.params, k + 1, k)
            self._push = jax.jit(lag.push)

        self.io = LearnerIO(
            config,
            run_key,
            self.template,
            self.sgd.placer(),
            lambda: self.env_steps,
            endpoints,
            ipc_dir,
            listen_fds,
        )
        self.net, self.traj_in, self.control, self.rx = (
            self.io.net,
            self.io.traj_in,
            self.io.control,
            self.io.rx,
        )
        # updates run while the loop goes on; a third thread reads their results back
        self.inflight = InFlight(limit=QUEUED + 1)
        self._dispatches = 0  # updates dispatched by this session
        self._pending: list[dict] = []  # read-back metrics of finished updates, not yet logged
        self.limits = Limits(
            config.staleness.max_staleness,
            rt.max_pool,
            rt.max_reuse if jax.process_count() == 1 else 0,
            batch_trajectories=config.batch_trajectories,
        )
        self.measures = self.limits.measures
        self.traj_steps = config.rollout_len * config.num_envs
        # the set-point controller: the runtime's credits, publish_every and reuse are its bounds
        bc = config.balance
        self.controller = AdaptiveBalance(
            adaptive=config.balance_adaptive,
            target_staleness=bc.target_staleness,
            batch_trajectories=config.batch_trajectories,
            max_credits_per_actor=rt.credits_per_actor,
            max_publish_every=rt.publish_every,
            max_reuse=self.limits.max_reuse,
            n_actors=max(config.num_actors, 1),
            period_s=bc.period_s,
            deadband=bc.deadband,
            target_replay_ratio=self.replay.ratio if self.replay else None,
            traj_samples=self.traj_steps,
            batch_size=self.replay.batch_samples if self.replay else 0,
        )
        if (line := self.controller.unreachable()) is not None:
            warn(line)  # said once, at start: the controller will stop at its bounds
        # env steps the actors may produce: on-policy, whole updates' worth (the schedules
        # end there); off-policy, whole trajectories' worth of total_env_steps
        unit = self.traj_steps if self.algo.buffer.replayed else config.steps_per_update
        self.budget = config.total_env_steps // unit * unit
        self.n_updates = self.budget // config.steps_per_update  # on-policy: fresh batches
        self.fresh_updates = 0  # fresh batches taken (the loop's count: a skipped one too)
        self._counted: collections.deque = (
            collections.deque()
        )  # fresh samples of each update in flight
        self.skipped_fresh_samples = 0  # fresh samples of updates skipped for non-finite gradients
        self.resume_unlearned_samples = 0  # pooled at the checkpoint resumed from: acted again
        # trajectories received by the earlier learner incarnations of this run, up to the
        # checkpoint resumed from (what they received after it was lost with them)
        self.received_before = 0
        self.recorder = RunRecorder(config, logger, progress)
        self.tracker = self.recorder.tracker
        self.checkpoint_root = checkpoint_root or (logger.run_dir if logger is not None else None)
        # where each trajectory came from and each update's batch (one process keeps it)
        self.log = (
            ReplayLog(self.checkpoint_root)
            if rt.replay_log and self.checkpoint_root is not None and jax.process_index() == 0
            else None
        )
        self.ingress = Ingress(
            config,
            self.mode,
            self.control,
            self.rx,
            self.limits,
            self.controller,
            budget=self.budget,
            version=lambda: self.state_version,
            publish=self.publish,
            episodes=self.recorder.add,
            replay=self.replay,
            evaluations=self._evaluation_message,
            log=self.log,
        )
        self.pool, self.actors = self.ingress.pool, self.ingress.actors
        self.batches = self._batch_strategy()
        self.stats = LearnerStats(
            config,
            self.algo,
            self.ingress,
            self.measures,
            self.controller,
            self.inflight,
            self.replay,
            (self.traj_in, self.control),
            self.net,
            int(self.mesh.devices.size),
        )
        # says so while no actor has registered (a multi-host launch sets which flags)
        self.watch = ArrivalWatch(rt.connect_timeout_s, rt.heartbeat_timeout_s)
        self._published_steps = 0  # the env-step count the last publication carried
        # versions offered to the publisher, newest last (no more than can be unread), and
        # the newest one seen sent
        self._offered: collections.deque = collections.deque(maxlen=QUEUED + 2)
        self._sent_seen = -1
        self._version_cache = int(to_host(self.state.version))
        self.interrupted = False
        self._episodes_recorded = 0  # of the recorder's episode log, in metrics records
        # the final evaluation's env, policy and video maker, built now (an env that cannot
        # render says so at the start); one learner process of several evaluates
        self.evaluation = (
            Evaluation(config, self.checkpoint_root)
            if config.eval.on and jax.process_index() == 0
            else None
        )
        self.evaluations_rejected = 0
        self.on_trained: Callable[[], None] = lambda: None  # called before the final evaluation
        if config.resume:
            self._resume()
        # (after a resume: a group starts from the parameters it has)
        self.sync = None
        if group is not None:
            self.sync = GroupSync(config, group, run_key, self.io.net, self.state.params)
            self.recorder.episode_log = []  # the run's moving average is over every group's

    def _batch_strategy(self):
        if self.replay is not None:
            return self.replay
        return self.mode.batches(
            self.pool, self.config.batch_trajectories, self.limits, self.sgd.split
        )

    def compile(self) -> None:
        """Compiles the update (unless it was, ahead). Separate from __init__ so that a
        launcher can bind the sockets, start the actors, and let them start up while this
        compiles."""
        self.prepared.compile()

    @property
    def compile_time_s(self) -> float:
        return self.prepared.compile_time_s

    @property
    def endpoints(self) -> dict:
        return self.io.endpoints

    @property
    def address(self) -> str:
        """This learner incarnation's address: what actors' messages must be addressed to."""
        return self.io.address

    @property
    def state_version(self) -> int:
        return int(self._version_cache)

    @property
    def env_steps(self) -> int:
        """Env steps admitted (what counts against the budget, and the actors' schedules)."""
        return self.ingress.env_steps

    @property
    def dropped_nonfinite(self) -> int:
        return self.ingress.dropped_nonfinite

    @property
    def resumed_from(self) -> int | None:
        """The checkpoint step this learner resumed from (None: a fresh run)."""
        return self.recorder.resumed_from

    def pump(self, timeout_ms: int) -> int:
        return self.ingress.pump(timeout_ms)

    def silent_actors(self, now: float) -> list[int]:
        return self.ingress.silent_actors(now)

    def forget_actor(self, actor_id: int) -> None:
        self.ingress.forget_actor(actor_id)

    def publish(self) -> None:
        """Offers the newest parameters to the actors (see LearnerIO.publish)."""
        self._published_steps = self.env_steps
        self.ingress.published(self.state_version)
        if not self._offered or self._offered[-1] != self.state_version:
            self._offered.append(self.state_version)
        state = (
            self.state if self.lag_ring is None else self.state._replace(params=self.lag_ring.ring)
        )
        self.io.publish(state, self._dispatches, self.state_version, self.env_steps)

    def _absorb(self, finished: list[dict]) -> None:
        """Takes in the read-back metrics of finished updates: a skipped one (non-finite
        gradients, the state kept) did not advance the version, and learned nothing: the
        fresh samples it was counted with are taken back (and counted as skipped)."""
        for m in finished:
            fresh = self._counted.popleft() if self._counted else 0
            if int(m["update_skipped"]):
                if self.mode.fixed_order:
                    raise OrderBroken(
                        "runtime.deterministic: an update was skipped for non-finite "
                        "gradients; the rounds after it cannot be learned in order"
                    )
                self._version_cache -= 1
                self.measures.fresh -= fresh
                self.skipped_fresh_samples += fresh
            self._pending.append(m)

    def settle(self) -> None:
        """Waits for the updates in flight, so that the version and counts are exact."""
        self._absorb(self.inflight.settle())

    def finished(self) -> bool:
        """The budget is spent: every fresh batch learned from (on-policy), or every admitted
        sample learned from as often as the replay ratio says (off-policy)."""
        if self.measures.produced < self.budget or (
            jax.process_count() > 1 and self.replay is None
        ):
            # NOTE: every process of a multi-process run must take the same number of
            # (collective) updates: there only the count of fresh batches decides
            return self.fresh_updates >= self.n_updates and self.replay is None
        return self.batches.drained()

    # ------------------------------------------------------------------ the loop
    def run(
        self, should_stop: Callable[[], bool] = lambda: False, t_start: float | None = None
    ) -> RunOutcome:
        """Trains until the budget is spent (see finished(); counting what the run it resumed
        learned), `should_stop()` says so, or an error. Checkpoints every
        `checkpoint.every` updates and, with `checkpoint.final`, at the end, including an
        end by Ctrl-C, SIGTERM or a stall (the state is always a whole update's)."""
        rec = self.recorder
        rec.start(t_start or time.perf_counter())  # a resumed run's clock goes on
        if self.checkpoint_root is not None and rec.saver is None:
            rec.open_checkpoints(self.checkpoint_root, start=self.state_version)
        rec.env_steps0 = self.env_steps
        if self.log is not None:
            self.log.start(
                self.state_version,
                self.resumed_from,
                self.config.seed,
                jax.process_count(),
                group=self.sync is not None,
            )
        self.stats.begin()
        self.compile()
        completed = False
        self.interrupted = False
        try:
            # the stop is taken at the loop's checks, never raised into the middle of a step
            # (see tianjax.runtime.process.shutdown): not between an update that donates the
            # state and the assignment of its result, nor into a checkpoint or a lock the loop shares
            # with its threads. Every pass checks within 50 ms
            with shutdown.critical():
                self._loop(should_stop)
            completed = True
            self.on_trained()
            self._final_evaluation()
        except KeyboardInterrupt:
            # Ctrl-C / SIGTERM: stop here, checkpoint, and report what was done
            self.interrupted = True
        finally:
            self.inflight.close()
            self._absorb(self.inflight.take())
            self.io.stop_threads()
            # NOTE: in a multi-process run every learner must join a save; after a failure
            # on one of them the others would wait for it, so only a whole run saves there.
            # Interrupted mid-update (the state donated), the last periodic one stands.
            rec.final_checkpoint(
                lambda: self.save_checkpoint(time.perf_counter()),
                tolerant=True,
                allowed=completed or jax.process_count() == 1,
            )
        return self.result()

    def _loop(self, should_stop) -> None:
        cfg, rt = self.config, self.config.runtime
        exact = (
            self.mode.exact_versions or jax.process_count() > 1
        )  # the version read back after each update
        self._pending = []
        self.ingress.rebase(self.state_version)  # admission by version counts from here
        self.publish()
        last_publish = time.perf_counter()
        self.recorder.training(last_publish, self.env_steps)
        cpu0 = time.process_time()  # this process's CPU time, all its threads (XLA's too)
        self.watch.start(last_publish)
        busy = False
        while not self.finished() and not should_stop() and not self.recorder.stop_now():
            shutdown.check()
            self.io.check()  # (its gatekeeper: fail closed, and say so)
            # NOTE: block (until a message or 50 ms) only when the last pass found no work;
            # right after an update more may be waiting in the pool. While an update runs,
            # look again within 5 ms: when it ends, a reuse pass may be due.
            received = self.pump(0 if busy else 5 if self.inflight.pending else 50)
            now = time.perf_counter()
            self.watch.check(
                now, received, len(self.actors), started=self.env_steps != self.recorder.env_steps0
            )
            self.ingress.steer(now, self.inflight.busy_s)
            # NOTE: a batch is taken (its credits handed back) only while at most QUEUED
            # updates are dispatched and unread: one runs, one waits behind it on the device,
            # so the device never waits for this loop between two updates, and a batch is
            # taken no earlier than one update before it can run. And only once the
            # parameters of the update that just ended have gone out, so that the credits it
            # hands back are acted with them (see QUEUED)
            ahead = self.inflight.pending
            choice = None
            if ahead <= QUEUED:
                self._await_publication(self.state_version - ahead)
                choice = self.batches.next(self.state_version, busy=bool(ahead))
            busy = choice is not None
            if choice is None:
                # slow joiners and restarted actors catch up; actor-side schedules (epsilon)
                # hear of the env steps admitted while no update runs (before learning starts)
                moved = (
                    self.algo.schedules is not None
                    and self.env_steps - self._published_steps
                    >= self.traj_steps * max(len(self.actors), 1)
                )
                if now - last_publish > rt.heartbeat_s or moved:
                    self.publish()
                    last_publish = now
                self._sync()
                continue
            self._learn(choice, exact)
            self._sync()
            # (the deterministic-lag mode's actors wait for every version)
            every = 1 if self.mode.fixed_order else self.controller.actions.publish_every
            if self.state_version % every == 0:
                self.publish()
                last_publish = time.perf_counter()
            if self.state_version % cfg.log_interval == 0:
                self._record()
            if self.recorder.due(self.state_version):
                self.settle()
                self.save_checkpoint(time.perf_counter())
        self.settle()
        if self._pending:
            self._record()  # the last record holds the final counts
        self.recorder.end_training(time.perf_counter())
        if self.sync is not None and (self.finished() or self.recorder.stop_now()):
            self.sync.finish(self.state.params, self.state_version)  # the group is done
        self.stats.train_cpu_s = time.process_time() - cpu0

    def _evaluation_message(self, msg: dict, now: float) -> None:
        """The evaluator's evaluation of one version: logged as a record of its own."""
        got = from_message(msg)
        if got is None:
            self.evaluations_rejected += 1
            return
        self.recorder.evaluation(
            got["version"], got["env_steps"], now, got["fields"], age_s=got["age_s"]
        )

    def _final_evaluation(self) -> None:
        """The final parameters evaluated here, unless the evaluator did that version."""
        final = self.recorder.evals.final
        if self.evaluation is None or (final and final["updates"] >= self.state_version):
            return
        taken = time.perf_counter()
        params = to_host(self.state.params)
        fields = self.evaluation.evaluate(params, self.state_version, self.env_steps)
        self.recorder.evaluation(self.state_version, self.env_steps, taken, fields)

    def _sync(self) -> None:
        """A group's update boundary: its GroupSync sends and merges (never waits)."""
        if self.sync is not None:
            params = self.sync.boundary(self.state.params, self.state_version)
            if params is not None:
                self.state = self.state._replace(params=params)

    def _await_publication(self, done: int) -> None:
        """Waits (at most PUBLISH_WAIT_S) until the newest parameters offered for a version
        the device has finished (`done`: the version after the last update read back) have
        been sent."""
        want = max((v for v in self._offered if v <= done), default=None)
        if want is not None and want > self._sent_seen:
            # once per version, sent or not (a skipped update's snapshot carries the
            # version before it: the one wanted never goes out)
            self.io.publisher.wait_sent(want, PUBLISH_WAIT_S)
            self._sent_seen = want

    def _learn(self, choice: Choice, exact: bool) -> None:
        """Dispatches one update on `choice` and counts what it consumed."""
        batch = None if choice.batch is None else self.sgd.global_batch(choice.batch)
        version = self.state_version
        # NOTE: on the host, from the host copy of the behaviour versions: a device op here
        # would wait for the running update, and the loop with it
        taus = staleness(version, np.asarray(choice.behaviour))
        t_update = time.perf_counter()
        if self.log is not None:
            self.log.write(
                {"e": "update", "sample": 1}
                if self.replay is not None
                else {"e": "update", "items": list(choice.items), "reuse": choice.reuse}
            )
        # (inside the loop's critical section: the update donates the state)
        self.state, metrics = self.sgd(self.state, batch, choice.reuse)
        # NOTE: dispatched, not finished: the version counts the update now and
        # takes back a skipped one when its flag is read (a few updates later in
        # async mode; at once in sync mode, where the versions must match exactly)
        self._version_cache = version + 1
        self._dispatches += 1
        if self.lag_ring is not None:
            self.lag_ring = self._push(self.lag_ring, self.state.params, version + 1)
        # counted at dispatch, taken back if its read-back says it was skipped (_absorb);
        # off-policy, a sample is fresh when it enters the buffer, not when it is replayed
        reuse = choice.reuse
        fresh = 0 if reuse or self.replay else int(taus.size)
        self.measures.consumed_batch(taus, taus.size, time.perf_counter(), reuse=reuse, fresh=fresh)
        self.fresh_updates += not reuse
        self.controller.consumed(float(taus.sum()), int(taus.size))
        self._counted.append(fresh)
        self.inflight.add(metrics, t_update)
        if exact:
            self.settle()
        else:
            self._absorb(self.inflight.take())

    # ------------------------------------------------------------------ records and checkpoints
    def _record(self) -> None:
        now = time.perf_counter()
        fields = self.stats.fields(now, self._pending)
        if self.sync is not None:
            fields.update(self.sync.fields())
        # when, on the clock every process shares: records of several learners (groups,
        # lock-step learners, a restarted learner's incarnations) and events outside the
        # run (a fault's time, experiments/studies/chaos) line up on it
        fields["unix_time"] = time.time()
        if self.ingress.admitted_at:  # per actor id: when its newest trajectory was admitted
            fields["actor_admitted_at"] = {str(a): t for a, t in self.ingress.admitted_at.items()}
        log = self.recorder.episode_log
        if log is not None:
            # the episodes that ended since the last record: a moving average over several
            # learners' actors is built from them (learner groups, lock-step learners)
            fields["episode_returns"] = [r for _, r in log[self._episodes_recorded :]]
            self._episodes_recorded = len(log)
        self._pending = []
        self.recorder.record(
            self.env_steps,
            self.state_version,
            now,
            rates=self.stats.rates(max(now - self.recorder.t_train, 1e-9)),
            fields=fields,
            shown={"tau": fields["staleness_mean"]},
        )

    def _checkpoint_tree(self) -> dict:
        tree = {"learner": self.state}
        if self.lag_ring is not None:
            tree["lag"] = self.lag_ring  # the versions the actors' next rollouts act with
        if self.replay is not None and self.config.checkpoint.replay:
            tree.update(self.replay.tree())
        return tree

    def _resume(self) -> None:
        """Continues from the newest readable checkpoint: state, version, counters."""
        tree, meta = self.recorder.resume(self._checkpoint_tree())
        self.state = tree["learner"]
        if self.lag_ring is not None:
            self.lag_ring = tree["lag"]
        if self.replay is not None:
            self.replay.restore(tree, meta)
        self.ingress.env_steps = int(meta["env_steps"])
        self.fresh_updates = int(meta["fresh_updates"])
        self.measures.load_state_dict(meta["balance"])
        if "controller" in meta:  # (checkpoints from before it was kept start it afresh)
            self.controller.load_state_dict(meta["controller"])
            self.limits.max_reuse = self.controller.actions.max_reuse
        self.resume_unlearned_samples = int(meta.get("unlearned_samples", 0))
        self.received_before = int(meta.get("received_total", 0))
        self._version_cache = int(to_host(self.state.version))

    def save_checkpoint(self, now: float) -> None:
        rec = self.recorder
        if rec.saver is None:
            return
        # NOTE: the pool is not saved: its trajectories were admitted (counted in env_steps
        # and the budget) but not learned from, so the counts saved leave them out. A run
        # resumed from here acts them again instead of ending short of its fresh budget;
        # `unlearned_samples` says how many that was (the summary reports it)
        pooled = 0 if self.replay is not None else len(self.pool) * self.traj_steps
        counters = dict(
            updates=self.state_version,
            env_steps=self.env_steps - pooled,
            fresh_updates=self.fresh_updates,
            unlearned_samples=pooled,
            # every learner incarnation's arrivals taken in up to here: learned from, pooled
            # (given back: unlearned_samples) or dropped by a named reason
            received_total=self.received_before + self.rx.taken,
        )
        balance = self.measures.state_dict()
        balance["produced"] -= pooled
        replay = (
            self.replay.counters()
            if self.replay
            else dict(learned=0, replay_added=0, replay_earned=0.0)
        )
        if self.log is not None:
            self.log.write({"e": "ckpt", "version": self.state_version})
        with self.io.fd_reserve.released():
            # the run's wall time so far (elapsed() already goes on from a resumed run's)
            rec.save(
                self.state_version,
                self._checkpoint_tree(),
                now,
                counters,
                dict(balance=balance, controller=self.controller.state_dict(), **replay),
            )

    def result(self) -> RunOutcome:
        # what arrived and was never taken, by actor: the ledger's last line
        self.ingress.count_unread(self.rx.unread_at_stop())
        now = time.perf_counter()
        params = to_host(self.state.params)
        digest = params_sha256(params)
        if self.log is not None:
            self.log.write({"e": "end", "version": self.state_version, "params_sha256": digest})
        return self.recorder.result(
            params=params,
            algo=self.algo,
            env=None,
            env_steps=self.env_steps,
            updates=self.state_version,
            skipped_updates=int(to_host(self.state.skipped_updates)),
            compile_time_s=self.compile_time_s,
            interrupted=self.interrupted,
            now=now,
            extra_summary={
                **self.stats.summary(now, self.recorder.session_time(now)),
                "learner_incarnation": self.address,
                "params_sha256": digest,  # what `tianjax replay` compares with
                # fresh samples of updates skipped for non-finite gradients
                # (not counted as fresh), and pooled samples the checkpoint this
                # run resumed from left out (acted again)
                "skipped_fresh_samples": self.skipped_fresh_samples,
                "resume_unlearned_samples": self.resume_unlearned_samples,
                "trajectories_received_before": self.received_before,
                # arrived but not taken when the learner stopped (accepted by the receiver,
                # or read from the socket at the stop, per actor in trajectories_by_actor):
                # neither learned from nor dropped (the rest of trajectories_received is)
                "trajectories_unread_at_stop": self.rx.in_hand,
                **({"evaluations_rejected": self.evaluations_rejected} if self.evaluation else {}),
                **(self.sync.summary() if self.sync is not None else {}),
                **({"episode_log": self.recorder.episode_log} if self.sync is not None else {}),
            },
        )

    # ------------------------------------------------------------------ shutdown
    def stop_actors(self, error: str | None = None) -> None:
        """Tells every actor to stop; with `error`, that the run failed (they exit non-zero)."""
        self.io.stop_actors(error)

    def close(self) -> None:
        self.inflight.close()
        if self.log is not None:
            self.log.close()
        if self.sync is not None:
            self.sync.close()
        self.io.close()
        if self.evaluation is not None:
            self.evaluation.close()


__all__ = ["PUBLISH_WAIT_S", "QUEUED", "Learner"]
