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

The update is data-parallel over the learner's devices (a 1-D mesh over local devices, or
the global mesh of a jax.distributed multi-process run): parameters are replicated, the
batch is split along its B axis, and XLA all-reduces the gradients.
"""

from __future__ import annotations

import collections
import os
import sys
import time
from typing import Callable

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from tianjax import checkpoint as ckpt
from tianjax import staleness as S
from tianjax.algos import make_algorithm
from tianjax.config import Config
from tianjax.metrics import EpisodeTracker, Progress, RunLogger
from tianjax.runtime import shutdown
from tianjax.runtime.balance import BalanceController
from tianjax.runtime.batching import BatchPolicy, batch_axis
from tianjax.runtime.controller import AdaptiveBalance
from tianjax.runtime.inflight import InFlight, snapshot, to_host
from tianjax.runtime.ingress import Ingress
from tianjax.runtime.publisher import Publisher
from tianjax.runtime.receiver import Receiver
from tianjax.runtime.records import LearnerRecords
from tianjax.runtime.sources import batch_template, env_spec
from tianjax.runtime.resources import FdReserve, raise_fd_limit
from tianjax.transport.channels import ControlServer, ParamPublisher, TrajectoryReceiver
from tianjax.transport.security import secure_context
from tianjax.types import ParamsMessage

WAIT_NOTICE_S = 30.0  # while no actor has registered, the learner says so this often


def learner_mesh(config: Config) -> Mesh:
    """A 1-D 'data' mesh over the learner's devices (all processes' in a multi-process run)."""
    if jax.process_count() > 1:
        devices = jax.devices()
    else:
        devices = jax.local_devices()[: config.runtime.learner_devices or None]
    return Mesh(np.array(devices), ("data",))


def save_params(path: str, params) -> None:
    """Parameters as a .npz of leaves keyed by their tree paths (plain arrays, no pickle)."""
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    tmp = path + ".tmp.npz"
    np.savez(tmp, **{jax.tree_util.keystr(k): np.asarray(v) for k, v in flat})
    os.replace(tmp, path)


class LearnerStalled(RuntimeError):
    """No actor has delivered anything for longer than the configured timeout."""


class Learner(Ingress, BatchPolicy, LearnerRecords):
    """The learner process's state and loop; ingress (runtime/ingress.py) and batch
    policies (runtime/batching.py) are its mixins. `endpoints` are where actors connect."""

    def __init__(self, config: Config, run_key, logger: RunLogger | None = None,
                 progress: Progress | None = None, endpoints: dict | None = None,
                 checkpoint_root: str | None = None, ipc_dir: str | None = None,
                 listen_fds: dict | None = None):
        """`checkpoint_root`: the run directory whose checkpoints/ this learner writes
        (default: the logger's run directory; none without a logger). In a multi-process
        run every learner process must name the same one. `ipc_dir`: where ipc sockets
        go (the launcher's private directory). `listen_fds`: listening sockets the launcher
        holds for `endpoints` (channel name -> descriptor; see launch/ports.py)."""
        self.config = config
        self.logger = logger
        self.progress = progress
        rt = config.runtime
        obs_shape, obs_dtype, action_spec = env_spec(config)
        self.algo = make_algorithm(config, obs_shape, action_spec,
                                   correct_staleness=config.staleness.correct, obs_dtype=obs_dtype)
        self.template = batch_template(config, self.algo, obs_shape, obs_dtype)
        self.mesh = learner_mesh(config)
        n_dev = self.mesh.devices.size
        self.local_trajectories = config.batch_trajectories
        width = self.local_trajectories * config.num_envs * jax.process_count()
        if width % n_dev:
            raise ValueError(f"config key 'num_envs': the batch width {width} must divide over "
                             f"{n_dev} learner devices")
        replicated = NamedSharding(self.mesh, P())
        batch_template_tree = self._global_template()
        kind = type(batch_template_tree)
        self.batch_sharding = kind(*[
            jax.tree.map(lambda _, a=batch_axis(name, kind): NamedSharding(self.mesh, P(*([None] * a), "data")),
                         getattr(batch_template_tree, name))
            for name in batch_template_tree._fields])
        # NOTE: initialised by a jitted program with a replicated output so that, in a
        # multi-process run, every learner process holds the same global state.
        self.state = jax.jit(self.algo.init, out_shardings=replicated)(jax.random.key(config.seed))
        traj_sharding = self.batch_sharding  # of one trajectory's fields, as of the batch's
        self.replay = self.algo.buffer in ("replay", "sequences")
        if self.replay:
            batch_template_tree = self._init_replay()
        self._replicated = replicated
        self.update = None  # compiled by compile(), after the sockets are up
        # on-policy reuse with a split update (PPO): prepare once per batch, learn per pass
        self._split = (self.algo.prepare is not None and not self.replay and config.mode == "async"
                       and rt.max_reuse > 0 and jax.process_count() == 1)
        self._prepared = None
        self.compile_time_s = 0.0

        host, ep, fds = rt.bind_host, endpoints or {}, listen_fds or {}
        # peers hold descriptors here before they authenticate: use all the OS allows, and
        # keep a reserve for checkpoints (see runtime/resources.py)
        raise_fd_limit()
        self.fd_reserve = FdReserve()
        # its own context: the gatekeeper (ZAP handler) admits only this run's peers
        self.net = secure_context(run_key, rt, server=True)
        net = dict(ctx=self.net.ctx, handshake=self.net.handshake, host=host, transport=rt.transport,
                   ipc_dir=ipc_dir)
        # the sender name is this incarnation's: actors follow a restarted learner's versions
        self.params_pub = ParamPublisher(run_key, endpoint=ep.get("params"), **net, use_fd=fds.get("params"),
                                         sender=f"learner-{jax.process_index()}-{os.urandom(4).hex()}")
        self.traj_in = TrajectoryReceiver(run_key, self.template, endpoint=ep.get("traj"), **net,
                                          use_fd=fds.get("traj"),
                                          hwm=rt.recv_hwm, max_bytes=int(rt.max_message_mb * 2**20))
        self.control = ControlServer(run_key, endpoint=ep.get("control"), **net, use_fd=fds.get("control"))
        # checks and decodes trajectories on its own thread while updates run, and (one
        # process, one device) starts their copies to the device there
        self.rx = Receiver(self.traj_in, self.net.ctx, place=self._placer(traj_sharding))
        # and signs and sends parameters on another
        # NOTE: the count goes out as it is when the message is sent (an int read across
        # threads), so actor-side schedules (epsilon) never hear of an older one than need be
        self.publisher = Publisher(self.params_pub,
                                   stamp=lambda m: m._replace(env_steps=np.asarray(self.env_steps, np.int64)))
        # updates run while the loop goes on; a third thread reads their results back
        self.inflight = InFlight(limit=2)
        self._dispatches = 0  # updates dispatched by this session
        self._pending: list[dict] = []  # read-back metrics of finished updates, not yet logged
        self.balance = BalanceController(config.staleness.max_staleness, rt.max_pool,
                                         rt.max_reuse if jax.process_count() == 1 else 0)
        self.tracker = EpisodeTracker(config.target_return, target_win_rate=config.target_win_rate)
        self.traj_steps = config.rollout_len * config.num_envs
        # the set-point controller: the runtime's credits, publish_every and reuse are its bounds
        bc = config.balance
        self.controller = AdaptiveBalance(
            adaptive=config.balance_adaptive, target_staleness=bc.target_staleness,
            batch_trajectories=self.local_trajectories, max_credits_per_actor=rt.credits_per_actor,
            max_publish_every=rt.publish_every, max_reuse=self.balance.max_reuse,
            n_actors=max(config.num_actors, 1), period_s=bc.period_s, deadband=bc.deadband,
            target_replay_ratio=self.replay_ratio if self.replay else None,
            traj_samples=self.traj_steps, batch_size=self.replay_batch_samples if self.replay else 0)
        # env steps the actors may produce: on-policy, whole updates' worth (the schedules
        # end there); off-policy, whole trajectories' worth of total_env_steps
        self.budget = (config.total_env_steps // (config.steps_per_update if self.algo.buffer == "onpolicy"
                                                  else self.traj_steps)) * (
            config.steps_per_update if self.algo.buffer == "onpolicy" else self.traj_steps)
        self._held: collections.deque = collections.deque()  # replay: credits held back while behind
        self._act_steps = 0  # the global env-step count the newest admitted trajectory was acted at
        self._published_steps = 0  # the env-step count the last publication carried
        self._lag_max = 0  # since the last record: max (env steps admitted - that count) on arrival
        self.pool: collections.deque = collections.deque()
        self.actors: dict[bytes, dict] = {}  # identity -> {"actor", "last_seen", "outstanding", "last_traj"}
        self.actor_time_s: dict[bytes, dict] = {}  # identity -> where its time went (its newest heartbeat)
        # said every WAIT_NOTICE_S while no actor has registered (multi-host: which flags)
        self.waiting_hint, self.waiting_who = "its actors (tianjax launch --role actor ...)", "learner"
        self.dropped_nonfinite = 0
        self.env_steps = 0
        self._version_cache = int(to_host(self.state.version))
        self._params_cache = None
        self._global_sds = batch_template_tree
        self._poller = None
        self.n_updates = self.budget // config.steps_per_update  # on-policy: fresh batches
        self.fresh_updates = 0
        self._counts0 = (0, 0, 0)  # env steps, samples consumed and fresh when this session began
        self.wall_offset = 0.0
        self.resumed_from = None
        self.checkpoint_root = checkpoint_root or (logger.run_dir if logger is not None else None)
        self.saver = None
        if config.resume:
            self._resume(config.resume)

    def compile(self) -> None:
        """Compiles the update. Separate from __init__ so that a launcher can bind the
        sockets, start the actors, and let them start up while this compiles."""
        if self.compile_time_s:
            return
        t = time.perf_counter()
        replicated = self._replicated
        fresh = jax.ShapeDtypeStruct((), np.bool_)
        if not self._split:
            update = getattr(self, "_update_fn", self.algo.update)  # (frame-once replay: with its mask)
            self.update = jax.jit(update, in_shardings=(replicated, self.batch_sharding, replicated),
                                  out_shardings=(replicated, replicated), donate_argnums=0).lower(
                self.state, self._global_sds, fresh).compile()
        else:
            # reuse passes run the epochs again on the batch as prepared when first taken
            prepared = jax.eval_shape(self.algo.prepare, self.state, self._global_sds)
            sharding = jax.tree.map(lambda x: NamedSharding(self.mesh, P(None, "data") if x.ndim >= 2 else P()),
                                    prepared)
            self._prepare = jax.jit(self.algo.prepare, in_shardings=(replicated, self.batch_sharding),
                                    out_shardings=sharding).lower(self.state, self._global_sds).compile()
            self._learn = jax.jit(self.algo.learn, in_shardings=(replicated, sharding, replicated),
                                  out_shardings=(replicated, replicated), donate_argnums=0).lower(
                self.state, prepared, fresh).compile()
        self.compile_time_s = max(time.perf_counter() - t, 1e-9)

    def _placer(self, sharding):
        """What the receiver thread applies to a decoded (batch, episodes, act_steps): the
        batch's fields put on the learner's device, except the behaviour versions, which
        the loop reads on the host (staleness, admission). None (the loop copies whole
        batches) with several devices or processes, where a batch is split over them."""
        if jax.process_count() > 1 or self.mesh.devices.size > 1:
            return None
        names = type(self.template[0])._fields

        def place(tree):
            batch, *rest = tree
            fields = [getattr(batch, n) if n == "version" else jax.device_put(getattr(batch, n), getattr(sharding, n))
                      for n in names]
            return (type(batch)(*fields), *rest)

        return place

    @property
    def endpoints(self) -> dict:
        return {"params": self.params_pub.endpoint, "traj": self.traj_in.endpoint,
                "control": self.control.endpoint}

    def _global_template(self):
        batch = self.template[0]
        k = self.local_trajectories * jax.process_count()

        def widen(name, x):
            shape = list(x.shape)
            shape[batch_axis(name, type(batch))] *= k
            return jax.ShapeDtypeStruct(tuple(shape), x.dtype)

        return type(batch)(*[jax.tree.map(lambda x, n=n: widen(n, x), getattr(batch, n))
                             for n in batch._fields])

    @property
    def state_version(self) -> int:
        return int(self._version_cache)

    def publish(self) -> None:
        """Offers the newest parameters to the publisher thread without waiting for them:
        a device copy of (version, params) whose host copy is under way, so the version
        sent is the device's own (exact even while a skipped update is still unread). In a
        multi-process run (where a device copy would be a program every process must run)
        the host copy is made here."""
        self._published_steps = self.env_steps
        if self._params_cache is None or self._params_cache[0] != self._dispatches:
            if jax.process_count() == 1:
                version, params = snapshot((self.state.version, self.state.params))
            else:
                version, params = self.state_version, to_host(self.state.params)
            self._params_cache = (self._dispatches, version, params)
        _, version, params = self._params_cache
        self.publisher.offer(version, ParamsMessage(params, np.asarray(self.env_steps, np.int64)))

    def _absorb(self, finished: list[dict]) -> None:
        """Takes in the read-back metrics of finished updates: a skipped one (non-finite
        gradients, the state kept) did not advance the version."""
        for m in finished:
            self._version_cache -= int(m["update_skipped"])
            self._pending.append(m)

    def settle(self) -> None:
        """Waits for the updates in flight, so that the version and counts are exact."""
        self._absorb(self.inflight.settle())

    # ------------------------------------------------------------------ the loop
    def run(self, should_stop: Callable[[], bool] = lambda: False, t_start: float | None = None) -> dict:
        """Trains until the budget is spent (see finished(); counting what the run it resumed
        learned), `should_stop()` says so, or an error. Checkpoints every
        `checkpoint.every` updates and, with `checkpoint.final`, at the end, including an
        end by Ctrl-C, SIGTERM or a stall (the state is always a whole update's)."""
        cfg = self.config
        # a resumed run's clock goes on from where it stopped
        t_start = (t_start or time.perf_counter()) - self.wall_offset
        if self.checkpoint_root is not None and self.saver is None:
            self.saver = ckpt.Checkpointer(self.checkpoint_root, cfg.checkpoint.keep, cfg.checkpoint.every,
                                           start=self.state_version)
        self._counts0 = (self.env_steps, self.balance.consumed, self._fresh_samples())
        self.compile()
        completed = False
        self.interrupted = False
        try:
            self._loop(should_stop, t_start)
            completed = True
        except KeyboardInterrupt:
            # Ctrl-C / SIGTERM: stop here, checkpoint, and report what was done
            self.interrupted = True
        finally:
            self.inflight.close()
            self._absorb(self.inflight.take())
            self.rx.stop()
            self.publisher.stop()
            self._final_checkpoint(t_start, completed)
        return self.result(t_start)

    def _loop(self, should_stop, t_start: float) -> None:
        cfg, rt = self.config, self.config.runtime
        self._last_batch, self._last_reuse = None, 0
        self._pending: list[dict] = []
        exact = cfg.mode == "sync" or jax.process_count() > 1  # the version read back after each update
        self.publish()
        t_train = last_publish = last_arrival = time.perf_counter()
        cpu0 = time.process_time()  # this process's CPU time, all its threads (XLA's too)
        # the notice comes every WAIT_NOTICE_S, or halfway through a shorter wait
        notice_every = min(WAIT_NOTICE_S, rt.connect_timeout_s / 2)
        busy, notice_at = False, notice_every
        while not self.finished() and not should_stop():
            shutdown.check()
            # NOTE: block (until a message or 50 ms) only when the last pass found no work;
            # right after an update more may be waiting in the pool. While an update runs,
            # look again within 5 ms: when it ends, a reuse pass may be due.
            received = self.pump(0 if busy else 5 if self.inflight.pending else 50, t_start)
            now = time.perf_counter()
            if received:
                last_arrival = now
            # until the first trajectory of this session, actors may still be starting
            limit = rt.connect_timeout_s if self.env_steps == self._counts0[0] else rt.heartbeat_timeout_s
            if not self.actors and now - last_arrival > notice_at:
                print(f"tianjax: {self.waiting_who}: no actor has connected after {now - last_arrival:.0f} s "
                      f"(waiting up to {limit:.0f} s, runtime.connect_timeout_s): start {self.waiting_hint}",
                      file=sys.stderr, flush=True)
                notice_at += notice_every
            elif self.actors:
                notice_at = notice_every
            if now - last_arrival > limit:
                raise LearnerStalled(f"no trajectory from any actor for {limit:.0f} s "
                                     f"({len(self.actors)} registered)")
            if self._held:
                self._release_held()
            self._steer(now)
            nxt = self._next_batch()
            busy = nxt is not None
            if nxt is None:
                # slow joiners and restarted actors catch up; actor-side schedules (epsilon)
                # hear of the env steps admitted while no update runs (before learning starts)
                moved = (self.algo.schedules is not None
                         and self.env_steps - self._published_steps >= self.traj_steps * max(len(self.actors), 1))
                if now - last_publish > rt.heartbeat_s or moved:
                    self.publish()
                    last_publish = now
                continue
            batch, behaviour, reuse = nxt
            version = self.state_version
            taus = np.asarray(S.staleness(version, behaviour))
            t_update = time.perf_counter()
            with shutdown.critical():  # the update donates the state: finish it
                if self._split:
                    if not reuse:
                        self._prepared = self._prepare(self.state, batch)
                    self.state, metrics = self._learn(self.state, self._prepared, np.bool_(not reuse))
                else:
                    self.state, metrics = self.update(self.state, batch, np.bool_(not reuse))
                # NOTE: dispatched, not finished: the version counts the update now and
                # takes back a skipped one when its flag is read (a few updates later in
                # async mode; at once in sync mode, where the versions must match exactly)
                self._version_cache = version + 1
                self._dispatches += 1
            self.inflight.add(metrics, t_update)
            if exact:
                self.settle()
            else:
                self._absorb(self.inflight.take())
            # off-policy, a sample is fresh when it enters the buffer, not when it is replayed
            self.balance.consumed_batch(taus, taus.size, time.perf_counter(), reuse=reuse,
                                        fresh=0 if reuse or self.replay else taus.size)
            self.fresh_updates += not reuse
            self.controller.consumed(float(taus.sum()), int(taus.size))
            if self.state_version % self.controller.actions.publish_every == 0:
                self.publish()
                last_publish = time.perf_counter()
            if self.state_version % cfg.log_every == 0:
                self._log(self._pending, t_start, t_train)
                self._pending = []
            if self.saver is not None and self.saver.due(self.state_version):
                with shutdown.critical():
                    self.settle()
                    self.save_checkpoint(time.perf_counter(), t_start)
        self.settle()
        if self._pending:
            self._log(self._pending, t_start, t_train)  # the last record holds the final counts
            self._pending = []
        self._train_time = time.perf_counter() - t_train
        self._train_cpu = time.process_time() - cpu0

    def _steer(self, now: float) -> None:
        """Asks the controller for its actions (it moves at most once a period) and applies
        a move: the reuse budget at once, a larger window by granting the new slots."""
        moves, decided = self.controller.moves, self.controller.decisions
        throttled = self.replay and self.replay_throttled
        actions = self.controller.decide(now, self.balance.production_rate(now),
                                         self.balance.consumption_rate(now), throttled=throttled)
        if self.replay and self.controller.decisions != decided:
            self.replay_throttled = False  # a new period
        if self.controller.moves == moves:
            return
        self.balance.max_reuse = actions.max_reuse
        for ident in list(self.actors):
            self._grant(ident, self._window(ident) - self._in_hand(ident))

    def stop_actors(self, error: str | None = None) -> None:
        """Tells every actor to stop; with `error`, that the run failed (they exit non-zero)."""
        self.control.broadcast({"type": "stop"} if error is None else {"type": "stop", "error": error[:500]})

    def close(self) -> None:
        self.inflight.close()
        self.rx.close()
        self.publisher.stop()
        for ch in (self.params_pub, self.traj_in, self.control):
            ch.close()
        self.net.close()
        self.fd_reserve.close()
