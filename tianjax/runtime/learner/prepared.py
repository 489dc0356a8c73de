"""What a learner builds before it binds a socket or reads a checkpoint: its algorithm, the
batch template, the replay buffer (off-policy), the update over the device mesh and an
initial state, and, once `compile()` is called, the compiled update.

None of it depends on where the run resumes from, so a warm standby learner
(`runtime.standby_learner`, tianjax.launch.role) builds and compiles it ahead of its turn,
and the Learner it becomes takes it as it is: the state is replaced by the checkpoint's,
whose shapes and shardings are those it was compiled for."""

from __future__ import annotations

import time
from dataclasses import dataclass

from tianjax.algos import make_algorithm
from tianjax.config import Config
from tianjax.envs.factory import env_spec
from tianjax.runtime.actor.sources import batch_template
from tianjax.runtime.learner.batches.replay import ReplayBatches
from tianjax.runtime.learner.sharded_update import ShardedUpdate
from tianjax.runtime.modes import mode_of


@dataclass
class Prepared:
    """A learner's update for one config, built; `compile()` compiles it."""

    algo: object
    template: tuple
    replay: ReplayBatches | None
    sgd: ShardedUpdate
    state: object  # the initial state (seed `config.seed`)
    compile_time_s: float = 0.0  # 0 until compiled

    def compile(self) -> None:
        """Compiles the update (once)."""
        if self.compile_time_s:
            return
        t = time.perf_counter()
        self.sgd.compile(self.state)
        self.compile_time_s = max(time.perf_counter() - t, 1e-9)


def prepare(config: Config) -> Prepared:
    """Builds the learner's update for `config` (not compiled yet)."""
    obs_shape, obs_dtype, action_spec = env_spec(config)
    algo = make_algorithm(
        config,
        obs_shape,
        action_spec,
        correct_staleness=config.staleness.correct,
        obs_dtype=obs_dtype,
    )
    template = batch_template(config, algo, obs_shape, obs_dtype)
    replay = ReplayBatches(config, algo, template[0]) if algo.buffer.replayed else None
    sgd = ShardedUpdate(
        config,
        algo,
        template[0],
        config.batch_trajectories,
        mode=mode_of(config),
        items=replay and replay.items,
        update=replay and replay.update_fn(algo.update),
    )
    return Prepared(algo, template, replay, sgd, sgd.init_state(config.seed))


__all__ = ["Prepared", "prepare"]
