"""The sections every algorithm may read (network, marl), what a replay section holds, and
where the algorithms' own sections come from.

An algorithm's own section (its hyperparameters: `ppo`, `dqn`, yours) is not written here:
each algorithm package declares its section's class in its AlgorithmSpec (tianjax.algos),
and the algorithm registry, installed here when it is imported (`install_registry`), tells
a Config which sections exist and which one its algorithm reads. A user's registered
algorithm gets its own section this way, loaded, overridden and checked like a built-in
one. The config package imports nothing from the algorithms.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Iterator, Literal, Protocol

from tianjax.config.checks import ConfigError, _is_reference, check_key


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
        check_key(
            len(self.hidden) > 0 and all(h > 0 for h in self.hidden),
            "network.hidden",
            f"needs one or more positive widths, got {self.hidden}",
        )
        check_key(
            self.module is None or _is_reference(self.module),
            "network.module",
            f"must be 'module:Attr', got {self.module!r}",
        )


class ReplaySection:
    """The base of an off-policy algorithm's section: its replay settings (buffer_size,
    batch_size, learning_starts, updates_per_rollout), which the runtime's replay reads
    (`Config.replay_config`). What one item is (a transition, a [rollout_len] sequence) is
    the algorithm's buffer kind's."""

    def _check_replay_settings(self, key: str) -> None:
        check_key(
            self.buffer_size >= 1, f"{key}.buffer_size", f"must be >= 1, got {self.buffer_size}"
        )
        check_key(
            1 <= self.batch_size <= self.buffer_size,
            f"{key}.batch_size",
            f"must be in [1, {key}.buffer_size={self.buffer_size}], got {self.batch_size}",
        )
        check_key(self.learning_starts >= 0, f"{key}.learning_starts", "must be >= 0")
        check_key(self.updates_per_rollout >= 1, f"{key}.updates_per_rollout", "must be >= 1")


@dataclass(frozen=True)
class MultiAgentConfig:
    """Multi-agent algorithms on env_backend: jaxmarl: how every agent's input is built."""

    agent_id: bool = True  # append a one-hot agent id to each agent's input (parameter sharing)
    centralised_value: bool = False  # actor-critics: the critic sees the global state (MAPPO)


# ----------------------------------------------------------------------------- the registry
class AlgorithmRegistry(Protocol):
    """What a Config asks of the algorithm registry (tianjax.algos installs its own)."""

    default: str  # the algorithm of a config that names none

    def spec(self, name: str) -> Any: ...  # the AlgorithmSpec registered under `name` (KeyError)

    def sections(self) -> dict[str, type]: ...  # every registered algorithm's section key -> class

    def builtin_sections(self) -> dict[str, type]: ...  # ... of the built-in algorithms only

    def renamed_keys(
        self,
    ) -> dict[str, str]: ...  # old dotted key -> its new name, every algorithm's

    def check(self, config) -> None: ...  # the algorithm's checks of its section against the run


_registry: AlgorithmRegistry | None = None


def install_registry(registry: AlgorithmRegistry) -> None:
    """Sets the algorithm registry every Config asks; tianjax.algos calls this when it is
    imported (and `import tianjax` imports it)."""
    global _registry
    _registry = registry


def registry() -> AlgorithmRegistry:
    if _registry is None:
        raise RuntimeError(
            "no algorithm registry is installed: import tianjax (which imports tianjax.algos) "
            "before building a Config"
        )
    return _registry


class Sections(Mapping):
    """The algorithms' own sections of one Config: section key -> its frozen section object,
    one for every registered algorithm's section (defaults where the config sets none).
    Immutable and hashable, as the Config holding it."""

    def __init__(self, items: Mapping[str, Any] | None = None):
        self._items = dict(items or {})

    @classmethod
    def complete(cls, base: Mapping[str, Any] | None, given: Mapping[str, Any]) -> "Sections":
        """Every registered section: `given`, else `base`'s, else the section's defaults."""
        types = registry().sections()
        out = {}
        for key, section_type in types.items():
            value = given[key] if key in given else (base or {}).get(key)
            if value is None:
                value = section_type()
            elif not isinstance(value, section_type):
                raise ConfigError(
                    f"config key '{key}': must be a {section_type.__name__}, got "
                    f"{type(value).__name__}"
                )
            out[key] = value
        return cls(out)

    def __getitem__(self, key: str):
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(tuple(sorted(self._items.items(), key=lambda kv: kv[0])))

    def __repr__(self) -> str:
        return f"Sections({', '.join(self._items)})"


__all__ = [
    "AlgorithmRegistry",
    "MultiAgentConfig",
    "NetworkConfig",
    "ReplaySection",
    "Sections",
    "install_registry",
    "registry",
]
