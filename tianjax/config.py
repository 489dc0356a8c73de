"""Typed, frozen run configuration: YAML loading, dotted overrides, validation.

A config is a tree of frozen dataclasses. `load_config` reads a YAML file (or takes a
dict), applies `key.sub=value` overrides, and builds the tree; every unknown key, wrong
type or impossible value raises `ConfigError` with a message that names the key. Jitted
code closes over these objects, never over dicts.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import os
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Sequence

import yaml


class ConfigError(ValueError):
    """A bad config: the message names the offending key."""


def _check(cond: bool, key: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"config key '{key}': {msg}")


@dataclass(frozen=True)
class NetworkConfig:
    # auto: mlp for vectors, minatar_cnn for small maps (MinAtar's 10x10xC), nature_cnn for
    # uint8 frames of 36x36 or more (Atari's 84x84), impala_cnn for other images that large;
    # see tianjax/networks.py
    torso: Literal["auto", "mlp", "minatar_cnn", "nature_cnn", "impala_cnn"] = "auto"
    hidden: tuple[int, ...] = (64, 64)  # widths of the MLP (after the convolutions of a CNN torso)
    activation: Literal["tanh", "relu"] = "tanh"  # of an mlp torso (CNN torsos use relu)
    # "module:Attr": your own flax module instead of the built-in actor-critic (ppo, impala
    # and your algorithms); Attr is a module instance or a factory(obs_shape, action_spec)
    module: str | None = None

    def __post_init__(self):
        _check(len(self.hidden) > 0 and all(h > 0 for h in self.hidden), "network.hidden",
               f"needs one or more positive widths, got {self.hidden}")
        _check(self.module is None or _is_reference(self.module), "network.module",
               f"must be 'module:Attr', got {self.module!r}")


@dataclass(frozen=True)
class PPOConfig:
    lr: float = 2.5e-4
    anneal_lr: bool = True  # linear decay to 0 over the run
    num_epochs: int = 4
    num_minibatches: int = 4
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_eps: float = 0.2
    clip_value: bool = True
    vf_coef: float = 0.5
    ent_coef: float = 0.01
    max_grad_norm: float = 0.5
    # corrected (async) batches: GAE's trace through each later step is cut by
    # min(1, pi_0/mu) of that step's action (no effect where mu = pi_0)
    truncated_traces: bool = False
    # corrected batches: a sample whose pi_0 has already moved past the clip range from mu
    # in the direction of its advantage gets weight 0 (the textbook clip at the first step)
    behaviour_clip: bool = False

    def __post_init__(self):
        _check(self.lr > 0, "ppo.lr", f"must be > 0, got {self.lr}")
        _check(self.num_epochs >= 1, "ppo.num_epochs", f"must be >= 1, got {self.num_epochs}")
        _check(self.num_minibatches >= 1, "ppo.num_minibatches",
               f"must be >= 1, got {self.num_minibatches}")
        _check(0 < self.gamma <= 1, "ppo.gamma", f"must be in (0, 1], got {self.gamma}")
        _check(0 <= self.gae_lambda <= 1, "ppo.gae_lambda", f"must be in [0, 1], got {self.gae_lambda}")
        _check(self.clip_eps > 0, "ppo.clip_eps", f"must be > 0, got {self.clip_eps}")
        _check(self.max_grad_norm > 0, "ppo.max_grad_norm", f"must be > 0, got {self.max_grad_norm}")


@dataclass(frozen=True)
class IMPALAConfig:
    lr: float = 6e-4
    anneal_lr: bool = True
    num_minibatches: int = 1  # split of the [T, B] batch along B per update
    gamma: float = 0.99
    rho_bar: float = 1.0  # V-trace truncation of the importance ratio in the targets
    c_bar: float = 1.0  # V-trace truncation of the trace coefficients
    pg_rho_bar: float = 1.0  # truncation of the ratio in the policy-gradient advantage
    vf_coef: float = 0.5
    ent_coef: float = 0.01
    max_grad_norm: float = 40.0

    def __post_init__(self):
        _check(self.lr > 0, "impala.lr", f"must be > 0, got {self.lr}")
        _check(self.num_minibatches >= 1, "impala.num_minibatches",
               f"must be >= 1, got {self.num_minibatches}")
        _check(0 < self.gamma <= 1, "impala.gamma", f"must be in (0, 1], got {self.gamma}")
        for k in ("rho_bar", "c_bar", "pg_rho_bar"):
            _check(getattr(self, k) > 0, f"impala.{k}", f"must be > 0, got {getattr(self, k)}")


@dataclass(frozen=True)
class DQNConfig:
    lr: float = 2.5e-4
    gamma: float = 0.99
    buffer_size: int = 50_000  # transitions kept in the replay buffer
    batch_size: int = 128
    learning_starts: int = 1_000  # env steps before the first update
    updates_per_rollout: int = 4  # gradient steps after each [T, B] rollout
    target_update_every: int = 50  # updates between target-network syncs
    target_tau: float = 1.0  # 1.0 = hard copy, < 1 = Polyak averaging
    double_q: bool = True
    huber_delta: float = 10.0  # 1.0 let Q diverge on CartPole (returns ~100 per episode)
    eps_start: float = 1.0
    eps_end: float = 0.05
    eps_fraction: float = 0.3  # fraction of total_env_steps over which epsilon decays
    max_grad_norm: float = 10.0
    # replay keeps each observation frame once ([T + 1, B] frames per [T, B] rollout) instead
    # of obs and next_obs (tianjax/frame_replay.py; mode fused); a transition cut by a time
    # limit inside a rollout then has weight 0 (its final observation is not kept)
    frame_once: bool = False

    def __post_init__(self):
        _check(self.lr > 0, "dqn.lr", f"must be > 0, got {self.lr}")
        _check(self.buffer_size >= 1, "dqn.buffer_size", f"must be >= 1, got {self.buffer_size}")
        _check(1 <= self.batch_size <= self.buffer_size, "dqn.batch_size",
               f"must be in [1, dqn.buffer_size={self.buffer_size}], got {self.batch_size}")
        _check(self.learning_starts >= 0, "dqn.learning_starts", "must be >= 0")
        _check(self.updates_per_rollout >= 1, "dqn.updates_per_rollout", "must be >= 1")
        _check(self.target_update_every >= 1, "dqn.target_update_every", "must be >= 1")
        _check(0 < self.target_tau <= 1, "dqn.target_tau", f"must be in (0, 1], got {self.target_tau}")
        _check(0 <= self.eps_end <= self.eps_start <= 1, "dqn.eps_end",
               "needs 0 <= dqn.eps_end <= dqn.eps_start <= 1")
        _check(0 < self.eps_fraction <= 1, "dqn.eps_fraction", "must be in (0, 1]")


@dataclass(frozen=True)
class QMIXConfig:
    """QMIX: recurrent agents, a monotonic mixer, replay of [rollout_len] sequences."""

    lr: float = 5e-4
    gamma: float = 0.99
    buffer_size: int = 5_000  # sequences (one per env per rollout) kept in the replay buffer
    batch_size: int = 32  # sequences per gradient step
    learning_starts: int = 10_000  # env steps before the first update
    updates_per_rollout: int = 1  # gradient steps after each [T, B] rollout
    burn_in: int = 0  # first steps of a sequence that only warm the hidden state (R2D2)
    target_update_every: int = 200  # updates between target-network syncs
    target_tau: float = 1.0  # 1.0 = hard copy, < 1 = Polyak averaging
    hidden_dim: int = 64  # GRU width of the agent network
    mixer_embed: int = 32  # mixing-network width
    hyper_hidden: int = 64  # hypernetwork hidden width
    eps_start: float = 1.0
    eps_end: float = 0.05
    eps_fraction: float = 0.1  # fraction of total_env_steps over which epsilon decays
    max_grad_norm: float = 10.0

    def __post_init__(self):
        _check(self.lr > 0, "qmix.lr", f"must be > 0, got {self.lr}")
        _check(0 < self.gamma <= 1, "qmix.gamma", f"must be in (0, 1], got {self.gamma}")
        _check(self.buffer_size >= 1, "qmix.buffer_size", f"must be >= 1, got {self.buffer_size}")
        _check(1 <= self.batch_size <= self.buffer_size, "qmix.batch_size",
               f"must be in [1, qmix.buffer_size={self.buffer_size}], got {self.batch_size}")
        _check(self.learning_starts >= 0, "qmix.learning_starts", "must be >= 0")
        _check(self.updates_per_rollout >= 1, "qmix.updates_per_rollout", "must be >= 1")
        _check(self.burn_in >= 0, "qmix.burn_in", "must be >= 0")
        _check(self.target_update_every >= 1, "qmix.target_update_every", "must be >= 1")
        _check(0 < self.target_tau <= 1, "qmix.target_tau", f"must be in (0, 1], got {self.target_tau}")
        for k in ("hidden_dim", "mixer_embed", "hyper_hidden"):
            _check(getattr(self, k) >= 1, f"qmix.{k}", "must be >= 1")
        _check(0 <= self.eps_end <= self.eps_start <= 1, "qmix.eps_end",
               "needs 0 <= qmix.eps_end <= qmix.eps_start <= 1")
        _check(0 < self.eps_fraction <= 1, "qmix.eps_fraction", "must be in (0, 1]")
        _check(self.max_grad_norm > 0, "qmix.max_grad_norm", "must be > 0")


@dataclass(frozen=True)
class MADDPGConfig:
    """MADDPG: deterministic per-agent actors, centralised critics, replay of transitions."""

    lr: float = 1e-3  # Adam, actors and critics
    gamma: float = 0.95
    tau: float = 0.01  # Polyak step of the target networks after every update
    noise_std: float = 0.1  # Gaussian exploration noise on the actions (action units)
    buffer_size: int = 100_000  # transitions kept in the replay buffer
    batch_size: int = 1024  # transitions per gradient step
    learning_starts: int = 10_000  # env steps before the first update
    updates_per_rollout: int = 4  # gradient steps after each [T, B] rollout
    max_grad_norm: float = 0.5

    def __post_init__(self):
        _check(self.lr > 0, "maddpg.lr", f"must be > 0, got {self.lr}")
        _check(0 < self.gamma <= 1, "maddpg.gamma", f"must be in (0, 1], got {self.gamma}")
        _check(0 < self.tau <= 1, "maddpg.tau", f"must be in (0, 1], got {self.tau}")
        _check(self.noise_std >= 0, "maddpg.noise_std", "must be >= 0")
        _check(self.buffer_size >= 1, "maddpg.buffer_size", f"must be >= 1, got {self.buffer_size}")
        _check(1 <= self.batch_size <= self.buffer_size, "maddpg.batch_size",
               f"must be in [1, maddpg.buffer_size={self.buffer_size}], got {self.batch_size}")
        _check(self.learning_starts >= 0, "maddpg.learning_starts", "must be >= 0")
        _check(self.updates_per_rollout >= 1, "maddpg.updates_per_rollout", "must be >= 1")
        _check(self.max_grad_norm > 0, "maddpg.max_grad_norm", "must be > 0")


@dataclass(frozen=True)
class MultiAgentConfig:
    """Multi-agent algorithms (ippo, ...) on env_backend: jaxmarl. IPPO takes its PPO
    hyperparameters from the `ppo` section."""

    agent_id: bool = True  # append a one-hot agent id to each agent's input (parameter sharing)
    centralised_value: bool = False  # ippo: the critic sees the global state (MAPPO)



# algorithms over a multi-agent env (env_backend: jaxmarl); all others are single-agent
MULTI_AGENT_ALGOS = ("ippo", "qmix", "maddpg")
# built-in algorithms that learn from replay (their settings: Config.replay_config)
REPLAY_ALGOS = ("dqn", "qmix", "maddpg")


@dataclass(frozen=True)
class StalenessConfig:
    # w(tau): constant (1), polynomial (1 + tau)^-power, exponential exp(-tau / kappa),
    # hinge (1 up to tau0, then (1 + tau - tau0)^-power), cutoff (1 up to max_staleness, then 0)
    correct: bool = True  # false: the plain losses, every sample weighted 1 (for comparisons)
    schedule: Literal["constant", "polynomial", "exponential", "hinge", "cutoff"] = "constant"
    power: float = 0.5
    kappa: float = 8.0
    tau0: int = 4
    max_staleness: int | None = None  # samples older than this are dropped (null: keep all)
    rho_bar: float = 1.0  # PPO: weight also by min(rho_bar, pi / mu) (IMPALA: V-trace clips)
    normalise: bool = True  # rescale weights to mean 1 over the kept samples of a batch

    def __post_init__(self):
        _check(self.power >= 0, "staleness.power", f"must be >= 0, got {self.power}")
        _check(self.kappa > 0, "staleness.kappa", f"must be > 0, got {self.kappa}")
        _check(self.tau0 >= 0, "staleness.tau0", f"must be >= 0, got {self.tau0}")
        _check(self.max_staleness is None or self.max_staleness >= 0, "staleness.max_staleness",
               f"must be >= 0 or null, got {self.max_staleness}")
        _check(self.schedule != "cutoff" or self.max_staleness is not None, "staleness.max_staleness",
               "must be set for schedule 'cutoff'")
        _check(self.rho_bar > 0, "staleness.rho_bar", f"must be > 0, got {self.rho_bar}")


@dataclass(frozen=True)
class RuntimeConfig:
    """The distributed runtime (modes sync and async): processes, sockets, balance."""

    batch_trajectories: int | None = None  # actor trajectories per update (null: num_actors)
    publish_every: int = 1  # updates between parameter broadcasts
    credits_per_actor: int = 2  # trajectories an actor may have in flight or pooled (flow control)
    max_pool: int = 64  # trajectories the learner holds; beyond it, it stops reading (HWM)
    max_reuse: int = 0  # on-policy: extra passes over a batch while no fresh data is waiting
    replay_ratio: float | None = None  # off-policy: samples learned per sample produced
    # (null: as in fused mode, dqn.updates_per_rollout * dqn.batch_size / (num_envs * rollout_len))
    send_hwm: int = 2  # trajectories an actor may have queued before its sends block
    recv_hwm: int = 4  # trajectories queued at the learner's socket
    transport: Literal["tcp", "ipc"] = "tcp"
    bind_host: str = "127.0.0.1"  # where the learner binds; loopback unless set
    security: Literal["mac", "curve"] | None = None  # who may connect: mac (a token derived
    # from the run key at the handshake, MACs on every message; cheap), curve (CurveZMQ: also
    # encrypts, and actors verify the learner's key; costs CPU per byte); null: curve unless
    # bind_host is loopback
    allow_hosts: tuple[str, ...] = ()  # IP addresses allowed to connect to the learner (empty: any
    # holding the run's credentials)
    io_threads: int | None = None  # ZeroMQ I/O threads of the learner (null: 2 with curve, else 1)
    heartbeat_s: float = 1.0  # actor -> learner heartbeat period
    heartbeat_timeout_s: float = 120.0  # silence after which a peer counts as lost (a learner
    # is silent during an update: raise this for updates that take minutes, e.g. CNNs on CPU)
    connect_timeout_s: float = 600.0  # how long an actor waits for a (starting) learner
    max_message_mb: float = 256.0  # larger messages are rejected unread
    actor_devices: str = "cpu"  # jax platform for actors (cpu, gpu, ...)
    learner_devices: int | None = None  # devices the learner's update spans (null: all local)
    actor_threads: int = 1  # XLA/Eigen threads per actor process (2-core machines)
    max_actor_restarts: int = 3  # a dead or silent actor is restarted up to this many times
    restart_learner: bool = False  # a dead learner is restarted from its last checkpoint
    max_learner_restarts: int = 2  # ... up to this many times

    def __post_init__(self):
        _check(self.batch_trajectories is None or self.batch_trajectories >= 1,
               "runtime.batch_trajectories", "must be >= 1 or null")
        _check(self.publish_every >= 1, "runtime.publish_every", "must be >= 1")
        _check(self.max_pool >= 1, "runtime.max_pool", "must be >= 1")
        _check(self.credits_per_actor >= 1, "runtime.credits_per_actor", "must be >= 1")
        _check(self.max_reuse >= 0, "runtime.max_reuse", "must be >= 0")
        _check(self.replay_ratio is None or self.replay_ratio > 0, "runtime.replay_ratio",
               "must be > 0 or null")
        _check(self.send_hwm >= 1, "runtime.send_hwm", "must be >= 1")
        _check(self.recv_hwm >= 1, "runtime.recv_hwm", "must be >= 1")
        _check(self.heartbeat_s > 0, "runtime.heartbeat_s", "must be > 0")
        _check(self.heartbeat_timeout_s > self.heartbeat_s, "runtime.heartbeat_timeout_s",
               "must be larger than runtime.heartbeat_s")
        _check(self.connect_timeout_s > 0, "runtime.connect_timeout_s", "must be > 0")
        _check(self.max_message_mb > 0, "runtime.max_message_mb", "must be > 0")
        for i, host in enumerate(self.allow_hosts):
            try:
                ipaddress.ip_address(host)
            except ValueError:
                _check(False, f"runtime.allow_hosts[{i}]", f"must be an IP address, got {host!r}")
        _check(self.io_threads is None or self.io_threads >= 1, "runtime.io_threads", "must be >= 1 or null")
        _check(self.learner_devices is None or self.learner_devices >= 1, "runtime.learner_devices",
               "must be >= 1 or null")
        _check(self.actor_threads >= 1, "runtime.actor_threads", "must be >= 1")
        _check(self.max_actor_restarts >= 0, "runtime.max_actor_restarts", "must be >= 0")
        _check(self.max_learner_restarts >= 0, "runtime.max_learner_restarts", "must be >= 0")


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
        _check(self.target_staleness >= 0, "balance.target_staleness",
               f"must be >= 0, got {self.target_staleness}")
        _check(self.target_replay_ratio is None or self.target_replay_ratio > 0,
               "balance.target_replay_ratio", f"must be > 0 or null, got {self.target_replay_ratio}")
        _check(self.period_s > 0, "balance.period_s", f"must be > 0, got {self.period_s}")
        _check(0 <= self.deadband < 1, "balance.deadband", f"must be in [0, 1), got {self.deadband}")


@dataclass(frozen=True)
class CheckpointConfig:
    """Orbax checkpoints of the whole learner state, under <run_dir>/checkpoints."""

    every: int = 0  # updates between checkpoints (0: only the final one)
    keep: int = 3  # checkpoints kept (the newest)
    final: bool = True  # write one at the end of the run (and on Ctrl-C / SIGTERM)
    replay: bool = False  # DQN: include the replay buffer (large; fused runs always do). Without
    # it a resumed run refills the buffer with `dqn.learning_starts` samples before learning

    def __post_init__(self):
        _check(self.every >= 0, "checkpoint.every", f"must be >= 0, got {self.every}")
        _check(self.keep >= 1, "checkpoint.keep", f"must be >= 1, got {self.keep}")


@dataclass(frozen=True)
class Config:
    algo: str = "ppo"  # a registered algorithm: ppo | impala | dqn | ippo | qmix | maddpg | yours
    # (tianjax.algos.register)
    env: str = "CartPole-v1"  # env id (gymnax name, envpool task id, gymnasium id, brax name
    # or JaxMARL id), or "module:EnvId" (gymnasium and brax: import module, which registers
    # EnvId; gymnax: module.EnvId is a gymnax-API env class, instance or factory)
    env_backend: Literal["gymnax", "envpool", "gymnasium", "jaxmarl", "brax"] = "gymnax"
    # host envs: keyword arguments for envpool.make / gymnasium.make_vec (e.g. Atari's
    # episodic_life, reward_clip, stack_num; max_episode_steps); brax: episode_length,
    # backend and the env's constructor arguments (tianjax/envs/brax_env.py)
    env_options: dict[str, Any] = field(default_factory=dict)
    mode: Literal["fused", "sync", "async"] = "fused"
    seed: int = 0
    num_seeds: int = 1  # fused mode: independent seeds trained side by side (vmapped)
    total_env_steps: int = 500_000
    target_return: float | None = 475.0  # moving average (100 episodes) to call converged
    target_win_rate: float | None = None  # envs that report wins (SMAX): the win rate of the
    # last 100 episodes to call converged, in place of target_return (null: use target_return)
    run_dir: str | None = None  # default: runs/<algo>_<env>_<timestamp>
    num_actors: int = 1  # actor processes (sync/async); 0 = act inside the learner process (sync)
    num_envs: int = 4  # environments per actor
    rollout_len: int = 128  # T of each [T, B] trajectory
    log_every: int = 20  # updates between log lines / progress refreshes
    eval_episodes: int = 0  # greedy episodes at the end (0 = none)
    compile_cache: str | None = "~/.cache/tianjax/xla"  # persistent XLA cache (null: off)
    resume: str | None = None  # a run directory to continue from its latest checkpoint
    # Python modules ("my_pkg.envs") or .py files every process (actors included) imports
    # before it builds the config: they may register envs and algorithms
    imports: tuple[str, ...] = ()
    network: NetworkConfig = field(default_factory=NetworkConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    impala: IMPALAConfig = field(default_factory=IMPALAConfig)
    dqn: DQNConfig = field(default_factory=DQNConfig)
    qmix: QMIXConfig = field(default_factory=QMIXConfig)
    maddpg: MADDPGConfig = field(default_factory=MADDPGConfig)
    marl: MultiAgentConfig = field(default_factory=MultiAgentConfig)
    staleness: StalenessConfig = field(default_factory=StalenessConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    balance: BalanceConfig = field(default_factory=BalanceConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)

    def __post_init__(self):
        _check(self.total_env_steps > 0, "total_env_steps", f"must be > 0, got {self.total_env_steps}")
        _check(self.total_env_steps < 2**31, "total_env_steps",
               f"must be below 2**31 (the step counters are 32-bit), got {self.total_env_steps}")
        _check(self.num_seeds >= 1, "num_seeds", f"must be >= 1, got {self.num_seeds}")
        _check(self.num_actors >= 0, "num_actors", f"must be >= 0, got {self.num_actors}")
        _check(self.num_actors >= 1 or self.mode != "async", "num_actors",
               "mode async needs actor processes (num_actors >= 1)")
        _check(self.num_envs >= 1, "num_envs", f"must be >= 1, got {self.num_envs}")
        _check(self.rollout_len >= 1, "rollout_len", f"must be >= 1, got {self.rollout_len}")
        _check(self.log_every >= 1, "log_every", f"must be >= 1, got {self.log_every}")
        _check(self.eval_episodes >= 0, "eval_episodes", "must be >= 0")
        _check(self.target_win_rate is None or 0 <= self.target_win_rate <= 1, "target_win_rate",
               f"must be in [0, 1] or null, got {self.target_win_rate}")
        _check(bool(self.env), "env", "must be a non-empty env id")
        from tianjax.algos import registered  # the registry imports this module

        _check(self.algo in registered(), "algo",
               f"unknown algorithm {self.algo!r} (registered: {', '.join(registered())}; "
               "add yours with tianjax.algos.register before building the config)")
        batch = self.batch_trajectories * self.num_envs * self.rollout_len
        _check(self.steps_per_update <= self.total_env_steps, "total_env_steps",
               f"is smaller than one update's worth of steps ({self.steps_per_update})")
        if self.algo in MULTI_AGENT_ALGOS:
            _check(self.env_backend == "jaxmarl", "env_backend",
                   f"algo '{self.algo}' is multi-agent and needs env_backend: jaxmarl, got "
                   f"'{self.env_backend}'")
        elif self.env_backend == "jaxmarl":
            _check(False, "algo", f"'{self.algo}' is single-agent; env_backend: jaxmarl needs a "
                   f"multi-agent algo ({', '.join(MULTI_AGENT_ALGOS)})")
        if self.algo in ("ppo", "ippo"):
            _check(batch % self.ppo.num_minibatches == 0, "ppo.num_minibatches",
                   f"must divide the batch (trajectories x num_envs x rollout_len) = {batch}, got "
                   f"{self.ppo.num_minibatches} (a minibatch cannot be larger than the batch "
                   "and all minibatches have one size)")
        if self.algo == "impala":
            width = self.batch_trajectories * self.num_envs
            _check(width % self.impala.num_minibatches == 0, "impala.num_minibatches",
                   f"must divide the batch width (trajectories x num_envs) = {width}, got "
                   f"{self.impala.num_minibatches}")
        if self.algo == "qmix":
            _check(self.qmix.burn_in < self.rollout_len, "qmix.burn_in",
                   f"must be below rollout_len ({self.rollout_len}), the replayed sequence length")
        if self.dqn.frame_once:
            _check(self.algo == "dqn", "dqn.frame_once",
                   f"is for algo dqn (its replay of transitions), got algo '{self.algo}'")
            _check(self.mode == "fused" or self.num_actors >= 1, "dqn.frame_once",
                   "is served by mode: fused and by actor processes (num_actors >= 1); the "
                   "in-process host loop (num_actors: 0) keeps obs and next_obs")
        if self.num_actors == 0 and self.mode != "fused":
            _check(self.env_backend not in ("gymnax", "jaxmarl", "brax"), "num_actors",
                   "0 (acting inside the learner) is for host envs; JAX envs use mode: fused")
        if self.algo in REPLAY_ALGOS:
            rc, key = self.replay_config, self.algo
            items = self.num_envs * (1 if self.algo == "qmix" else self.rollout_len)  # qmix: sequences
            _check(rc.buffer_size >= items, f"{key}.buffer_size",
                   f"must hold at least one rollout ({items} {'sequences' if self.algo == 'qmix' else 'transitions'}"
                   f"), got {rc.buffer_size}")
            if self.mode == "sync" and self.num_actors >= 1:
                # a sync actor waits for the version after the one it acted with: every round
                # of trajectories (one per actor) must owe the learner a gradient step
                per_round = self.num_actors * self.num_envs * self.rollout_len
                batch = rc.batch_size * (self.rollout_len if self.algo == "qmix" else 1)
                _check(self.replay_ratio * per_round >= batch, "runtime.replay_ratio",
                       f"mode sync: a round of trajectories ({per_round} env steps) must owe a gradient "
                       f"step of {batch} samples, got a replay ratio of {self.replay_ratio:g}")
                latest = int(per_round - batch / self.replay_ratio)
                _check(rc.learning_starts <= latest, f"{key}.learning_starts",
                       f"mode sync with actors: learning must start in the first round of trajectories "
                       f"(sync actors wait for the next version), so at most {latest}, got {rc.learning_starts}")
        _check(not self.env_options or self.env_backend in ("envpool", "gymnasium", "brax"),
               "env_options",
               "is for host envs (env_backend: envpool or gymnasium) and brax; a gymnax env takes "
               "its options in its own code (env: module:Attr)")
        if self.mode == "fused":
            _check(self.env_backend in ("gymnax", "jaxmarl", "brax"), "mode",
                   f"'fused' needs a JAX env (env_backend: gymnax, brax or jaxmarl), got env_backend "
                   f"'{self.env_backend}'; use mode: sync for host envs")
        if self.num_seeds > 1:
            _check(self.mode == "fused", "num_seeds", "several seeds side by side need mode: fused")

    @property
    def batch_trajectories(self) -> int:
        """Actor trajectories ([T, num_envs] each) that make one learner batch."""
        if self.mode == "fused" or self.num_actors == 0:
            return 1
        return self.runtime.batch_trajectories or self.num_actors

    @property
    def balance_adaptive(self) -> bool:
        """Whether the balance controller moves its actions (balance.mode; null: async)."""
        mode = self.balance.mode or ("adaptive" if self.mode == "async" else "fixed")
        return mode == "adaptive" and self.mode == "async"

    @property
    def steps_per_update(self) -> int:
        return self.batch_trajectories * self.num_envs * self.rollout_len

    @property
    def replay_config(self):
        """The section with the replay settings (buffer_size, batch_size, learning_starts,
        updates_per_rollout): qmix's for qmix (items are sequences), maddpg's, else dqn's."""
        return {"qmix": self.qmix, "maddpg": self.maddpg}.get(self.algo, self.dqn)

    @property
    def replay_ratio(self) -> float:
        """Off-policy runs with actors: samples learned per sample produced (balance.target_replay_ratio,
        runtime.replay_ratio, or as in fused mode: updates_per_rollout x batch_size items of
        the replay section per rollout of num_envs x rollout_len env steps; a qmix item is a
        sequence of rollout_len samples)."""
        rc = self.replay_config
        item = self.rollout_len if self.algo == "qmix" else 1
        return self.balance.target_replay_ratio or self.runtime.replay_ratio or (
            rc.updates_per_rollout * rc.batch_size * item / (self.num_envs * self.rollout_len))

    @property
    def algo_config(self):
        """The algorithm's own section (IPPO uses PPO's; None for a user algorithm, which has none)."""
        return getattr(self, "ppo" if self.algo == "ippo" else self.algo, None)

    def to_dict(self) -> dict:
        return _to_plain(dataclasses.asdict(self))


