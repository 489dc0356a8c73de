"""The algorithm registry: algorithms by name, built-in and user-registered.

    make_algorithm(config, obs_shape, action_spec) -> Algorithm

builds the algorithm named by `config.algo` from its AlgorithmSpec (tianjax.algos.spec).
The built-in specs are read from their packages (tianjax/algos/<name>/spec.py; their
losses are imported on first use); a user's own algorithm is added with

    tianjax.algos.register(AlgorithmSpec("a2c", make_a2c, config=A2CConfig))

(or, for one without a section of its own, `register("a2c", make_a2c)`), where
`make_a2c(config, obs_shape, action_spec, *, correct_staleness=True) -> Algorithm`
follows the protocol of tianjax.core.algorithm. The registry is installed into
tianjax.config when this package is imported: every Config asks it which sections exist,
and runs `check_config`: `algo` must be registered (register before building the config),
a multi-agent algorithm needs a multi-agent env and only it, then the algorithm's own
check of its section against the run. Actor processes build the algorithm too: register at
the top level of a module they import (the script that trains, or a module named in the
config key `imports`).
"""

from __future__ import annotations

import dataclasses
import importlib

from tianjax.algos.spec import AlgorithmSpec, Make
from tianjax.config import Config, ConfigError, check_key, install_registry
from tianjax.core.algorithm import Algorithm
from tianjax.core.buffer_kind import buffer_kind
from tianjax.core.types import ActionSpec
from tianjax.networks import resolve_network

# the built-in algorithms: each a package under tianjax/algos with its spec in spec.py
BUILTIN = ("ppo", "impala", "dqn", "ippo", "qmix", "maddpg")
DEFAULT = BUILTIN[0]  # the algorithm of a config that names none

_SPECS: dict[str, AlgorithmSpec] = {}


def _load_builtin() -> None:
    for name in BUILTIN:
        _SPECS[name] = importlib.import_module(f"tianjax.algos.{name}.spec").SPEC


def register(
    spec: AlgorithmSpec | str, make: Make | None = None, *, check=None, **fields
) -> AlgorithmSpec:
    """Adds an algorithm: `register(AlgorithmSpec(...))`, or `register(name, make,
    check=..., config=..., buffer=..., ...)` with the spec's fields as keywords.
    Registering the same spec again (a re-run notebook cell, a script also imported by its
    module name) replaces it; another algorithm under a taken name, or a built-in name, is
    refused, and so is a section key another algorithm holds with another class."""
    if not isinstance(spec, AlgorithmSpec):
        if not isinstance(spec, str) or not spec.isidentifier():
            raise ValueError(f"algorithm name must be an identifier, got {spec!r}")
        if not callable(make):
            raise TypeError(
                f"register({spec!r}, ...): the factory must be callable, got {type(make).__name__}"
            )
        spec = AlgorithmSpec(spec, make, check=check, **fields)
    elif make is not None or check is not None or fields:
        raise TypeError("register(spec): the spec holds make, check and the rest")
    name = spec.name
    if name in BUILTIN:
        raise ValueError(f"'{name}' is a built-in algorithm; register yours under another name")
    old = _SPECS.get(name)
    if old is not None and not _same_function(old.make, spec.make):
        raise ValueError(f"algorithm '{name}' is already registered ({old.qualified()})")
    if spec.section is not None:
        for other in _SPECS.values():
            if (
                other.name != name
                and other.section == spec.section
                and other.config is not spec.config
                and other.config.__qualname__ != spec.config.__qualname__
            ):
                raise ValueError(
                    f"algorithm '{name}': section '{spec.section}' is algorithm "
                    f"'{other.name}''s, with another class"
                )
    _SPECS[name] = spec
    return spec


def unregister(name: str) -> None:
    """Removes a user algorithm (tests, notebooks)."""
    if name in BUILTIN:
        raise ValueError(f"'{name}' is a built-in algorithm")
    _SPECS.pop(name, None)


def registered() -> tuple[str, ...]:
    """Every algorithm name `config.algo` may take, built-in first."""
    return tuple(_SPECS)


def spec(name: str) -> AlgorithmSpec:
    """The spec registered under `name` (ConfigError naming `algo` when there is none)."""
    found = _SPECS.get(name)
    if found is None:
        raise ConfigError(
            f"config key 'algo': unknown algorithm {name!r} (registered: {', '.join(registered())}; "
            "add yours with tianjax.algos.register before building the config)"
        )
    return found


