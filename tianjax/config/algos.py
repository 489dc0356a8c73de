"""The algorithm sections of a config: network, ppo, impala, dqn, qmix, maddpg, marl.

Each algorithm section names the built-in algorithms it configures (`algos`), so that
`Config.algo_config` finds it without a table of names; the replay sections also say what
one replayed item is (`items`). Checks of a section against the rest of the run are the
algorithm's own (its module's `check_config`, run through tianjax.algos)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from tianjax.config.checks import _check, _is_reference


@dataclass(frozen=True)
class NetworkConfig:
    # auto: mlp for vectors, minatar_cnn for small maps (MinAtar's 10x10xC), nature_cnn for
    # uint8 frames of 36x36 or more (Atari's 84x84), impala_cnn for other images that large;
    # see tianjax.networks
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
    algos: ClassVar[tuple[str, ...]] = ("ppo", "ippo")  # IPPO takes PPO's hyperparameters
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
    # min(1, pi_0/mu) of that step's action (no effect where mu = pi_0). Off by default, so
    # GAE is not off-policy corrected: a stale trajectory's advantage values mu's later
    # actions, a bias that grows with staleness (see tianjax/algos/ppo.py)
    truncated_traces: bool = False
    # corrected batches: a sample whose pi_0 has already moved past the clip range from mu
    # in the direction of its advantage gets weight 0 (the textbook clip at the first step)
    behaviour_clip: bool = False
    # lr is the rate of a dense layer this many inputs wide; a wider one's Adam step is
    # scaled by lr_base_width / fan_in (tianjax.core.update.scale_by_fan_in); null: lr everywhere
    lr_base_width: int | None = None

    def __post_init__(self):
        _check(self.lr > 0, "ppo.lr", f"must be > 0, got {self.lr}")
        _check(self.lr_base_width is None or (isinstance(self.lr_base_width, int) and not isinstance(self.lr_base_width, bool)
                                              and self.lr_base_width >= 1),
               "ppo.lr_base_width", f"must be null or an int >= 1, got {self.lr_base_width!r}")
        _check(self.num_epochs >= 1, "ppo.num_epochs", f"must be >= 1, got {self.num_epochs}")
        _check(self.num_minibatches >= 1, "ppo.num_minibatches",
               f"must be >= 1, got {self.num_minibatches}")
        _check(0 < self.gamma <= 1, "ppo.gamma", f"must be in (0, 1], got {self.gamma}")
        _check(0 <= self.gae_lambda <= 1, "ppo.gae_lambda", f"must be in [0, 1], got {self.gae_lambda}")
        _check(self.clip_eps > 0, "ppo.clip_eps", f"must be > 0, got {self.clip_eps}")
        _check(self.max_grad_norm > 0, "ppo.max_grad_norm", f"must be > 0, got {self.max_grad_norm}")


@dataclass(frozen=True)
class IMPALAConfig:
    algos: ClassVar[tuple[str, ...]] = ("impala",)
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


class ReplaySection:
    """A section with replay settings (buffer_size, batch_size, learning_starts,
    updates_per_rollout). `items`: what the buffer holds, transitions or [rollout_len]
    sequences."""

    algos: ClassVar[tuple[str, ...]] = ()
    items: ClassVar[Literal["transitions", "sequences"]] = "transitions"

    def _check_replay_settings(self, key: str) -> None:
        _check(self.buffer_size >= 1, f"{key}.buffer_size", f"must be >= 1, got {self.buffer_size}")
        _check(1 <= self.batch_size <= self.buffer_size, f"{key}.batch_size",
               f"must be in [1, {key}.buffer_size={self.buffer_size}], got {self.batch_size}")
        _check(self.learning_starts >= 0, f"{key}.learning_starts", "must be >= 0")
        _check(self.updates_per_rollout >= 1, f"{key}.updates_per_rollout", "must be >= 1")


@dataclass(frozen=True)
class DQNConfig(ReplaySection):
    algos: ClassVar[tuple[str, ...]] = ("dqn",)
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
    # of obs and next_obs (tianjax.core.replay.frames; mode fused); a transition cut by a time
    # limit inside a rollout then has weight 0 (its final observation is not kept)
    frame_once: bool = False

    def __post_init__(self):
        _check(self.lr > 0, "dqn.lr", f"must be > 0, got {self.lr}")
        self._check_replay_settings("dqn")
        _check(self.target_update_every >= 1, "dqn.target_update_every", "must be >= 1")
        _check(0 < self.target_tau <= 1, "dqn.target_tau", f"must be in (0, 1], got {self.target_tau}")
        _check(0 <= self.eps_end <= self.eps_start <= 1, "dqn.eps_end",
               "needs 0 <= dqn.eps_end <= dqn.eps_start <= 1")
        _check(0 < self.eps_fraction <= 1, "dqn.eps_fraction", "must be in (0, 1]")


@dataclass(frozen=True)
class QMIXConfig(ReplaySection):
    """QMIX: recurrent agents, a monotonic mixer, replay of [rollout_len] sequences."""

    algos: ClassVar[tuple[str, ...]] = ("qmix",)
    items: ClassVar[Literal["transitions", "sequences"]] = "sequences"

    lr: float = 5e-4
    gamma: float = 0.99
    td_lambda: float = 0.0  # lambda of the targets' TD(lambda) within a sequence (0: one-step)
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
        _check(0 <= self.td_lambda <= 1, "qmix.td_lambda", f"must be in [0, 1], got {self.td_lambda}")
        self._check_replay_settings("qmix")
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
class MADDPGConfig(ReplaySection):
    """MADDPG: deterministic per-agent actors, centralised critics, replay of transitions."""

    algos: ClassVar[tuple[str, ...]] = ("maddpg",)

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
        self._check_replay_settings("maddpg")
        _check(self.max_grad_norm > 0, "maddpg.max_grad_norm", "must be > 0")


@dataclass(frozen=True)
class MultiAgentConfig:
    """Multi-agent algorithms (ippo, ...) on env_backend: jaxmarl. IPPO takes its PPO
    hyperparameters from the `ppo` section."""

    agent_id: bool = True  # append a one-hot agent id to each agent's input (parameter sharing)
    centralised_value: bool = False  # ippo: the critic sees the global state (MAPPO)