def _is_reference(text: str) -> bool:
    module, sep, attr = text.partition(":")
    return bool(sep and module and attr)


def import_modules(names: Sequence[str]) -> None:
    """Imports each module name, or runs each .py file as a module named after the file
    (its `if __name__ == "__main__":` block does not run); ConfigError naming `imports`."""
    import importlib
    import importlib.util
    import sys

    for name in names:
        try:
            if name.endswith(".py"):
                path = os.path.abspath(os.path.expanduser(name))
                mod_name = os.path.splitext(os.path.basename(path))[0]
                if mod_name in sys.modules and getattr(sys.modules[mod_name], "__file__", None) == path:
                    continue
                spec = importlib.util.spec_from_file_location(mod_name, path)
                if spec is None or not os.path.isfile(path):
                    raise FileNotFoundError(f"no file {path}")
                module = importlib.util.module_from_spec(spec)
                sys.modules[mod_name] = module
                try:
                    spec.loader.exec_module(module)
                except BaseException:
                    del sys.modules[mod_name]
                    raise
            else:
                importlib.import_module(name)
        except Exception as e:
            line = (str(e).strip().splitlines() or [""])[0]
            raise ConfigError(f"config key 'imports': cannot import {name!r} "
                              f"({type(e).__name__}: {line})") from None


