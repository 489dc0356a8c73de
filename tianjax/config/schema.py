"""`Config`, the whole run configuration: its top-level keys, and the checks that span
sections (an algorithm against its env, a batch against its minibatches, a mode against
its backend)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from tianjax.config.algos import (DQNConfig, IMPALAConfig, MADDPGConfig, MultiAgentConfig, NetworkConfig, PPOConfig, QMIXConfig)
from tianjax.config.checks import _check, _to_plain
from tianjax.config.runtime import BalanceConfig, CheckpointConfig, RuntimeConfig, StalenessConfig

# algorithms over a multi-agent env (env_backend: jaxmarl); all others are single-agent
MULTI_AGENT_ALGOS = ("ippo", "qmix", "maddpg")
# built-in algorithms that learn from replay (their settings: Config.replay_config)
REPLAY_ALGOS = ("dqn", "qmix", "maddpg")




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
    # backend and the env's constructor arguments (tianjax/envs/brax_env.py); checked against
    # the env's signature where it has one (a misspelt option is an error naming it).
    # tianjax/LatencyCartPole-v1, tianjax/LatencyLunarLander-v2 (gymnasium): step_ms, sigma,
    # hiccup_p, hiccup_ms, slow_actors, slow_factor (tianjax/envs/latency.py)
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
