"""The runtime sections of a config: staleness, runtime (processes, sockets, security),
balance, checkpoint and groups (learner groups and their averager)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Literal

from tianjax.config.checks import check_key
from tianjax.config.device_lists import DeviceList, parse_devices


def _check_schedule(section, name: str) -> None:
    """The checks of a staleness schedule's settings (schedule, power, kappa, tau0,
    max_staleness), shared by the sections that weigh by staleness: the loss's (in updates)
    and the learner groups' (in rounds)."""
    check_key(section.power >= 0, f"{name}.power", f"must be >= 0, got {section.power}")
    check_key(section.kappa > 0, f"{name}.kappa", f"must be > 0, got {section.kappa}")
    check_key(section.tau0 >= 0, f"{name}.tau0", f"must be >= 0, got {section.tau0}")
    check_key(
        section.max_staleness is None or section.max_staleness >= 0,
        f"{name}.max_staleness",
        f"must be >= 0 or null, got {section.max_staleness}",
    )
    check_key(
        section.schedule != "cutoff" or section.max_staleness is not None,
        f"{name}.max_staleness",
        "must be set for schedule 'cutoff'",
    )


@dataclass(frozen=True)
class StalenessConfig:
    correct: bool = True  # false: the plain losses, every sample weighted 1 (for comparisons)
    # w(tau): constant (1), polynomial (1 + tau)^-power, exponential exp(-tau / kappa),
    # hinge (1 up to tau0, then (1 + tau - tau0)^-power), cutoff (1 up to max_staleness, then
    # 0), divergence (PPO: 1 / (1 + D_v / eps^2), D_v the batch's mean (log pi_0/mu)^2 over
    # the samples of a version; the bias-variance weight of tianjax/core/staleness.py)
    schedule: Literal["constant", "polynomial", "exponential", "hinge", "cutoff", "divergence"] = (
        "constant"
    )
    power: float = 0.5
    kappa: float = 8.0
    tau0: int = 4
    max_staleness: int | None = None  # samples older than this are dropped (null: keep all)
    # PPO: weight also by min(rho_bar, pi / mu) (IMPALA: V-trace clips). The default 1 is
    # biased towards mu where pi_0 favours an action more than mu did (the ratio is cut
    # there), for weights bounded by 1; see tianjax/algos/ppo.py
    rho_bar: float = 1.0
    # rescale weights to mean 1 over the kept samples of a batch (self-normalised: biased by
    # O(1/N)); a constant factor on a batch's weights does not change Adam's step either way
    normalise: bool = True
    # PPO: multiply each update's learning rate by the mean unnormalised w(tau) of its kept
    # samples. Adam divides a gradient scaled by a constant c by the same c, so a discount of
    # a batch that is stale as a whole does nothing as a loss weight: it has to act on the
    # step (see tianjax/core/staleness.py)
    scale_lr: bool = False
    # actors act with the parameters of exactly this many updates ago (fused mode: a ring of
    # past versions in the loop's state, the first K updates acting with version 0, so tau
    # is exact and deterministic; async: each actor's ring of the versions it received, at
    # least K behind); 0: off. For staleness studies
    forced_lag: int = 0

    def __post_init__(self):
        check_key(
            isinstance(self.forced_lag, int)
            and not isinstance(self.forced_lag, bool)
            and self.forced_lag >= 0,
            "staleness.forced_lag",
            f"must be an int >= 0, got {self.forced_lag!r}",
        )
        _check_schedule(self, "staleness")
        check_key(self.rho_bar > 0, "staleness.rho_bar", f"must be > 0, got {self.rho_bar}")
        check_key(
            self.correct or not self.scale_lr,
            "staleness.scale_lr",
            "needs staleness.correct: true (textbook PPO computes no weights to scale by)",
        )


