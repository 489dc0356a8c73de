"""The learner's batch policies: which samples the next update learns from.

    sync:   one trajectory from every actor, made with the current version;
    async:  any `batch_trajectories` pooled trajectories still within max_staleness;
    reuse:  (async, on-policy) another pass over the last batch while nothing fresh waits
            and no update runs, within the balance controller's reuse budget;
    replay: (off-policy) a sample from the replay buffer whenever the replay ratio says
            the learner owes gradient steps. The buffer's items are transitions (DQN,
            MADDPG: each trajectory flattened to T x B of them) or sequences (QMIX: one
            [T] item per env, stored with the recurrent state it started from), each step
            with its behaviour version; the settings are the algorithm's own replay section
            (`config.replay_config`: dqn, maddpg or qmix). Every count here is in samples
            (env steps): a sequence item is `rollout_len` of them.

A mixin of `Learner` (tianjax/runtime/learner.py), whose state it reads and writes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from tianjax import buffers, frame_replay
from tianjax.types import Sequences

# Trajectory fields that are [B, ...] rather than [T, B, ...]
_PER_ENV = ("last_obs", "trunc_obs", "trunc_t")


def batch_axis(field: str, kind: type | None = None) -> int:
    """The B axis of a field of a batch of type `kind`: [T, B, ...] leaves, except the
    per-env ones [B, ...]; Sequences are batch-major [B, T, ...] (carry [B, ...]) throughout."""
    if kind is Sequences:
        return 0
    return 0 if field in _PER_ENV else 1


def replay_items(batch):
    """One actor message's batch as replay items: Transitions [T, B] -> [T * B]; Sequences
    [B, T] are already one item per env."""
    return batch if isinstance(batch, Sequences) else buffers.flatten_time_batch(batch)


def concat_batches(batches: list):
    """Joins actor batches along B (device-resident leaves on the device: the join is
    queued behind the running update, and the host does not wait for it)."""
    first = batches[0]  # a field may be a tree itself (multi-agent observations)
    if len(batches) == 1:
        return first

    def join(*xs, a):
        return (jnp.concatenate(xs, axis=a) if isinstance(xs[0], jax.Array) else np.concatenate(xs, axis=a))

    return type(first)(*[jax.tree.map(lambda *xs, a=batch_axis(name): join(*xs, a=a),
                                      *[getattr(b, name) for b in batches])
                         for name in first._fields])


class BatchPolicy:
    """The batch for the next update, and when the budget is spent (methods of `Learner`)."""

    def _init_replay(self):
        """Off-policy: a replay buffer local to this process, of the algorithm's items
        (transitions or sequences); each update samples `batch_size` items per process and
        learns from all processes' samples."""
        cfg = self.config
        rc = cfg.replay_config
        self._sample_key = jax.random.key(cfg.seed + 1 + jax.process_index())
        self._frame_once = cfg.algo == "dqn" and cfg.dqn.frame_once
        if self._frame_once:
            # each observation stored once: an actor's [T, B] trajectory goes in whole, and a
            # sample is (transitions, mask); the update takes the mask as its weights' factor
            self.rb = jax.jit(frame_replay.init, static_argnums=0)(rc.buffer_size, self.template[0])
            self._replay_add = jax.jit(frame_replay.add, donate_argnums=0)
            self._replay_sample = jax.jit(lambda rb, key: frame_replay.sample(rb, key, rc.batch_size))
            update = self.algo.update
            self._update_fn = lambda state, batch, fresh: update(state, batch[0], fresh, batch[1])
            items = jax.eval_shape(self._replay_sample, self.rb, self._sample_key)
        else:
            items = jax.eval_shape(replay_items, self.template[0])
            one = jax.tree.map(lambda x: np.zeros(x.shape[1:], x.dtype), items)
            self.rb = jax.jit(buffers.replay_init, static_argnums=0)(rc.buffer_size, one)
            self._replay_add = jax.jit(lambda rb, b: buffers.replay_add(rb, replay_items(b)), donate_argnums=0)
            self._replay_sample = jax.jit(lambda rb, key: buffers.replay_sample(rb, key, rc.batch_size))
        # samples (env steps) in one sampled batch, this process's share (a sequence item
        # is rollout_len of them)
        self.replay_batch_samples = rc.batch_size * (cfg.rollout_len if self.algo.buffer == "sequences" else 1)
        # as Config.replay_ratio, by this algorithm's items (a registered one's too)
        self.replay_ratio = cfg.balance.target_replay_ratio or cfg.runtime.replay_ratio or (
            rc.updates_per_rollout * self.replay_batch_samples / (cfg.num_envs * cfg.rollout_len))
        n = rc.batch_size * jax.process_count()
        global_sds = jax.tree.map(lambda x: jax.ShapeDtypeStruct((n,) + x.shape[1:], x.dtype), items)
        self.batch_sharding = jax.tree.map(lambda _: NamedSharding(self.mesh, P("data")), global_sds)
        self.learned = 0  # samples learned from, this process's share
        self.replay_added = 0  # samples in the buffer (added by this process, ever)
        # samples owed in all: each sample admitted after learning_starts adds the ratio the
        # learner paced to when it arrived (the controller's replay_scale x the target)
        self.replay_earned = 0.0
        self.replay_throttled = False  # credits were held back since the controller's last decision
        return global_sds

    def _replay_admitted(self, samples: int) -> None:
        """Counts `samples` added to the buffer, and what they add to the samples owed."""
        starts = self.config.replay_config.learning_starts
        before = max(self.replay_added - starts, 0)
        self.replay_added += samples
        # NOTE: one process only: every process of a multi-process run must take the same
        # number of (collective) updates, so there the ratio is the target's
        scale = self.controller.actions.replay_scale if jax.process_count() == 1 else 1.0
        self.replay_earned += self.replay_ratio * scale * (max(self.replay_added - starts, 0) - before)

    @property
    def kept_steps(self) -> int:
        """Env steps admitted: what counts against the budget (also those that later expire
        in the pool unlearned: they were produced, and the actors stop at the budget)."""
        return self.balance.produced

    def _replay_owed(self) -> float:
        """Samples the learner still owes to the replay ratio: the paced ratio x each sample
        admitted after learning_starts, less the samples learned (this process's share)."""
        return max(self.replay_earned - self.learned, 0.0)

    def replay_ratio_measured(self) -> float:
        return self.learned / max(self.replay_added - self.config.replay_config.learning_starts, 1)

    def _replay_batch(self):
        """The next update's batch (global, sharded) and its behaviour versions, or None
        while the replay ratio says the learner is ahead of production."""
        if self._replay_owed() < self.replay_batch_samples:
            return None
        self._sample_key, key = jax.random.split(self._sample_key)
        local = jax.device_get(self._replay_sample(self.rb, key))
        versions = (local[0] if self._frame_once else local).version  # frame-once: (transitions, mask)
        self.learned += self.replay_batch_samples
        batch = jax.tree.map(lambda x, s, g: jax.make_array_from_process_local_data(s, x, g.shape),
                             local, self.batch_sharding, self._global_sds)
        return batch, np.asarray(versions)

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

    def _global_batch(self, local):
        if self.rx.place is not None:
            return jax.device_put(local, self.batch_sharding)  # already there but the versions
        return jax.tree.map(
            lambda x, s, g: jax.make_array_from_process_local_data(s, x, g.shape),
            local, self.batch_sharding, self._global_sds)

    def finished(self) -> bool:
        """The budget is spent: every fresh batch learned from (on-policy), or every admitted
        sample learned from as often as the replay ratio says (off-policy)."""
        if self.kept_steps < self.budget or (jax.process_count() > 1 and not self.replay):
            # NOTE: every process of a multi-process run must take the same number of
            # (collective) updates: there only the count of fresh batches decides
            return self.fresh_updates >= self.n_updates and not self.replay
        if self.replay:
            return self._replay_owed() < self.replay_batch_samples
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
        elif (self._last_batch is not None and self.config.mode == "async" and not self.inflight.pending
              and self.balance.may_reuse(self._last_reuse, self._last_batch[1], self.state_version)):
            # NOTE: only while no update runs (the device would idle): a reuse pass queued
            # behind a running update would make fresh data that arrives meanwhile wait
            local = self._last_batch[0]  # bounded reuse while no fresh data waits
            self._last_reuse += 1
        else:
            return None
        if chosen is None and self._split:
            return None, local.version, True  # the reuse pass learns on the prepared batch
        return self._global_batch(local), local.version, chosen is None