def _same_function(a, b) -> bool:
    """Same name in the same module, or in the same file (a script, or a file named in the
    config's `imports`, is also imported under another module name)."""
    if isinstance(a, str) or isinstance(b, str):
        return _qualified(a) == _qualified(b)
    if getattr(a, "__qualname__", None) != getattr(b, "__qualname__", None):
        return False
    ma, mb = getattr(a, "__module__", None), getattr(b, "__module__", None)
    fa, fb = (getattr(getattr(f, "__code__", None), "co_filename", None) for f in (a, b))
    return ma == mb or "__main__" in (ma, mb) or (fa is not None and fa == fb)


def _qualified(make) -> str:
    if isinstance(make, str):
        return make
    return f"{getattr(make, '__module__', '?')}:{getattr(make, '__qualname__', repr(make))}"


def factory(name: str) -> Make:
    return spec(name).resolve("make")


def check_config(config: Config) -> None:
    """What a Config cannot check alone, run by every Config it builds: `algo` is
    registered, a multi-agent algorithm has a multi-agent env and only it, and the
    algorithm's own check of its section against the run."""
    check_key(
        config.algo in _SPECS,
        "algo",
        f"unknown algorithm {config.algo!r} (registered: {', '.join(registered())}; "
        "add yours with tianjax.algos.register before building the config)",
    )
    s = _SPECS[config.algo]
    if s.multi_agent:
        check_key(
            config.env_backend == "jaxmarl",
            "env_backend",
            f"algo '{config.algo}' is multi-agent and needs env_backend: jaxmarl, got '{config.env_backend}'",
        )
    elif config.env_backend == "jaxmarl":
        multi = ", ".join(n for n, x in _SPECS.items() if x.multi_agent)
        check_key(
            False,
            "algo",
            f"'{config.algo}' is single-agent; env_backend: jaxmarl needs a multi-agent "
            f"algo ({multi})",
        )
    check = s.resolve("check")
    if check is not None:
        check(config)


class _Registry:
    """What tianjax.config asks (tianjax.config.AlgorithmRegistry)."""

    default = DEFAULT

    @staticmethod
    def spec(name: str) -> AlgorithmSpec:
        return spec(name)

    @staticmethod
    def sections() -> dict[str, type]:
        return {s.section: s.config for s in _SPECS.values() if s.section is not None}

    @staticmethod
    def builtin_sections() -> dict[str, type]:
        return {
            s.section: s.config for n, s in _SPECS.items() if n in BUILTIN and s.section is not None
        }

    @staticmethod
    def renamed_keys() -> dict[str, str]:
        return {old: new for s in _SPECS.values() for old, new in s.renamed_keys.items()}

    @staticmethod
    def check(config: Config) -> None:
        check_config(config)


def make_algorithm(
    config: Config,
    obs_shape,
    action_spec: ActionSpec,
    *,
    correct_staleness: bool = True,
    obs_dtype=None,
) -> Algorithm:
    """With `obs_dtype` (the env's observation dtype), `network.torso: auto` is resolved
    from the shape and dtype (tianjax.networks) before the algorithm is built. The
    algorithm's `buffer` comes back as its spec's kind (a kind's name is accepted)."""
    s = spec(config.algo)
    make = s.resolve("make")
    network = resolve_network(config.network, obs_shape, obs_dtype)
    if network is not config.network:
        config = dataclasses.replace(config, network=network)
    algo = make(config, tuple(obs_shape), action_spec, correct_staleness=correct_staleness)
    if not isinstance(algo, Algorithm):
        raise TypeError(
            f"algorithm '{config.algo}' ({s.qualified()}) returned {type(algo).__name__}, not a "
            "tianjax.algos.Algorithm"
        )
    kind = buffer_kind(algo.buffer)
    if kind != s.buffer:
        raise TypeError(
            f"algorithm '{config.algo}' ({s.qualified()}) learns from '{kind.name}' batches but its "
            f"spec declares '{s.buffer.name}': register it with AlgorithmSpec(..., buffer=...)"
        )
    return algo._replace(buffer=kind)


_load_builtin()
install_registry(_Registry())

__all__ = [
    "BUILTIN",
    "DEFAULT",
    "check_config",
    "factory",
    "make_algorithm",
    "register",
    "registered",
    "spec",
    "unregister",
]