@dataclass(frozen=True)
class RuntimeConfig:
    """The distributed runtime (modes sync and async): processes, sockets, balance."""

    batch_trajectories: int | None = None  # actor trajectories per update (null: num_actors)
    publish_every: int = 1  # updates between parameter broadcasts
    # when an async actor takes a newer parameter version: rollout (only between rollouts;
    # a trajectory has one version) or step (also between two vector steps of a rollout, a
    # non-blocking look at the parameter channel before each; every step is stamped with the
    # version that acted). step needs a host env (its rollout is a Python loop; a JAX env's
    # is one lax.scan). null: step for async actors on host envs, rollout elsewhere
    param_refresh: Literal["rollout", "step"] | None = None
    credits_per_actor: int = 2  # trajectories an actor may have in flight or pooled (flow control)
    max_pool: int = 64  # trajectories the learner holds; beyond it, it stops reading (HWM)
    max_reuse: int = 0  # on-policy: extra passes over a batch while no fresh data is waiting
    replay_ratio: float | None = None  # off-policy: samples learned per sample produced
    # (null: as in fused mode, dqn.updates_per_rollout * dqn.batch_size / (num_envs * rollout_len))
    send_hwm: int = 2  # trajectories an actor may have queued before its sends block
    recv_hwm: int = 4  # trajectories queued at the learner's socket
    transport: Literal["tcp", "ipc"] = "tcp"
    bind_host: str = "127.0.0.1"  # where the learner binds; loopback unless set
    security: Literal["plain", "curve"] | None = None  # who may connect: plain (ZeroMQ PLAIN: a
    # token derived from the run key, sent in clear at the handshake, MACs on every message;
    # cheap; formerly "mac"), curve (CurveZMQ: also
    # encrypts, and actors verify the learner's key; costs CPU per byte); null: curve unless
    # bind_host is loopback
    allow_hosts: tuple[str, ...] = ()  # IP addresses allowed to connect to the learner (empty: any
    # holding the run's credentials)
    io_threads: int | None = None  # ZeroMQ I/O threads of the learner (null: 2 with curve, else 1)
    max_connections_per_host: int | None = None  # tcp connections one host may hold on each of
    # the learner's sockets; more are ended as they are accepted (null: num_actors + 8, every
    # actor of the run on one host and its restarts; 0: no limit)
    heartbeat_s: float = 1.0  # actor -> learner heartbeat period
    heartbeat_timeout_s: float = 120.0  # silence after which a peer counts as lost (a learner
    # is silent during an update: raise this for updates that take minutes, e.g. CNNs on CPU)
    connect_timeout_s: float = 600.0  # how long an actor waits for a (starting) learner
    max_message_mb: float = 256.0  # larger messages are rejected unread
    # where actor processes (and the evaluator) run: a platform (cpu, gpu, ...; each process
    # on the first device of it), or a platform with device ids, "gpu:0" or "gpu:0,1", over
    # which the processes are spread, each seeing only its own (tianjax.launch.placement)
    actor_devices: str = "cpu"
    # the devices the learner's update spans: a count of this host's (null: all of them), or
    # a platform with device ids, "gpu:1-7" or "cpu:0,1"
    learner_devices: int | str | None = None
    actor_threads: int = 1  # XLA/Eigen threads per actor process (2-core machines)
    max_actor_restarts: int = 3  # a dead or silent actor is restarted up to this many times
    # a warm standby per actor process: started with it, it imports, builds its envs and
    # compiles, then waits; a dead or silent actor is replaced by its standby at once (no
    # start-up: docs/faults.md), and a new standby starts behind it. Costs one idle process
    # (its memory) per actor
    standby_actors: bool = False
    restart_learner: bool = False  # a dead learner is restarted from its last checkpoint
    max_learner_restarts: int = 2  # ... up to this many times
    # with restart_learner: a warm standby learner process (imported, its update compiled,
    # waiting) takes a dead learner's place, from the same checkpoint, without a start-up
    # (docs/faults.md); costs one idle process, with its own copy of the learner's state
    standby_learner: bool = False
    # a command put before each actor process's own on this machine, "{actor}" in it replaced
    # by the actor's id (the evaluator's: num_actors): [taskset, -c, "{actor}"] pins actors to
    # cores, [ip, netns, exec, "host{actor}"] starts each in a network namespace; it must exec
    # what follows it, as those do (empty: none)
    actor_wrapper: tuple[str, ...] = ()
    # RUN_DIR/replay.jsonl: where every trajectory came from and every update's batch, in
    # order, so that `tianjax replay RUN_DIR` can redo the run in one process, bit for bit
    replay_log: bool = True
    deterministic: bool = False  # the deterministic-lag mode (mode async, Cleanba-like): the
    # envs are batch_trajectories shards (seeded per shard, spread over the actor processes),
    # rollout r of every shard acts with the parameters of version max(0, r -
    # deterministic_lag), and update u learns from rollout u of every shard, in shard order: no
    # reuse, nothing dropped by timing, so the parameters depend on the config alone, not on the
    # number of actor processes or their speed (tianjax.runtime.modes)
    deterministic_lag: int = 1  # k: updates between the parameters acted with and learned at

    @property
    def actor_device_list(self) -> DeviceList:
        return parse_devices(self.actor_devices, "runtime.actor_devices")

    @property
    def learner_device_list(self) -> DeviceList | None:
        """The learner's devices where named ("gpu:1-7"); None for a count or null."""
        if not isinstance(self.learner_devices, str):
            return None
        listed = parse_devices(self.learner_devices, "runtime.learner_devices")
        check_key(
            listed.ids is not None,
            "runtime.learner_devices",
            f"a platform alone is not a list; give its device ids ('{listed.platform}:0,1') "
            "or a count",
        )
        return listed

    def __post_init__(self):
        check_key(
            self.batch_trajectories is None or self.batch_trajectories >= 1,
            "runtime.batch_trajectories",
            "must be >= 1 or null",
        )
        check_key(self.publish_every >= 1, "runtime.publish_every", "must be >= 1")
        check_key(
            self.param_refresh in (None, "rollout", "step"),
            "runtime.param_refresh",
            f"must be rollout, step or null, got {self.param_refresh!r}",
        )
        check_key(self.max_pool >= 1, "runtime.max_pool", "must be >= 1")
        check_key(self.credits_per_actor >= 1, "runtime.credits_per_actor", "must be >= 1")
        check_key(self.max_reuse >= 0, "runtime.max_reuse", "must be >= 0")
        check_key(
            self.replay_ratio is None or self.replay_ratio > 0,
            "runtime.replay_ratio",
            "must be > 0 or null",
        )
        check_key(self.send_hwm >= 1, "runtime.send_hwm", "must be >= 1")
        check_key(self.recv_hwm >= 1, "runtime.recv_hwm", "must be >= 1")
        check_key(self.heartbeat_s > 0, "runtime.heartbeat_s", "must be > 0")
        check_key(
            self.heartbeat_timeout_s > self.heartbeat_s,
            "runtime.heartbeat_timeout_s",
            "must be larger than runtime.heartbeat_s",
        )
        check_key(self.connect_timeout_s > 0, "runtime.connect_timeout_s", "must be > 0")
        check_key(self.max_message_mb > 0, "runtime.max_message_mb", "must be > 0")
        for i, host in enumerate(self.allow_hosts):
            try:
                ipaddress.ip_address(host)
            except ValueError:
                check_key(
                    False, f"runtime.allow_hosts[{i}]", f"must be an IP address, got {host!r}"
                )
        check_key(
            self.io_threads is None or self.io_threads >= 1,
            "runtime.io_threads",
            "must be >= 1 or null",
        )
        check_key(
            self.max_connections_per_host is None or self.max_connections_per_host >= 0,
            "runtime.max_connections_per_host",
            "must be >= 0 (0: no limit) or null",
        )
        self.actor_device_list  # (a ConfigError naming the key where it does not parse)
        if isinstance(self.learner_devices, str):
            self.learner_device_list
        else:
            check_key(
                self.learner_devices is None or self.learner_devices >= 1,
                "runtime.learner_devices",
                "must be >= 1, null, or a platform with device ids such as 'gpu:1-7'",
            )
        check_key(self.actor_threads >= 1, "runtime.actor_threads", "must be >= 1")
        check_key(self.max_actor_restarts >= 0, "runtime.max_actor_restarts", "must be >= 0")
        check_key(self.max_learner_restarts >= 0, "runtime.max_learner_restarts", "must be >= 0")
        check_key(
            self.restart_learner or not self.standby_learner,
            "runtime.standby_learner",
            "needs runtime.restart_learner: true (a standby only takes a restarted learner's place)",
        )
        for i, part in enumerate(self.actor_wrapper):
            try:
                ok = isinstance(part, str) and isinstance(part.format(actor=0), str)
            except (KeyError, IndexError, ValueError):
                ok = False
            check_key(
                ok,
                f"runtime.actor_wrapper[{i}]",
                f"must be a string whose only placeholder is {{actor}}, got {part!r}",
            )
        check_key(
            isinstance(self.deterministic_lag, int)
            and not isinstance(self.deterministic_lag, bool)
            and self.deterministic_lag >= 0,
            "runtime.deterministic_lag",
            f"must be an int >= 0, got {self.deterministic_lag!r}",
        )


