"""The learner's update over its device mesh: the one place that knows about devices.

The update is data-parallel over the learner's devices (a 1-D 'data' mesh over local
devices, or the global mesh of a jax.distributed multi-process run): parameters are
replicated, each batch is split along its B axis, and XLA all-reduces the gradients.
On-policy, a batch is `batch_trajectories` actor batches of every process joined along B;
off-policy, `batch_size` replay items of every process.

`ShardedUpdate` compiles the algorithm's jitted update for these shardings (ahead of time,
with the state buffers donated), turns each process's local batch into a global array,
and, where one process drives one device, gives the receiver thread a `place` function
that starts each trajectory's copy to the device as soon as it is decoded.

With on-policy reuse and an algorithm whose update splits in two (PPO: prepare once per
batch, learn per pass), a reuse pass runs the epochs again on the batch as prepared when
it was first taken.
"""

from __future__ import annotations

from typing import Callable

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from tianjax.config import Config
from tianjax.core.algorithm import Algorithm
from tianjax.runtime.learner.batches.axes import batch_axis, concat_batches
from tianjax.runtime.modes import MODES, Mode


def learner_mesh(config: Config) -> Mesh:
    """A 1-D 'data' mesh over the learner's devices: the first runtime.learner_devices of
    this process's (null: all), or those it lists ("gpu:1-7": tianjax.launch.placement); all
    processes' in a multi-process run."""
    if jax.process_count() > 1:
        devices = jax.devices()
    elif config.runtime.learner_device_list is not None:
        from tianjax.launch.placement import learner_devices

        devices = learner_devices(config)
    else:
        devices = jax.local_devices()[: config.runtime.learner_devices or None]
    return Mesh(np.array(devices), ("data",))


def _widened(batch, k: int):
    """ShapeDtypeStructs of `k` batches like `batch` joined along B."""

    def widen(name, x):
        shape = list(x.shape)
        shape[batch_axis(name, type(batch))] *= k
        return jax.ShapeDtypeStruct(tuple(shape), x.dtype)

    return type(batch)(
        *[jax.tree.map(lambda x, n=n: widen(n, x), getattr(batch, n)) for n in batch._fields]
    )