def _to_plain(x):
    if isinstance(x, dict):
        return {k: _to_plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_to_plain(v) for v in x]
    return x


# ----------------------------------------------------------------------------- building


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Checks `value` against the annotation `tp`, converting where it is lossless."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        choices = typing.get_args(tp)
        _check(value in choices, key, f"must be one of {list(choices)}, got {value!r}")
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None:
            _check(type(None) in args, key, "must not be null")
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0])
    if origin is dict:
        _check(isinstance(value, Mapping), key, f"must be a mapping, got {value!r}")
        out = {}
        for k, v in value.items():
            _check(isinstance(k, str), key, f"keys must be strings, got {k!r}")
            scalar = (bool, int, float, str, type(None))
            is_list = isinstance(v, (list, tuple)) and all(isinstance(x, scalar) for x in v)
            _check(isinstance(v, scalar) or is_list, f"{key}.{k}",
                   f"must be a number, string, bool, null or a list of them, got {v!r}")
            out[k] = list(v) if isinstance(v, tuple) else v
        return out
    if origin is tuple:
        args = typing.get_args(tp)
        _check(isinstance(value, (list, tuple)), key, f"must be a list, got {value!r}")
        return tuple(_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value))
    if dataclasses.is_dataclass(tp):
        _check(isinstance(value, Mapping), key, f"must be a mapping of sub-keys, got {value!r}")
        return _build(tp, value, prefix=f"{key}.")
    if tp is bool:
        _check(isinstance(value, bool), key, f"must be true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)  # 5e5 in YAML
        if isinstance(value, str):
            try:
                f = float(value)
                value = int(f) if f.is_integer() else value
            except ValueError:
                pass
        _check(isinstance(value, int) and not isinstance(value, bool), key,
               f"must be an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads 1e-3 as a string
            try:
                value = float(value)
            except ValueError:
                pass
        _check(isinstance(value, (int, float)) and not isinstance(value, bool), key,
               f"must be a number, got {value!r}")
        _check(math.isfinite(value), key, f"must be finite, got {value!r}")
        return float(value)
    if tp is str:
        _check(isinstance(value, str), key, f"must be a string, got {value!r}")
        return value
    raise TypeError(f"unsupported annotation {tp} for {key}")


def _build(cls, data: Mapping, prefix: str = ""):
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for k in data:
        if k not in names:
            raise ConfigError(f"config key '{prefix}{k}': unknown key (known: {sorted(names)})")
    kwargs = {k: _coerce(v, hints[k], f"{prefix}{k}") for k, v in data.items()}
    return cls(**kwargs)


def parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise ConfigError(f"override '{text}': expected key=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override '{text}': empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def apply_overrides(data: dict, overrides: Sequence[str]) -> dict:
    """Returns a copy of `data` with each `a.b.c=value` applied (value parsed as YAML)."""
    data = _deep_copy(data)
    for text in overrides:
        path, value = parse_override(text)
        node = data
        for i, p in enumerate(path[:-1]):
            sub = node.setdefault(p, {})
            if not isinstance(sub, dict):
                raise ConfigError(f"config key '{'.'.join(path[:i + 1])}': is not a section")
            node = sub
        node[path[-1]] = value
    return data


def _deep_copy(d):
    return {k: _deep_copy(v) if isinstance(v, dict) else v for k, v in d.items()}


def read_yaml(path: str | os.PathLike) -> dict:
    if not os.path.exists(path):
        raise ConfigError(f"config file '{path}': not found")
    with open(path) as f:
        try:
            data = yaml.safe_load(f)
        except yaml.YAMLError as e:
            raise ConfigError(f"config file '{path}': not valid YAML ({e})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file '{path}': the top level must be a mapping of keys")
    return data


def load_config(source: str | os.PathLike | Mapping | Config | None = None,
                overrides: Sequence[str] = (), **kwargs) -> Config:
    """Builds a validated Config.

    Args:
      source: a YAML path, a (nested) dict, a Config, or None for the defaults.
      overrides: dotted `key=value` strings, e.g. ["ppo.lr=1e-3", "num_envs=8"].
      **kwargs: top-level keys, applied last (e.g. run_dir="runs/x").
    """
    if isinstance(source, Config):
        data = source.to_dict()
    elif isinstance(source, Mapping):
        data = _deep_copy(dict(source))
    elif source is None:
        data = {}
    else:
        data = read_yaml(source)
    data = apply_overrides(data, overrides)
    for k, v in kwargs.items():
        data[k] = v
    imports = data.get("imports") or ()
    if isinstance(imports, str):
        imports = data["imports"] = [imports]
    if isinstance(imports, (list, tuple)) and all(isinstance(m, str) for m in imports):
        import_modules(imports)  # first: they may register the algorithm the config names
    return _build(Config, data)