@dataclass(frozen=True)
class BalanceConfig:
    """The balance controller (mode async): a set-point on what the learner consumes. The
    runtime section's credits_per_actor, publish_every and max_reuse are its upper bounds
    (and where it starts); it moves them between 1 (0 for reuse) and those values."""

    mode: Literal["fixed", "adaptive"] | None = None  # null: adaptive in mode async, else fixed
    target_staleness: float = 2.0  # on-policy: mean tau (updates) of the consumed samples
    target_replay_ratio: float | None = None  # off-policy: samples learned per sample produced
    # (null: runtime.replay_ratio, or as in fused mode)
    period_s: float = 1.0  # seconds between decisions
    deadband: float = 0.15  # no move while |measured - target| <= deadband * target

    def __post_init__(self):
        check_key(
            self.target_staleness >= 0,
            "balance.target_staleness",
            f"must be >= 0, got {self.target_staleness}",
        )
        check_key(
            self.target_replay_ratio is None or self.target_replay_ratio > 0,
            "balance.target_replay_ratio",
            f"must be > 0 or null, got {self.target_replay_ratio}",
        )
        check_key(self.period_s > 0, "balance.period_s", f"must be > 0, got {self.period_s}")
        check_key(
            0 <= self.deadband < 1, "balance.deadband", f"must be in [0, 1), got {self.deadband}"
        )