class ShardedUpdate:
    """`template`: ShapeDtypeStructs of one actor's batch; `local_trajectories` of them
    per process make an on-policy batch. `items`: off-policy, one process's replay sample
    (ShapeDtypeStructs), and `update(state, sample, fresh)` the update on it."""

    def __init__(
        self,
        config: Config,
        algo: Algorithm,
        template,
        local_trajectories: int,
        items=None,
        update: Callable | None = None,
        mode: Mode | None = None,
    ):
        self.algo = algo
        self._template, self._k = template, local_trajectories
        self.mesh = learner_mesh(config)
        self.replicated = NamedSharding(self.mesh, P())
        n_dev = self.mesh.devices.size
        width = local_trajectories * config.num_envs * jax.process_count()
        if width % n_dev:
            raise ValueError(
                f"config key 'num_envs': the batch width {width} must divide over "
                f"{n_dev} learner devices"
            )
        kind = type(template)
        wide = _widened(template, local_trajectories * jax.process_count())
        # of one trajectory's fields, as of the batch's
        self.traj_sharding = kind(
            *[
                jax.tree.map(
                    lambda _, a=batch_axis(name, kind): NamedSharding(
                        self.mesh, P(*([None] * a), "data")
                    ),
                    getattr(wide, name),
                )
                for name in wide._fields
            ]
        )
        self.replay = items is not None
        if self.replay:
            n = jax.process_count()
            self.global_sds = jax.tree.map(
                lambda x: jax.ShapeDtypeStruct((x.shape[0] * n,) + x.shape[1:], x.dtype), items
            )
            self.batch_sharding = jax.tree.map(
                lambda _: NamedSharding(self.mesh, P("data")), self.global_sds
            )
        else:
            self.global_sds, self.batch_sharding = wide, self.traj_sharding
        self._update = update or algo.update
        # on-policy reuse with a split update (PPO): prepare once per batch, learn per pass
        mode = mode if mode is not None else MODES.get(config.mode)  # (None in fused mode)
        self.split = (
            algo.prepare is not None
            and not self.replay
            and mode is not None
            and mode.reuses
            and config.runtime.max_reuse > 0
            and jax.process_count() == 1
        )
        self.placed = not self.replay and jax.process_count() == 1 and n_dev == 1
        self.update = None  # compiled by compile()
        self._prepared = None

    def init_state(self, seed: int):
        """The algorithm's initial state, replicated.
        NOTE: made by a jitted program with a replicated output so that, in a multi-process
        run, every learner process holds the same global state."""
        return jax.jit(self.algo.init, out_shardings=self.replicated)(jax.random.key(seed))

    def compile(self, state) -> None:
        replicated, fresh = self.replicated, jax.ShapeDtypeStruct((), np.bool_)
        self._compile_join()
        if not self.split:
            self.update = (
                jax.jit(
                    self._update,
                    in_shardings=(replicated, self.batch_sharding, replicated),
                    out_shardings=(replicated, replicated),
                    donate_argnums=0,
                )
                .lower(state, self.global_sds, fresh)
                .compile()
            )
            return
        prepared = jax.eval_shape(self.algo.prepare, state, self.global_sds)
        sharding = jax.tree.map(
            lambda x: NamedSharding(self.mesh, P(None, "data") if x.ndim >= 2 else P()), prepared
        )
        self._prepare = (
            jax.jit(
                self.algo.prepare,
                in_shardings=(replicated, self.batch_sharding),
                out_shardings=sharding,
            )
            .lower(state, self.global_sds)
            .compile()
        )
        self._learn = (
            jax.jit(
                self.algo.learn,
                in_shardings=(replicated, sharding, replicated),
                out_shardings=(replicated, replicated),
                donate_argnums=0,
            )
            .lower(state, prepared, fresh)
            .compile()
        )

    def _compile_join(self) -> None:
        """Joins k placed trajectories of zeros once, so that the join's programs (one
        concatenate per field: tianjax.runtime.learner.batches.axes) are compiled here and
        not when the first batch is taken, with the learner idle and the actors' first
        trajectories waiting."""
        if self.replay or self._k < 2 or (place := self.placer()) is None:
            return
        zeros = jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), self._template)
        placed = place((zeros,))[0]
        jax.block_until_ready(concat_batches([placed] * self._k))

    def __call__(self, state, batch, reuse: bool):
        """(state, metrics) after one update on a global batch (None: a split update's reuse
        pass); dispatched, not finished. Donates `state`."""
        fresh = np.bool_(not reuse)
        if not self.split:
            return self.update(state, batch, fresh)
        if not reuse:
            self._prepared = self._prepare(state, batch)
        return self._learn(state, self._prepared, fresh)

    def global_batch(self, local):
        """This process's part of a batch as the global, sharded batch."""
        if self.placed:
            return jax.device_put(local, self.batch_sharding)  # already there but the versions
        return jax.tree.map(
            lambda x, s, g: jax.make_array_from_process_local_data(s, x, g.shape),
            local,
            self.batch_sharding,
            self.global_sds,
        )

    def placer(self):
        """What the receiver thread applies to a decoded (batch, episodes, act_steps): the
        batch's fields put on the learner's device, except the behaviour versions, which
        the loop reads on the host (staleness, admission). None (the loop copies whole
        batches) with several devices or processes, where a batch is split over them."""
        if jax.process_count() > 1 or self.mesh.devices.size > 1:
            return None
        names = [n for n in type(self.traj_sharding)._fields if n != "version"]
        shardings = [getattr(self.traj_sharding, n) for n in names]

        def place(tree):
            # one device_put over the fields: one dispatch for the whole trajectory, not one per field
            batch, *rest = tree
            placed = jax.device_put([getattr(batch, n) for n in names], shardings)
            return (batch._replace(**dict(zip(names, placed))), *rest)

        return place


__all__ = ["ShardedUpdate", "learner_mesh"]
