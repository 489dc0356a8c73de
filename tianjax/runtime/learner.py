"""The learner role: an event loop around a zmq poller that fills a sample pool from any
actor and runs the jitted update on whatever the pool holds (TianJi's relaxed assignment
dependencies), or, in sync mode, on exactly one fresh trajectory from every actor.

    async: update as soon as `batch_trajectories` admitted trajectories are pooled, from
           any actors and of any (admitted) versions; the staleness of each sample feeds
           the loss's weights; parameters are published every `publish_every` updates.
    sync:  wait for one trajectory from every actor made with the current version, update,
           publish, repeat (strict assignment dependencies: the baseline TianJi beats).
    replay (off-policy, either mode): admitted trajectories go to a replay buffer, and
           gradient steps are paced against arrivals so that samples learned per sample
           produced (after `dqn.learning_starts`) hold the replay ratio; while the learner
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
import zmq
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from tianjax import buffers
from tianjax import checkpoint as ckpt
from tianjax import staleness as S
from tianjax.algos import make_algorithm
from tianjax.config import Config
from tianjax.metrics import EpisodeTracker, Progress, RunLogger
from tianjax.runtime import shutdown
from tianjax.runtime.balance import BalanceController
from tianjax.runtime.sources import batch_template, env_spec
from tianjax.runtime.resources import FdReserve, raise_fd_limit
from tianjax.transport.channels import ControlServer, ParamPublisher, TrajectoryReceiver
from tianjax.transport.security import secure_context
from tianjax.types import ParamsMessage


def learner_mesh(config: Config) -> Mesh:
    """A 1-D 'data' mesh over the learner's devices (all processes' in a multi-process run)."""
    if jax.process_count() > 1:
        devices = jax.devices()
    else:
        devices = jax.local_devices()[: config.runtime.learner_devices or None]
    return Mesh(np.array(devices), ("data",))


# Trajectory fields that are [B, ...] rather than [T, B, ...]
_PER_ENV = ("last_obs", "trunc_obs", "trunc_t")


def batch_axis(field: str) -> int:
    """The B axis of a batch field: [T, B, ...] leaves, except the per-env ones [B, ...]."""
    return 0 if field in _PER_ENV else 1


def concat_batches(batches: list):
    """Joins actor batches along B."""
    first = batches[0]  # a field may be a tree itself (multi-agent observations)
    return type(first)(*[jax.tree.map(lambda *xs, a=batch_axis(name): np.concatenate(xs, axis=a),
                                      *[getattr(b, name) for b in batches])
                         for name in first._fields])


def to_host(tree):
    """numpy copies of replicated arrays (works when other processes hold parts of the mesh)."""
    return jax.tree.map(lambda x: np.asarray(x.addressable_data(0)) if isinstance(x, jax.Array) else x, tree)


def save_params(path: str, params) -> None:
    """Parameters as a .npz of leaves keyed by their tree paths (plain arrays, no pickle)."""
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    tmp = path + ".tmp.npz"
    np.savez(tmp, **{jax.tree_util.keystr(k): np.asarray(v) for k, v in flat})
    os.replace(tmp, path)


def check_finite(batch) -> bool:
    """Every floating field must be finite: observations and rewards, and also the
    behaviour log-probs, values and bootstrap values the losses use (NaN/inf samples are
    dropped and counted, never learned from)."""
    for x in jax.tree.leaves(batch):
        x = np.asarray(x)
        if np.issubdtype(x.dtype, np.floating) and not np.isfinite(x).all():
            return False
    return True


class LearnerStalled(RuntimeError):
    """No actor has delivered anything for longer than the configured timeout."""


class Learner:
    """The learner process's state and loop. `endpoints` are where actors connect."""

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
                                   correct_staleness=config.staleness.correct)
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
        self.batch_sharding = type(batch_template_tree)(*[
            jax.tree.map(lambda _, a=batch_axis(name): NamedSharding(self.mesh, P(*([None] * a), "data")),
                         getattr(batch_template_tree, name))
            for name in batch_template_tree._fields])
        # NOTE: initialised by a jitted program with a replicated output so that, in a
        # multi-process run, every learner process holds the same global state.
        self.state = jax.jit(self.algo.init, out_shardings=replicated)(jax.random.key(config.seed))
        self.replay = self.algo.buffer == "replay"
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
        self.balance = BalanceController(config.staleness.max_staleness, rt.max_pool,
                                         rt.max_reuse if jax.process_count() == 1 else 0)
        self.tracker = EpisodeTracker(config.target_return, target_win_rate=config.target_win_rate)
        self.traj_steps = config.rollout_len * config.num_envs
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
        self.dropped_nonfinite = 0
        self.env_steps = 0
        self._version_cache = int(to_host(self.state.version))
        self._params_cache = None
        self._global_sds = batch_template_tree
        self._poller, self._reading = None, False
        self.n_updates = self.budget // config.steps_per_update  # on-policy: fresh batches
        self.fresh_updates = 0
        self._counts0 = (0, 0, 0)  # env steps, samples consumed and fresh when this session began
        self.wall_offset = 0.0
        self.resumed_from = None
        self.checkpoint_root = checkpoint_root or (logger.run_dir if logger is not None else None)
        self.saver = None
        if config.resume:
            self._resume(config.resume)

    # ------------------------------------------------------------------ checkpoints
    def _checkpoint_tree(self) -> dict:
        tree = {"learner": self.state}
        if self.replay and self.config.checkpoint.replay:
            tree.update(replay=self.rb, sample_key=self._sample_key)
        return tree

    def _resume(self, run_dir: str) -> None:
        """Continues from the newest readable checkpoint: state, version, counters."""
        step, tree, meta = ckpt.restore_latest(run_dir, self._checkpoint_tree())
        ckpt.check_compatible(meta, self.config, run_dir)
        self.state = tree["learner"]
        if "replay" in tree:
            self.rb, self._sample_key = tree["replay"], tree["sample_key"]
            self.replay_added = meta["replay_added"]
        self.env_steps = int(meta["env_steps"])
        self.fresh_updates = int(meta["fresh_updates"])
        self.wall_offset = float(meta["wall_time_s"])
        self.tracker.load_state_dict(meta["tracker"])
        self.balance.load_state_dict(meta["balance"])
        if self.replay:
            # without the buffer's contents, the buffer refills to learning_starts and the
            # ratio is held over what this session adds
            self.learned = int(meta["learned"]) if "replay" in tree else 0
        self._version_cache = int(to_host(self.state.version))
        self.resumed_from = step

    def save_checkpoint(self, now: float, t_start: float) -> None:
        if self.saver is None:
            return
        meta = dict(ckpt.run_meta(self.config), updates=self.state_version, env_steps=self.env_steps,
                    fresh_updates=self.fresh_updates, wall_time_s=self.wall_offset + now - t_start,
                    tracker=self.tracker.state_dict(), balance=self.balance.state_dict(),
                    learned=getattr(self, "learned", 0), replay_added=getattr(self, "replay_added", 0))
        with self.fd_reserve.released():
            self.saver.save(self.state_version, self._checkpoint_tree(), meta)

    def compile(self) -> None:
        """Compiles the update. Separate from __init__ so that a launcher can bind the
        sockets, start the actors, and let them start up while this compiles."""
        if self.compile_time_s:
            return
        t = time.perf_counter()
        replicated = self._replicated
        fresh = jax.ShapeDtypeStruct((), np.bool_)
        if not self._split:
            self.update = jax.jit(self.algo.update, in_shardings=(replicated, self.batch_sharding, replicated),
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

    def _init_replay(self):
        """Off-policy: a replay buffer local to this process; each update samples
        `dqn.batch_size` transitions per process and learns from all processes' samples."""
        cfg = self.config
        batch = self.template[0]
        flat = jax.tree.map(lambda x: jax.ShapeDtypeStruct((x.shape[0] * x.shape[1],) + x.shape[2:], x.dtype),
                            batch)
        one = jax.tree.map(lambda x: np.zeros(x.shape[1:], x.dtype), flat)
        self.rb = jax.jit(buffers.replay_init, static_argnums=0)(cfg.dqn.buffer_size, one)
        self._replay_add = jax.jit(lambda rb, b: buffers.replay_add(rb, buffers.flatten_time_batch(b)),
                                   donate_argnums=0)
        self._replay_sample = jax.jit(lambda rb, key: buffers.replay_sample(rb, key, cfg.dqn.batch_size))
        self._sample_key = jax.random.key(cfg.seed + 1 + jax.process_index())
        self.replay_ratio = cfg.runtime.replay_ratio or (
            cfg.dqn.updates_per_rollout * cfg.dqn.batch_size / (cfg.num_envs * cfg.rollout_len))
        n = cfg.dqn.batch_size * jax.process_count()
        global_sds = jax.tree.map(lambda x: jax.ShapeDtypeStruct((n,) + x.shape[1:], x.dtype), flat)
        self.batch_sharding = jax.tree.map(lambda _: NamedSharding(self.mesh, P("data")), global_sds)
        self.learned = 0  # samples learned from, this process's share
        self.replay_added = 0  # samples in the buffer (added by this process, ever)
        return global_sds

    @property
    def kept_steps(self) -> int:
        """Env steps admitted: what counts against the budget (also those that later expire
        in the pool unlearned: they were produced, and the actors stop at the budget)."""
        return self.balance.produced

    def _replay_owed(self) -> float:
        """Samples the learner still owes to the replay ratio: ratio x (samples admitted
        after learning_starts) - samples learned (this process's share)."""
        produced = self.replay_added - self.config.dqn.learning_starts
        if produced < 0:
            return 0.0
        return self.replay_ratio * produced - self.learned

    def replay_ratio_measured(self) -> float:
        return self.learned / max(self.replay_added - self.config.dqn.learning_starts, 1)

    def _replay_batch(self):
        """The next update's batch (global, sharded) and its behaviour versions, or None
        while the replay ratio says the learner is ahead of production."""
        cfg = self.config
        if self._replay_owed() < cfg.dqn.batch_size:
            return None
        self._sample_key, key = jax.random.split(self._sample_key)
        local = jax.device_get(self._replay_sample(self.rb, key))
        self.learned += cfg.dqn.batch_size
        batch = jax.tree.map(lambda x, s, g: jax.make_array_from_process_local_data(s, x, g.shape),
                             local, self.batch_sharding, self._global_sds)
        return batch, np.asarray(local.version)

    @property
    def endpoints(self) -> dict:
        return {"params": self.params_pub.endpoint, "traj": self.traj_in.endpoint,
                "control": self.control.endpoint}

    def _global_template(self):
        batch = self.template[0]
        k = self.local_trajectories * jax.process_count()

        def widen(name, x):
            shape = list(x.shape)
            shape[batch_axis(name)] *= k
            return jax.ShapeDtypeStruct(tuple(shape), x.dtype)

        return type(batch)(*[jax.tree.map(lambda x, n=n: widen(n, x), getattr(batch, n))
                             for n in batch._fields])

    # ------------------------------------------------------------------ ingress
    def _credits_left(self) -> int:
        """Trajectories the budget still allows beyond those admitted and in flight. (An actor
        not heard from for the heartbeat timeout is gone: its slots no longer count.)"""
        now, limit = time.perf_counter(), self.config.runtime.heartbeat_timeout_s
        outstanding = sum(max(info["outstanding"], 0) for info in self.actors.values()
                          if now - max(info.get("last_seen", 0.0), info["last_traj"]) <= limit)
        return (self.budget - self.kept_steps) // self.traj_steps - outstanding

    def _grant(self, ident: bytes, n: int = 1) -> None:
        info = self.actors.get(ident)
        n = min(n, self._credits_left())
        if n > 0 and info is not None and self.control.send(ident, {"type": "credit", "n": n}):
            info["outstanding"] += n

    def _release_held(self) -> None:
        """Replay: hands back the credits held while the learner was behind, once it owes
        at most a trajectory per actor."""
        slack = self.replay_ratio * self.traj_steps * max(len(self.actors), 1)
        while self._held and self._replay_owed() <= slack:
            self._grant(self._held.popleft())

    def _ingest(self, msg, now: float, t_start: float) -> None:
        batch, episodes, act_steps = msg.tree
        samples = self.traj_steps
        ident = msg.sender.encode()
        if ident in self.actors:
            self.actors[ident]["outstanding"] -= 1
            self.actors[ident]["last_traj"] = now
        if not check_finite(batch):
            self.dropped_nonfinite += 1
            self._grant(ident)
            return
        version = int(self.state_version)
        admitted = self.balance.admit(int(msg.version), version, samples, now)
        if admitted:
            self._act_steps = int(act_steps)
            self._lag_max = max(self._lag_max, self.env_steps - self._act_steps)
            self.env_steps += samples
        done = np.asarray(episodes.done)
        if done.any():
            won = None if getattr(episodes, "won", None) is None else np.asarray(episodes.won)[done]
            self.tracker.add(np.asarray(episodes.returns)[done], self.env_steps, now - t_start, wins=won)
        if not admitted:
            self._grant(ident)
        elif self.replay:
            self.rb = self._replay_add(self.rb, batch)
            self.replay_added += samples
            self._held.append(ident)
            self._release_held()
        else:
            self.pool.append((int(msg.version), ident, batch))

    def _handle_control(self, ident, msg: dict, now: float) -> None:
        kind = msg.get("type")
        if kind not in ("register", "heartbeat"):
            return
        new = ident not in self.actors
        info = self.actors.setdefault(ident, {"actor": msg.get("actor"), "outstanding": 0, "last_traj": now})
        info["last_seen"] = now
        # a sync actor waits for the next version after each trajectory: one slot is all it
        # uses, and more would let the first actors take a small budget from the others
        window = 1 if self.config.mode == "sync" else self.config.runtime.credits_per_actor
        if kind == "register" or new:
            # a new or restarted actor (or, heard first by a heartbeat, one that was working
            # for a learner that restarted): whatever it held before is gone
            info["outstanding"] = 0
            self._grant(ident, window)
            self.publish()  # a late joiner gets the current parameters at once
        elif (msg.get("credits") == 0 and info["outstanding"] > 0
              and now - info["last_traj"] > 2 * self.config.runtime.heartbeat_s
              and self._reading and not self.traj_in.socket.poll(0)):
            # its trajectories were lost on the way (rejected, dropped): hand the slots back.
            # NOTE: only with nothing left unread: after a long update or compilation the
            # heartbeats are read before the trajectories queued behind them, which are
            # late, not lost (handing out slots for them let the actors run ahead)
            info["outstanding"] = 0
            self._grant(ident, window)

    def pump(self, timeout_ms: int, t_start: float = 0.0) -> int:
        """Waits up to timeout_ms for control messages and trajectories and takes in what
        has arrived (the pool's room permitting: a full pool leaves the socket unread, so
        the high-water marks push back on actors). Returns the trajectories received."""
        if self._poller is None:
            self._poller = zmq.Poller()
            self._poller.register(self.control.socket, zmq.POLLIN)
        room = self.balance.accept_more(len(self.pool))
        if room and not self._reading:
            self._poller.register(self.traj_in.socket, zmq.POLLIN)
            self._reading = True
        elif not room and self._reading:
            self._poller.unregister(self.traj_in.socket)
            self._reading = False
        events = dict(self._poller.poll(timeout=timeout_ms))
        now = time.perf_counter()
        if self.control.socket in events:
            self._drain_control(now)
        received = 0
        if self._reading and self.traj_in.socket in events:
            while len(self.pool) < self.config.runtime.max_pool and (msg := self.traj_in.recv(0)) is not None:
                self._ingest(msg, now, t_start)
                received += 1
        return received

    def _drain_control(self, now: float) -> None:
        while (item := self.control.poll(0)) is not None:
            self._handle_control(*item, now)

    def silent_actors(self, now: float) -> list[int]:
        """Registered actors not heard from (control or trajectories) for longer than the
        heartbeat timeout: hung, stopped, or cut off."""
        limit = self.config.runtime.heartbeat_timeout_s
        # NOTE: read what waits on the control socket first: after a long update the
        # heartbeats that arrived meanwhile are queued, not missing
        self._drain_control(now)
        return sorted(info["actor"] for info in self.actors.values()
                      if isinstance(info.get("actor"), int)
                      and now - max(info["last_seen"], info["last_traj"]) > limit)

    def forget_actor(self, actor_id: int) -> None:
        """Drops an actor that is being replaced; its replacement registers afresh. What it
        already delivered stays in the pool."""
        for ident, info in list(self.actors.items()):
            if info.get("actor") == actor_id:
                del self.actors[ident]
                self.control.forget(ident)

    # ------------------------------------------------------------------ consumption
    def _take_batch(self):
        """The trajectories for the next update, or None if the pool cannot make one."""
        k = self.local_trajectories
        if self.config.mode == "sync":
            # strict: one trajectory per actor, made with the current version
            current = int(self.state_version)
            fresh = [item for item in self.pool if item[0] == current]
            by_sender = {}
            for item in fresh:
                by_sender.setdefault(item[1], item)
            if len(by_sender) < k:
                return None
            chosen = list(by_sender.values())[:k]
            for item in chosen:
                self.pool.remove(item)
            # older leftovers can never be used in sync mode
            for item in [i for i in self.pool if i[0] < current]:
                self.pool.remove(item)
                self.balance.expire(self.traj_steps)
                self._grant(item[1])
        else:
            # admission again at consumption: a trajectory that aged past max_staleness
            # while it waited in the pool is dropped, not learned from
            for item in [i for i in self.pool if not self.balance.fresh_enough(i[0], self.state_version)]:
                self.pool.remove(item)
                self.balance.expire(self.traj_steps)
                self._grant(item[1])
            if len(self.pool) < k:
                return None
            chosen = [self.pool.popleft() for _ in range(k)]
        for item in chosen:
            self._grant(item[1])  # its slot is free again
        return chosen

    @property
    def state_version(self) -> int:
        return int(self._version_cache)

    def publish(self) -> None:
        self._published_steps = self.env_steps
        self.params_pub.publish(self.state_version,
                                ParamsMessage(self._host_params(), np.asarray(self.env_steps, np.int64)))

    def _host_params(self):
        if self._params_cache is None or self._params_cache[0] != self.state_version:
            params = to_host(self.state.params)
            self._params_cache = (self.state_version, params)
        return self._params_cache[1]

    def _global_batch(self, local):
        return jax.tree.map(
            lambda x, s, g: jax.make_array_from_process_local_data(s, x, g.shape),
            local, self.batch_sharding, self._global_sds)

    # ------------------------------------------------------------------ the loop
    def finished(self) -> bool:
        """The budget is spent: every fresh batch learned from (on-policy), or every admitted
        sample learned from as often as the replay ratio says (off-policy)."""
        if self.kept_steps < self.budget or (jax.process_count() > 1 and not self.replay):
            # NOTE: every process of a multi-process run must take the same number of
            # (collective) updates: there only the count of fresh batches decides
            return self.fresh_updates >= self.n_updates and not self.replay
        if self.replay:
            return self._replay_owed() < self.config.dqn.batch_size
        return len(self.pool) < self.local_trajectories

    def _next_batch(self):
        """(global batch, behaviour versions, is_reuse) for the next update, or None."""
        if self.replay:
            got = self._replay_batch()
            return None if got is None else (*got, False)
        chosen = self._take_batch()
        if chosen is not None:
            local = concat_batches([item[2] for item in chosen])
            self._last_batch, self._last_reuse = (local, min(i[0] for i in chosen)), 0
        elif (self._last_batch is not None and self.config.mode == "async"
              and self.balance.may_reuse(self._last_reuse, self._last_batch[1], self.state_version)):
            local = self._last_batch[0]  # bounded reuse while no fresh data waits
            self._last_reuse += 1
        else:
            return None
        if chosen is None and self._split:
            return None, local.version, True  # the reuse pass learns on the prepared batch
        return self._global_batch(local), local.version, chosen is None

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
            self._final_checkpoint(t_start, completed)
        return self.result(t_start)

    def _final_checkpoint(self, t_start: float, completed: bool) -> None:
        if self.saver is None:
            return
        try:
            # NOTE: in a multi-process run every learner must join a save; after a failure
            # on one of them the others would wait for it, so only a whole run saves there
            if self.config.checkpoint.final and (completed or jax.process_count() == 1):
                self.save_checkpoint(time.perf_counter(), t_start)
        except Exception as e:  # noqa: BLE001 - interrupted mid-update: the state was donated
            print(f"tianjax: warning: no final checkpoint ({type(e).__name__}: {e}); "
                  f"the last periodic one stands", file=sys.stderr, flush=True)
        finally:
            self.saver.close()
            self.saver = None

    def _loop(self, should_stop, t_start: float) -> None:
        cfg, rt = self.config, self.config.runtime
        self._last_batch, self._last_reuse = None, 0
        pending: list[dict] = []
        self.publish()
        t_train = last_publish = last_arrival = time.perf_counter()
        busy = False
        while not self.finished() and not should_stop():
            shutdown.check()
            # NOTE: block (until a message or 50 ms) only when the last pass found no work;
            # right after an update more may be waiting in the pool.
            received = self.pump(0 if busy else 50, t_start)
            now = time.perf_counter()
            if received:
                last_arrival = now
            # until the first trajectory of this session, actors may still be starting
            limit = rt.connect_timeout_s if self.env_steps == self._counts0[0] else rt.heartbeat_timeout_s
            if now - last_arrival > limit:
                raise LearnerStalled(f"no trajectory from any actor for {limit:.0f} s "
                                     f"({len(self.actors)} registered)")
            if self._held:
                self._release_held()
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
            with shutdown.critical():  # the update donates the state: finish it
                if self._split:
                    if not reuse:
                        self._prepared = self._prepare(self.state, batch)
                    self.state, metrics = self._learn(self.state, self._prepared, np.bool_(not reuse))
                else:
                    self.state, metrics = self.update(self.state, batch, np.bool_(not reuse))
                self._version_cache = version + 1 - int(to_host(metrics["update_skipped"]))
            pending.append(metrics)
            # off-policy, a sample is fresh when it enters the buffer, not when it is replayed
            self.balance.consumed_batch(taus, taus.size, time.perf_counter(), reuse=reuse,
                                        fresh=0 if reuse or self.replay else taus.size)
            self.fresh_updates += not reuse
            if self.state_version % rt.publish_every == 0:
                self.publish()
                last_publish = time.perf_counter()
            if self.state_version % cfg.log_every == 0:
                self._log(pending, t_start, t_train)
                pending = []
            if self.saver is not None and self.saver.due(self.state_version):
                with shutdown.critical():
                    self.save_checkpoint(time.perf_counter(), t_start)
        if pending:
            self._log(pending, t_start, t_train)  # the last record holds the final counts
        self._train_time = time.perf_counter() - t_train

    def _log(self, pending, t_start, t_train):
        now = time.perf_counter()
        train_time = max(now - t_train, 1e-9)
        record = {
            "env_steps": self.env_steps,
            "updates": self.state_version,
            "wall_time_s": now - t_start,
            "env_steps_per_s": (self.env_steps - self._counts0[0]) / train_time,
            **self._sample_rates(train_time),
            "return_mean_100": self.tracker.moving_average,
            **({"win_rate_100": self.tracker.win_rate} if self.tracker.reports_wins else {}),
            "episodes": self.tracker.episodes,
            "pool": len(self.pool),
            "actors_seen": len(self.actors),
            "rejected_messages": sum(self.traj_in.rejected.values()) + sum(self.control.rejected.values()),
            "dropped_nonfinite": self.dropped_nonfinite,
            **self.balance.metrics(now),
            # consumed samples per tau since the previous record (TensorBoard histogram)
            "staleness_hist": self.balance.take_interval_histogram(),
        }
        record["samples_fresh"] = self._fresh_samples()
        if self.replay:
            record["replay_ratio"] = self.replay_ratio_measured()
            record["replay_ratio_target"] = self.replay_ratio
        if self.algo.schedules is not None:
            # what the actors acted with: the schedules at the global count they last used
            record["actor_env_steps"] = self._act_steps
            # how far behind the global count an actor's schedules were, at worst, this interval
            record["actor_steps_lag_max"], self._lag_max = self._lag_max, 0
            record.update({k: float(v) for k, v in self.algo.schedules(self._act_steps).items()})
        if pending:
            host = to_host(pending)
            record.update({k: float(np.mean([m[k] for m in host])) for k in host[0]})
        if self.logger is not None:
            self.logger.log(record)
        if self.progress is not None:
            self.progress.update(self.env_steps, ret=record["return_mean_100"],
                                 tau=record["staleness_mean"], sps=int(record["env_steps_per_s"]))

    def _sample_rates(self, train_time: float) -> dict:
        """Fresh samples (learned from for the first time; off-policy: added to replay) and
        consumed samples (every sample of every update, reuse and replay included) per
        second of this session's training, and the share of consumption that was reuse."""
        fresh = self._fresh_samples() - self._counts0[2]
        consumed = self.balance.consumed - self._counts0[1]
        return {"samples_fresh_per_s": fresh / train_time,
                "samples_consumed_per_s": consumed / train_time,
                "reuse_fraction": 1.0 - fresh / consumed if consumed and not self.replay else 0.0}

    def _fresh_samples(self) -> int:
        # off-policy, a sample is fresh when it enters the replay buffer: it is learned from
        # (replay_ratio times on average) from then on
        return self.replay_added if self.replay else self.balance.fresh

    def stop_actors(self, error: str | None = None) -> None:
        """Tells every actor to stop; with `error`, that the run failed (they exit non-zero)."""
        self.control.broadcast({"type": "stop"} if error is None else {"type": "stop", "error": error[:500]})

    def result(self, t_start: float) -> dict:
        train_time = getattr(self, "_train_time", time.perf_counter() - t_start - self.wall_offset)
        stats = self.balance.staleness_stats()
        rejected = collections.Counter(self.traj_in.rejected) + collections.Counter(self.control.rejected)
        return {
            "params": to_host(self.state.params),
            "algo": self.algo,
            "env": None,
            "env_steps": self.env_steps,
            "updates": self.state_version,
            "skipped_updates": int(to_host(self.state.skipped_updates)),
            "train_time_s": train_time,
            "compile_time_s": self.compile_time_s,
            "env_steps_per_s": (self.env_steps - self._counts0[0]) / max(train_time, 1e-9),
            "resumed_from_step": self.resumed_from,
            "interrupted": getattr(self, "interrupted", False),
            "wall_offset_s": self.wall_offset,
            "episodes": self.tracker.episodes,
            "final_return": self.tracker.moving_average,
            "convergence_time_s": self.tracker.convergence_time_s,
            "convergence_env_steps": self.tracker.convergence_env_steps,
            "final_win_rate": self.tracker.win_rate if self.tracker.reports_wins else None,
            "extra_summary": {
                "num_actors": self.config.num_actors,
                **self._sample_rates(max(train_time, 1e-9)),
                **({"replay_ratio": self.replay_ratio_measured(), "replay_ratio_target": self.replay_ratio}
                   if self.replay else {}),
                "staleness_mean": stats["staleness_mean"],
                "staleness_max": stats["staleness_max"],
                "staleness_histogram": self.balance.staleness_histogram(),
                "dropped_samples": self.balance.dropped,
                "dropped_nonfinite": self.dropped_nonfinite,
                # every valid trajectory that arrived (admitted or dropped): what the actors sent
                "trajectories_received": self.traj_in.accepted,
                "rejected_messages": sum(rejected.values()),
                "rejected_by_reason": dict(rejected),
                # connections refused at the handshake (no run credentials), by reason
                "handshakes_refused": dict(self.net.gatekeeper.refused),
                "balance": self.balance.metrics(time.perf_counter()),
                "learner_devices": int(self.mesh.devices.size),
            },
        }

    def close(self) -> None:
        for ch in (self.params_pub, self.traj_in, self.control):
            ch.close()
        self.net.close()
        self.fd_reserve.close()