@dataclass(frozen=True)
class CheckpointConfig:
    """Orbax checkpoints of the whole learner state, under <run_dir>/checkpoints."""

    every: int = 0  # updates between checkpoints (0: only the final one)
    keep: int = 3  # checkpoints kept (the newest)
    final: bool = True  # write one at the end of the run (and on Ctrl-C / SIGTERM)
    replay: bool = False  # DQN: include the replay buffer (large; fused runs always do). Without
    # it a resumed run refills the buffer with `dqn.learning_starts` samples before learning

    def __post_init__(self):
        check_key(self.every >= 0, "checkpoint.every", f"must be >= 0, got {self.every}")
        check_key(self.keep >= 1, "checkpoint.keep", f"must be >= 1, got {self.keep}")


@dataclass(frozen=True)
class GroupsConfig:
    """Learner groups (modes sync and async): `count` learners, each with its own actors,
    pool and balance controller, whose parameters an averager combines every few updates
    (tianjax.core.outer_step has the rule). num_actors and total_env_steps are the whole
    run's, split evenly over the groups."""

    count: int = 1  # learner groups (1: one learner, no averager)
    sync_every: int = 4  # updates between a group's deltas (its change since the average it took)
    # how the averager combines the deltas of a round: mean (TianJi's plain average) or
    # nesterov (DiLoCo's outer SGD with Nesterov momentum, outer_lr and outer_momentum)
    outer: Literal["mean", "nesterov"] = "mean"
    outer_lr: float = 0.7  # nesterov: the outer learning rate
    outer_momentum: float = 0.9  # nesterov: the outer momentum
    timeout_s: float = 30.0  # a group silent this long is left out of rounds until it sends again
    # a round closes when every live group has sent a delta, or when the oldest delta waiting
    # has waited this long
    round_wait_s: float = 2.0
    # a delta's weight by its staleness in rounds (rounds closed since the average it was
    # computed from), with the loss's schedules: constant (1), polynomial (1 + tau)^-power,
    # exponential exp(-tau / kappa), hinge (1 up to tau0, then (1 + tau - tau0)^-power),
    # cutoff (1 up to max_staleness, then 0); weights are normalised over a round's deltas
    schedule: Literal["constant", "polynomial", "exponential", "hinge", "cutoff"] = "constant"
    power: float = 0.5
    kappa: float = 4.0
    tau0: int = 2
    max_staleness: int | None = None  # deltas staler than this (rounds) are dropped and counted
    checkpoint_every: int = 1  # rounds between the averager's checkpoints (and one at its end)

    def __post_init__(self):
        check_key(self.count >= 1, "groups.count", f"must be >= 1, got {self.count}")
        check_key(self.sync_every >= 1, "groups.sync_every", f"must be >= 1, got {self.sync_every}")
        check_key(self.outer_lr > 0, "groups.outer_lr", f"must be > 0, got {self.outer_lr}")
        check_key(
            0 <= self.outer_momentum < 1,
            "groups.outer_momentum",
            f"must be in [0, 1), got {self.outer_momentum}",
        )
        check_key(self.timeout_s > 0, "groups.timeout_s", f"must be > 0, got {self.timeout_s}")
        check_key(
            self.round_wait_s > 0, "groups.round_wait_s", f"must be > 0, got {self.round_wait_s}"
        )
        _check_schedule(self, "groups")
        check_key(
            self.checkpoint_every >= 1,
            "groups.checkpoint_every",
            f"must be >= 1, got {self.checkpoint_every}",
        )

    @property
    def enabled(self) -> bool:
        return self.count > 1


@dataclass(frozen=True)
class WandbConfig:
    """Weights & Biases (loggers: [wandb]; pip install "tianjax[wandb]")."""

    project: str = "tianjax"  # the W&B project runs go to
    entity: str | None = None  # your user or team (null: your default entity)
    tags: tuple[str, ...] = ()  # tags on the run
    mode: Literal["online", "offline", "disabled"] | None = None  # null: $WANDB_MODE, else online
    name: str | None = None  # the run's name (null: the run directory's name)
    group: str | None = None  # runs to show together (e.g. the seeds of one sweep)


__all__ = ["BalanceConfig", "CheckpointConfig", "RuntimeConfig", "StalenessConfig", "WandbConfig"]
