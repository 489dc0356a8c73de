"""`AlgorithmSpec`: everything the rest of tianjax knows about an algorithm, in one record.

Each algorithm package (tianjax/algos/<name>/) declares one spec in its `spec.py`, and the
registry (tianjax.algos.registry) holds them. Nothing outside tianjax/algos/ names an
algorithm: the config reads its section's class and key here, the checkpoint its shape
keys, `make_train` its sweepable hyperparameters, the dry run its description, and the
runtime its buffer kind. A user's algorithm is one spec too:

    tianjax.algos.register(AlgorithmSpec("a2c", make_a2c, config=A2CConfig))

and then has its own `a2c` section, loaded, overridden and checked like a built-in one.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import Any, Callable

from tianjax.config import Config, MultiAgentConfig, NetworkConfig, ReplaySection
from tianjax.core.algorithm import Algorithm
from tianjax.core.buffer_kind import ON_POLICY, BufferKind, buffer_kind

# make(config, obs_shape, action_spec, *, correct_staleness=True) -> Algorithm
Make = Callable[..., Algorithm]


@dataclass(frozen=True)
class AlgorithmSpec:
    name: str  # what `config.algo` says
    # make(config, obs_shape, action_spec, *, correct_staleness=True) -> Algorithm, or
    # "module:function" (imported on first use, so that the registry stays light)
    make: Make | str
    # its config section's class, a frozen dataclass (an off-policy algorithm's derives from
    # tianjax.config.ReplaySection); None: it has no hyperparameters of its own
    config: type | None = None
    # the section's key in a config (default: `name`); two algorithms may share one section
    # when they share its class (IPPO reads PPO's)
    section: str | None = None
    # check(config) of its section against the run, raising ConfigError naming the key
    check: Callable[[Any], None] | str | None = None
    buffer: BufferKind = ON_POLICY  # what it learns from (tianjax.core.buffer_kind)
    multi_agent: bool = False  # for multi-agent envs (env_backend: jaxmarl), and only those
    # dotted config keys of its section (or `marl.*`) that shape its parameters: a resume
    # with any of them changed is refused
    shape_keys: tuple[str, ...] = ()
    # ... that shape its replay buffer, where a checkpoint holds the buffer
    replay_shape_keys: tuple[str, ...] = ()
    # numeric hyperparameters of its section that it reads only in arithmetic (never for a
    # shape or a Python branch): `make_train`'s traced inputs, and `tianjax sweep`'s
    sweepable: tuple[str, ...] = ()
    # what its LearnerState.target_params holds (names of the networks with a target copy,
    # e.g. ("q",)); empty: it keeps none and target_params is None
    target_networks: tuple[str, ...] = ()
    # describe(config) -> lines for the dry run about how it splits a batch (minibatches)
    describe: Callable[[Any], list[str]] | str | None = None
    # keys of its section renamed since: old dotted key -> new one (the old is refused with
    # the new name in the message)
    renamed_keys: dict[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"algorithm name must be an identifier, got {self.name!r}")
        if not (callable(self.make) or _is_reference(self.make)):
            raise TypeError(
                f"algorithm {self.name!r}: make must be callable or 'module:function', "
                f"got {type(self.make).__name__}"
            )
        if self.check is not None and not (callable(self.check) or _is_reference(self.check)):
            raise TypeError(
                f"algorithm {self.name!r}: check must be callable, got {type(self.check).__name__}"
            )
        object.__setattr__(self, "buffer", buffer_kind(self.buffer))
        if self.config is not None:
            if not (isinstance(self.config, type) and dataclasses.is_dataclass(self.config)):
                raise TypeError(
                    f"algorithm {self.name!r}: config must be a dataclass (its section), got "
                    f"{self.config!r}"
                )
            if self.section is None:
                object.__setattr__(self, "section", self.name)
            if self.section in _reserved():
                raise ValueError(
                    f"algorithm {self.name!r}: section '{self.section}' is a key or attribute of "
                    "every config; name its section after the algorithm"
                )
        elif self.section is not None:
            raise ValueError(f"algorithm {self.name!r}: a section key needs its config class")
        if self.buffer.replayed and not (
            self.config is not None and issubclass(self.config, ReplaySection)
        ):
            raise TypeError(
                f"algorithm {self.name!r} learns from a replay buffer: its config class must derive "
                "from tianjax.config.ReplaySection (buffer_size, batch_size, learning_starts, "
                "updates_per_rollout)"
            )
        for key in (*self.shape_keys, *self.replay_shape_keys, *self.sweepable):
            head, _, field = key.partition(".")
            fields = (
                {f.name for f in dataclasses.fields(self._section_type(head))}
                if self._section_type(head)
                else ()
            )
            if field not in fields:
                raise ValueError(
                    f"algorithm {self.name!r}: {key!r} is not a key of its section or of marl"
                )

    def _section_type(self, head: str):
        if head == self.section:
            return self.config
        return {"marl": MultiAgentConfig, "network": NetworkConfig}.get(head)

    def resolve(self, what: str) -> Callable | None:
        """The spec's `make`, `check` or `describe` as a function (a reference imported)."""
        entry = getattr(self, what)
        if isinstance(entry, str):
            module, attr = entry.split(":")
            return getattr(importlib.import_module(module), attr)
        return entry

    def qualified(self, what: str = "make") -> str:
        entry = getattr(self, what)
        if isinstance(entry, str):
            return entry
        return f"{getattr(entry, '__module__', '?')}:{getattr(entry, '__qualname__', repr(entry))}"


def _reserved() -> set[str]:
    """The keys and attributes every config has: no algorithm's section may take them."""
    return {f.name for f in dataclasses.fields(Config)} | set(dir(Config))


def _is_reference(text) -> bool:
    if not isinstance(text, str):
        return False
    module, sep, attr = text.partition(":")
    return bool(sep and module and attr)


__all__ = ["AlgorithmSpec", "Make"]
