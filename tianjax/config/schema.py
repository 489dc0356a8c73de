"""`Config`, the whole run configuration: its top-level keys, and the checks that span
sections (a mode against its backend, a budget against a batch).

Config knows no algorithm. Which algorithms exist, which section each reads and how that
section fits the run (minibatches that divide the batch, a replay buffer that holds a
rollout) are the algorithm registry's (tianjax.algos): the registry installs itself here
when it is imported (tianjax.config.sections.install_registry), and `import tianjax`
imports it. The algorithms' own sections (`ppo`, `dqn`, a user's) are held in
`algo_sections`, one for every registered algorithm, and read as attributes
(`config.ppo.lr`); YAML, overrides and `dataclasses.replace(config, ppo=...)` name them
like any other section."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from tianjax.config.checks import _is_reference, _to_plain, check_key
from tianjax.config.eval_section import EvalConfig
from tianjax.config.runtime import (
    BalanceConfig,
    CheckpointConfig,
    GroupsConfig,
    RuntimeConfig,
    StalenessConfig,
    WandbConfig,
)
from tianjax.config.sections import (
    MultiAgentConfig,
    NetworkConfig,
    ReplaySection,
    Sections,
    registry,
)

# loggers named without a module (metrics.jsonl is always written)
BUILTIN_LOGGERS = ("tensorboard", "wandb", "console")
RECORDS_PER_RUN = 200  # log_every: null aims at about this many metrics records


def _default_algo() -> str:
    return registry().default


EnvBackend = Literal["gymnax", "envpool", "gymnasium", "jaxmarl", "brax"]


@dataclass(frozen=True)
class Config:
    # a registered algorithm: the built-in ones (`tianjax configs` shows them in use) or yours
    # (tianjax.algos.register)
    algo: str = field(default_factory=_default_algo)
    env: str = "CartPole-v1"  # env id (gymnax name, envpool task id, gymnasium id, brax name
    # or JaxMARL id), or "module:EnvId" (gymnasium and brax: import module, which registers
    # EnvId; gymnax: module.EnvId is a gymnax-API env class, instance or factory)
    env_backend: EnvBackend = "gymnax"  # where the env comes from (gymnax: JAX, also fused)
    # host envs: keyword arguments for envpool.make / gymnasium.make_vec (e.g. Atari's
    # episodic_life, reward_clip, stack_num; max_episode_steps); brax: episode_length,
    # backend and the env's constructor arguments (tianjax.envs.brax_env); checked against
    # the env's signature where it has one (a misspelt option is an error naming it).
    # tianjax/LatencyCartPole-v1, tianjax/LatencyLunarLander-v2 (gymnasium): step_ms, sigma,
    # hiccup_p, hiccup_ms, slow_actors, slow_factor (tianjax.envs.latency)
    env_options: dict[str, Any] = field(default_factory=dict)
    mode: Literal["fused", "sync", "async"] = "fused"
    seed: int = 0
    num_seeds: int = 1  # fused mode: independent seeds trained side by side (vmapped)
    total_env_steps: int = 500_000
    target_return: float | None = 475.0  # moving average (100 episodes) to call converged
    target_win_rate: float | None = None  # envs that report wins (SMAX): the win rate of the
    # last 100 episodes to call converged, in place of target_return (null: use target_return)
    stop_at_target: bool = False  # true: end the run (checkpoint and summary as at the
    # budget's end) once it has converged, instead of spending the rest of total_env_steps
    # (single-process runs)
    run_dir: str | None = None  # default: runs/<algo>_<env>_<timestamp>
    num_actors: int = 1  # actor processes (sync/async); 0 = act inside the learner process (sync)
    num_envs: int = 4  # environments per actor
    rollout_len: int = 128  # T of each [T, B] trajectory
    # Updates between metrics records (null: about 200 records a run, whatever the budget;
    # see Config.log_interval)
    log_every: int | None = None
    # JAX's persistent compilation cache, a directory (e.g. ~/.cache/tianjax/xla; null: off,
    # unless $TIANJAX_COMPILE_CACHE names one). Setting it changes process-wide JAX settings:
    # every later jit of the process, yours included, is cached there. true: ~/.cache/tianjax/xla.
    # `tianjax train`, `tianjax sweep` and actor processes use that when neither names one;
    # false (or the variable set to "off") turns it off there too
    compile_cache: str | bool | None = None
    # Where records go besides metrics.jsonl (always written): tensorboard, wandb, console,
    # or your own "module:Class" (tianjax/metrics/loggers.py)
    loggers: tuple[str, ...] = ("tensorboard",)
    resume: str | None = None  # a run directory to continue from its latest checkpoint
    # Python modules ("my_pkg.envs") or .py files every process (actors included) imports
    # before it builds the config: they may register envs and algorithms
    imports: tuple[str, ...] = ()
    network: NetworkConfig = field(default_factory=NetworkConfig)
    marl: MultiAgentConfig = field(default_factory=MultiAgentConfig)
    staleness: StalenessConfig = field(default_factory=StalenessConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    balance: BalanceConfig = field(default_factory=BalanceConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)  # evaluation during training
    groups: GroupsConfig = field(default_factory=GroupsConfig)  # learner groups and their averager
    wandb: WandbConfig = field(default_factory=WandbConfig)  # used with loggers: [wandb]
    # the algorithms' own sections, key -> section (one per registered algorithm's section;
    # read as config.<key>; in YAML and overrides a top-level section like the others)
    algo_sections: Sections = field(default_factory=dict, repr=False)

    def __getattr__(self, name: str):
        # only for names that are not fields: an algorithm's section
        if name.startswith("__") or name == "algo_sections":
            raise AttributeError(name)
        sections = self.algo_sections
        if name in sections:
            return sections[name]
        raise AttributeError(
            f"'Config' has no key {name!r} (algorithm sections: {', '.join(sections) or 'none'})"
        )

    def __post_init__(self):
        check_key(
            self.total_env_steps > 0, "total_env_steps", f"must be > 0, got {self.total_env_steps}"
        )
        check_key(
            self.total_env_steps < 2**31,
            "total_env_steps",
            f"must be below 2**31 (the step counters are 32-bit), got {self.total_env_steps}",
        )
        check_key(self.num_seeds >= 1, "num_seeds", f"must be >= 1, got {self.num_seeds}")
        check_key(self.num_actors >= 0, "num_actors", f"must be >= 0, got {self.num_actors}")
        check_key(
            self.num_actors >= 1 or self.mode != "async",
            "num_actors",
            "mode async needs actor processes (num_actors >= 1)",
        )
        check_key(self.num_envs >= 1, "num_envs", f"must be >= 1, got {self.num_envs}")
        check_key(self.rollout_len >= 1, "rollout_len", f"must be >= 1, got {self.rollout_len}")
        check_key(
            self.log_every is None or self.log_every >= 1,
            "log_every",
            f"must be >= 1 or null, got {self.log_every}",
        )
        for name in self.loggers:
            check_key(
                name in BUILTIN_LOGGERS or _is_reference(name),
                "loggers",
                f"{name!r} is neither a built-in logger ({', '.join(BUILTIN_LOGGERS)}) nor 'module:Class'",
            )
        check_key(
            self.target_win_rate is None or 0 <= self.target_win_rate <= 1,
            "target_win_rate",
            f"must be in [0, 1] or null, got {self.target_win_rate}",
        )
        check_key(
            not self.stop_at_target
            or self.target_return is not None
            or self.target_win_rate is not None,
            "stop_at_target",
            "needs a target: target_return or target_win_rate is null",
        )
        check_key(bool(self.env), "env", "must be a non-empty env id")
        registry().check(self)
        check_key(
            self.steps_per_update <= self.total_env_steps,
            "total_env_steps",
            f"is smaller than one update's worth of steps ({self.steps_per_update})",
        )
        if self.num_actors == 0 and self.mode != "fused":
            check_key(
                self.env_backend not in ("gymnax", "jaxmarl", "brax"),
                "num_actors",
                "0 (acting inside the learner) is for host envs; JAX envs use mode: fused",
            )
        check_key(
            not self.env_options or self.env_backend in ("envpool", "gymnasium", "brax"),
            "env_options",
            "is for host envs (env_backend: envpool or gymnasium) and brax; a gymnax env takes "
            "its options in its own code (env: module:Attr)",
        )
        if self.mode == "fused":
            check_key(
                self.env_backend in ("gymnax", "jaxmarl", "brax"),
                "mode",
                f"'fused' needs a JAX env (env_backend: gymnax, brax or jaxmarl), got env_backend "
                f"'{self.env_backend}'; use mode: sync for host envs",
            )
        if self.staleness.forced_lag > 0:
            check_key(
                self.mode == "fused" or (self.mode == "async" and self.num_actors >= 1),
                "staleness.forced_lag",
                "is for mode fused (a ring of past versions in the loop) and mode async with "
                f"actors (each keeps a ring of the versions it received), got mode '{self.mode}'"
                + (" without actors" if self.mode == "async" else ""),
            )
            k, eta = self.staleness.forced_lag, self.staleness.max_staleness
            check_key(
                eta is None or eta >= k,
                "staleness.max_staleness",
                f"must be >= staleness.forced_lag ({k}) or null: every sample is at least {k} "
                "updates old and would be dropped, and the learner would wait forever (set "
                "staleness.max_staleness=null)",
            )
        if self.runtime.param_refresh == "step":
            check_key(
                self._actors_step_in_python,
                "runtime.param_refresh",
                "'step' is for async actors on host envs (a Python loop over vector steps); "
                f"got mode '{self.mode}', {self.num_actors} actors, env_backend "
                f"'{self.env_backend}' (a JAX env's rollout is one lax.scan: use rollout)",
            )
        if self.runtime.deterministic:
            self._check_deterministic()
        if self.num_seeds > 1:
            check_key(
                self.mode == "fused", "num_seeds", "several seeds side by side need mode: fused"
            )
        if self.groups.enabled:
            check_key(
                self.mode in ("sync", "async") and self.num_actors >= 1,
                "groups.count",
                "learner groups need actor processes (mode sync or async, num_actors >= 1)",
            )

    def _check_deterministic(self) -> None:
        """runtime.deterministic is refused, in one line naming why, wherever its guarantee
        (parameters that depend on the config alone) cannot hold."""
        rt, k = self.runtime, self.runtime.deterministic_lag
        key = "runtime.deterministic"
        check_key(
            self.mode == "async" and self.num_actors >= 1,
            key,
            f"is a variant of mode async with actor processes, got mode '{self.mode}' and "
            f"{self.num_actors} actors",
        )
        check_key(
            self.env_backend in ("gymnax", "brax"),
            key,
            f"needs a JAX env (gymnax or brax), whose rollout is a function of the shard's seed "
            f"and the parameters; env_backend '{self.env_backend}' steps outside JAX",
        )
        check_key(
            not registry().spec(self.algo).buffer.replayed,
            key,
            f"is for on-policy algorithms; '{self.algo}' paces its replayed gradient steps by "
            "arrival times",
        )
        check_key(
            not self.groups.enabled, key, "cannot hold with learner groups (groups.count > 1)"
        )
        check_key(
            self.staleness.forced_lag == 0,
            "staleness.forced_lag",
            "must be 0 with runtime.deterministic (runtime.deterministic_lag sets the lag)",
        )
        check_key(
            self.staleness.max_staleness is None or self.staleness.max_staleness >= k,
            "staleness.max_staleness",
            f"must be >= runtime.deterministic_lag ({k}) or null: every sample is {k} updates "
            "old and would be dropped",
        )
        shards = self.batch_trajectories
        check_key(
            self.num_actors <= shards,
            "num_actors",
            f"must be at most runtime.batch_trajectories ({shards}, the env shards) with "
            "runtime.deterministic: an actor process hosts whole shards",
        )
        check_key(
            rt.max_pool >= (k + 1) * shards,
            "runtime.max_pool",
            f"must hold {k + 1} rounds of {shards} shards ({(k + 1) * shards}) with "
            f"runtime.deterministic, got {rt.max_pool}",
        )
        check_key(
            not self.eval.periodic,
            "eval",
            "an evaluator process during the run is refused with runtime.deterministic (it "
            "would read the lag ring); evaluate at the end (eval.episodes alone)",
        )

    @property
    def in_process(self) -> bool:
        """Whether the run is one process (fused, or host envs with num_actors 0): no actor
        processes, no ingress, every sample fresh."""
        return self.mode == "fused" or self.num_actors == 0

    @property
    def refresh_per_step(self) -> bool:
        """Whether actors take a newer version between two vector steps of a rollout
        (runtime.param_refresh; null: async actors on host envs do)."""
        refresh = self.runtime.param_refresh
        if refresh is None:
            return self._actors_step_in_python
        return refresh == "step"

    @property
    def _actors_step_in_python(self) -> bool:
        """Async actor processes whose rollout is a Python loop over vector steps (host
        envs), where a newer version can be taken between two steps."""
        return (
            self.mode == "async"
            and self.num_actors >= 1
            and self.env_backend in ("envpool", "gymnasium")
        )

    @property
    def batch_trajectories(self) -> int:
        """Actor trajectories ([T, num_envs] each) that make one learner batch."""
        if self.in_process:
            return 1
        return self.runtime.batch_trajectories or self.num_actors

    @property
    def max_connections_per_host(self) -> int:
        """runtime.max_connections_per_host, or (null) room for every actor of a learner
        process on one host (each holds one connection per socket) and 8 more for
        restarted actors whose old connection is not closed yet; 0: no limit."""
        limit = self.runtime.max_connections_per_host
        return self.num_actors + 8 if limit is None else limit

    @property
    def balance_adaptive(self) -> bool:
        """Whether the balance controller moves its actions (balance.mode; null: async)."""
        mode = self.balance.mode or ("adaptive" if self.mode == "async" else "fixed")
        return mode == "adaptive" and self.mode == "async"

    @property
    def steps_per_update(self) -> int:
        return self.batch_trajectories * self.num_envs * self.rollout_len

    @property
    def spec(self):
        """The AlgorithmSpec of `algo` (tianjax.algos): its section, buffer kind, checks."""
        return registry().spec(self.algo)

    @property
    def replay_config(self) -> ReplaySection | None:
        """The section with the replay settings (buffer_size, batch_size, learning_starts,
        updates_per_rollout): an off-policy algorithm's own section (None on-policy)."""
        section = self.algo_config
        return section if isinstance(section, ReplaySection) else None

    @property
    def replay_ratio(self) -> float:
        """Off-policy runs with actors: samples learned per sample produced (balance.target_replay_ratio,
        runtime.replay_ratio, or as in fused mode: updates_per_rollout x batch_size items of
        the replay section per rollout of num_envs x rollout_len env steps; a qmix item is a
        sequence of rollout_len samples)."""
        rc = self.replay_config
        item = self.spec.buffer.item_steps(self.rollout_len)
        return (
            self.balance.target_replay_ratio
            or self.runtime.replay_ratio
            or (rc.updates_per_rollout * rc.batch_size * item / (self.num_envs * self.rollout_len))
        )

    @property
    def algo_config(self):
        """The algorithm's own section, the one its spec names (None: it reads none)."""
        key = self.spec.section
        return None if key is None else self.algo_sections[key]

    @property
    def log_interval(self) -> int:
        """Updates between metrics records: log_every, or (null) the budget's updates / 200,
        moved to a divisor of the fused loop's iterations where one is near (so that the
        last record covers as many updates as the others)."""
        if self.log_every is not None:
            return self.log_every
        n = self.planned_updates
        target = max(1, round(n / RECORDS_PER_RUN))
        near = [d for d in range(max(1, int(target * 0.75)), int(target * 1.5) + 1) if n % d == 0]
        return min(near, key=lambda d: abs(d - target)) if near else target

    @property
    def planned_updates(self) -> int:
        """What log_every counts over the whole budget: rollout iterations in one process
        (fused, num_actors 0), learner versions with actors (on-policy: one per batch;
        replay: replay_ratio x env steps / samples per gradient step)."""
        if self.in_process:
            return max(1, self.total_env_steps // (self.num_envs * self.rollout_len))
        if self.spec.buffer.replayed:
            rc = self.replay_config
            item = self.spec.buffer.item_steps(self.rollout_len)
            return max(1, int(self.total_env_steps * self.replay_ratio / (rc.batch_size * item)))
        return max(1, self.total_env_steps // self.steps_per_update)

    def sections_read(self) -> tuple[str, ...]:
        """The sections this run reads: the network, its algorithm's own, marl with a
        multi-agent env, staleness, checkpoint and eval; runtime and balance outside fused mode;
        wandb with that logger."""
        own = self.spec.section
        out = ["network", *([own] if own else [])]
        if self.env_backend == "jaxmarl":
            out.append("marl")
        out.append("staleness")
        if self.mode != "fused":
            out += ["runtime", "balance"]
        out += ["checkpoint", "eval"]
        if self.groups.enabled:
            out.append("groups")
        if "wandb" in self.loggers:
            out.append("wandb")
        return tuple(out)

    def to_dict(self, *, read_only: bool = False) -> dict:
        """The config as plain data; `read_only`: without the sections this run does not read
        (what a run's config.yaml holds: loading it back gives the same run)."""
        fields = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name != "algo_sections"
        }
        data = {}
        for key, value in fields.items():  # the algorithms' sections follow the network's
            data[key] = _to_plain(
                dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
            )
            if key == "network":
                # every built-in algorithm's section (any process has them), and the run's
                # own: another user algorithm registered in this process is not the run's,
                # and a process that reads this config back (an actor) may not know it
                travels = set(registry().builtin_sections()) | {self.spec.section}
                for name, section in self.algo_sections.items():
                    if name in travels:
                        data[name] = _to_plain(dataclasses.asdict(section))
        if read_only:
            keep = set(self.sections_read())
            data = {
                k: v
                for k, v in data.items()
                if not isinstance(v, dict) or k in keep or k == "env_options"
            }
        return data


_dataclass_init = Config.__init__


def _init(self, *args, algo_sections=None, **kwargs):
    """Config(...) and dataclasses.replace(config, ...) take an algorithm's section by its
    key (`ppo=PPOConfig(...)`), like the other sections."""
    known = registry().sections()
    given = {k: kwargs.pop(k) for k in list(kwargs) if k in known}
    _dataclass_init(self, *args, algo_sections=Sections.complete(algo_sections, given), **kwargs)


_init.__signature__ = None  # (inspect reads the dataclass's own)
Config.__init__ = _init

__all__ = ["BUILTIN_LOGGERS", "Config", "RECORDS_PER_RUN"]
