"""The learner's off-policy batch strategy: a sample from the replay buffer whenever the
replay ratio says the learner owes gradient steps.

The buffer is tianjax.core.replay.setup's, local to this process: its items are transitions (DQN,
MADDPG: each trajectory flattened to T x B of them), sequences (QMIX: one [T] item per
env, with the recurrent state it started from) or, with dqn.frame_once, whole [T, B]
chunks; every step keeps its behaviour version, and the settings are the algorithm's own
replay section (`config.replay_config`). Each update samples `batch_size` items per
process and learns from all processes' samples.

Pacing: every sample admitted after `learning_starts` earns the ratio the learner paced
to when it arrived (the controller's `replay_scale` x the target ratio) in samples owed;
a batch is taken while a whole batch is owed. Every count is in samples (env steps): a
sequence item is `rollout_len` of them, and counts are this process's share.
"""

from __future__ import annotations

import jax
import numpy as np

from tianjax.config import Config
from tianjax.core.algorithm import Algorithm
from tianjax.core.replay.setup import make_replay
from tianjax.runtime.learner.batches.onpolicy import Choice


class ReplayBatches:
    """The replay buffer, its pacing and its samples (see the module doc)."""

    def __init__(self, config: Config, algo: Algorithm, template):
        """`template`: ShapeDtypeStructs of one actor's batch."""
        rc = self.rc = config.replay_config
        self.replay = make_replay(config, algo)
        self.key = jax.random.key(config.seed + 1 + jax.process_index())
        self.rb = jax.jit(self.replay.init)(template)
        self._add = jax.jit(self.replay.add, donate_argnums=0)
        self._sample = jax.jit(self.replay.sample)
        self.items = jax.eval_shape(self._sample, self.rb, self.key)  # one sample's, this process's
        # samples (env steps) in one sampled batch, this process's share
        self.batch_samples = rc.batch_size * algo.buffer.item_steps(config.rollout_len)
        # as Config.replay_ratio, by this algorithm's items (a registered one's too)
        self.ratio = (
            config.balance.target_replay_ratio
            or config.runtime.replay_ratio
            or (
                rc.updates_per_rollout * self.batch_samples / (config.num_envs * config.rollout_len)
            )
        )
        self.learned = 0  # samples learned from
        self.added = 0  # samples in the buffer (added by this process, ever)
        self.earned = 0.0  # samples owed in all
        self.throttled = False  # credits were held back since the controller's last decision

    def update_fn(self, update):
        """`update(state, batch, fresh)` as applied to a sample (frame-once: with its mask)."""
        return lambda state, sample, fresh: self.replay.apply(update, state, sample, fresh)

    def add(self, batch, samples: int, scale: float) -> None:
        """One admitted actor batch of `samples` env steps, paced at `scale` x the ratio."""
        self.rb = self._add(self.rb, batch)
        before = max(self.added - self.rc.learning_starts, 0)
        self.added += samples
        self.earned += self.ratio * scale * (max(self.added - self.rc.learning_starts, 0) - before)

    def owed(self) -> float:
        """Samples the learner still owes to the replay ratio."""
        return max(self.earned - self.learned, 0.0)

    def ratio_measured(self) -> float:
        return self.learned / max(self.added - self.rc.learning_starts, 1)

    def drained(self) -> bool:
        return self.owed() < self.batch_samples

    def next(self, version: int = 0, busy: bool = False) -> Choice | None:
        """This process's sample for the next update, or None while the learner is ahead."""
        if self.drained():
            return None
        return self.sample()

    def sample(self) -> Choice:
        """This process's next sample of the buffer, paced or not (a replayed run takes one
        where its log says the run took one)."""
        self.key, key = jax.random.split(self.key)
        local = jax.device_get(self._sample(self.rb, key))
        self.learned += self.batch_samples
        return Choice(local, np.asarray(self.replay.behaviour(local)), False)

    # ------------------------------------------------------------------ checkpoints
    def tree(self) -> dict:
        return {"replay": self.rb, "sample_key": self.key}

    def counters(self) -> dict:
        return {"learned": self.learned, "replay_added": self.added, "replay_earned": self.earned}

    def restore(self, tree: dict, meta: dict) -> None:
        """Resumes the pacing; with the buffer's contents (`tree` has them) exactly,
        without them the buffer refills to learning_starts and the ratio is held over
        what this session adds."""
        if "replay" not in tree:
            return
        self.rb, self.key = tree["replay"], tree["sample_key"]
        self.added = meta["replay_added"]
        self.earned = float(
            meta.get("replay_earned", self.ratio * max(self.added - self.rc.learning_starts, 0))
        )
        self.learned = int(meta["learned"])


__all__ = ["ReplayBatches"]
