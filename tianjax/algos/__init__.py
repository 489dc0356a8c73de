"""Algorithm registry: algorithms by name, built-in and user-registered.

    make_algorithm(config, obs_shape, action_spec) -> Algorithm

builds the algorithm named by `config.algo`. The built-in ones are imported on first use;
a user's own algorithm is added with

    tianjax.algos.register("a2c", make_a2c)

where `make_a2c(config, obs_shape, action_spec, *, correct_staleness=True) -> Algorithm`
follows the protocol of `tianjax.algos.base`. Every Config runs this registry's
`check_config` (installed into tianjax.config when this package is imported): `algo` must
be registered, so register before building the config; then the algorithm checks its own
section against the run, with its module's `check_config(config)` (yours: `register(...,
check=...)`). Actor processes build the algorithm too: register at the top level of a
module they import (the script that trains, or a module named in the config key
`imports`).
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Callable

from tianjax.algos.base import ActOutput, Algorithm
from tianjax.config import Config, ConfigError, install_algorithm_check
from tianjax.config.checks import _check
from tianjax.core.types import ActionSpec
from tianjax.networks import resolve_network

# name -> "module:function" (built in, imported on first use) or the factory itself
_REGISTRY: dict[str, str | Callable[..., Algorithm]] = {
    "ppo": "tianjax.algos.ppo:make",
    "impala": "tianjax.algos.impala:make",
    "dqn": "tianjax.algos.dqn:make",
    "ippo": "tianjax.algos.ippo:make",
    "qmix": "tianjax.algos.qmix:make",
    "maddpg": "tianjax.algos.maddpg:make",
}
# name -> its check of its own section against the run, check_config(config) (raises ConfigError)
_CHECKS: dict[str, str | Callable[[Config], None]] = {
    "ppo": "tianjax.algos.ppo:check_config",
    "impala": "tianjax.algos.impala:check_config",
    "dqn": "tianjax.algos.dqn:check_config",
    "ippo": "tianjax.algos.ppo:check_config",  # IPPO's section is PPO's
    "qmix": "tianjax.algos.qmix:check_config",
    "maddpg": "tianjax.algos.maddpg:check_config",
}
BUILTIN = tuple(_REGISTRY)
ALGORITHMS = BUILTIN  # the built-in names (kept for callers that list them)
# the built-in algorithms over a multi-agent env (env_backend: jaxmarl); all others are single-agent
MULTI_AGENT_ALGOS = ("ippo", "qmix", "maddpg")


def register(name: str, make: Callable[..., Algorithm], *, check: Callable[[Config], None] | None = None) -> None:
    """Adds an algorithm under `name`, with `check(config)` of its settings against the run
    if given (raise ConfigError naming the key). Registering the same function again (a
    re-run notebook cell, a script also imported by its module name) replaces it; another
    function under a taken name, or a built-in name, is refused."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"algorithm name must be an identifier, got {name!r}")
    if not callable(make):
        raise TypeError(f"register({name!r}, ...): the factory must be callable, got {type(make).__name__}")
    old = _REGISTRY.get(name)
    if name in BUILTIN:
        raise ValueError(f"'{name}' is a built-in algorithm; register yours under another name")
    if old is not None and not _same_function(old, make):
        raise ValueError(f"algorithm '{name}' is already registered ({_qualified(old)})")
    if check is not None and not callable(check):
        raise TypeError(f"register({name!r}, ...): check must be callable, got {type(check).__name__}")
    _REGISTRY[name] = make
    _CHECKS.pop(name, None)
    if check is not None:
        _CHECKS[name] = check


def unregister(name: str) -> None:
    """Removes a user algorithm (tests, notebooks)."""
    if name in BUILTIN:
        raise ValueError(f"'{name}' is a built-in algorithm")
    _REGISTRY.pop(name, None)
    _CHECKS.pop(name, None)


def registered() -> tuple[str, ...]:
    """Every algorithm name `config.algo` may take, built-in first."""
    return tuple(_REGISTRY)


def _same_function(a, b) -> bool:
    """Same module and name; a script counts as the same module imported by its own name."""
    if isinstance(a, str) or isinstance(b, str):
        return _qualified(a) == _qualified(b)
    ma, mb = getattr(a, "__module__", None), getattr(b, "__module__", None)
    return (getattr(a, "__qualname__", None) == getattr(b, "__qualname__", None)
            and (ma == mb or "__main__" in (ma, mb)))


def _qualified(make) -> str:
    if isinstance(make, str):
        return make
    return f"{getattr(make, '__module__', '?')}:{getattr(make, '__qualname__', repr(make))}"


def _resolve(entry: str | Callable) -> Callable:
    if isinstance(entry, str):
        module, attr = entry.split(":")
        return getattr(importlib.import_module(module), attr)
    return entry


def factory(name: str) -> Callable[..., Algorithm]:
    make = _REGISTRY.get(name)
    if make is None:
        raise ConfigError(f"config key 'algo': unknown algorithm {name!r} (registered: "
                          f"{', '.join(registered())}; add yours with tianjax.algos.register)")
    return _resolve(make)


def check_config(config: Config) -> None:
    """What a Config cannot check alone, run by every Config it builds: `algo` is
    registered, a multi-agent algorithm has a multi-agent env and only it, `dqn.frame_once`
    is dqn's, and the algorithm's own check of its section against the run."""
    _check(config.algo in registered(), "algo",
           f"unknown algorithm {config.algo!r} (registered: {', '.join(registered())}; "
           "add yours with tianjax.algos.register before building the config)")
    if config.algo in MULTI_AGENT_ALGOS:
        _check(config.env_backend == "jaxmarl", "env_backend",
               f"algo '{config.algo}' is multi-agent and needs env_backend: jaxmarl, got "
               f"'{config.env_backend}'")
    elif config.env_backend == "jaxmarl":
        _check(False, "algo", f"'{config.algo}' is single-agent; env_backend: jaxmarl needs a "
               f"multi-agent algo ({', '.join(MULTI_AGENT_ALGOS)})")
    if config.dqn.frame_once:
        _check(config.algo == "dqn", "dqn.frame_once",
               f"is for algo dqn (its replay of transitions), got algo '{config.algo}'")
    check = _CHECKS.get(config.algo)
    if check is not None:
        _resolve(check)(config)


install_algorithm_check(check_config)


def make_algorithm(config: Config, obs_shape, action_spec: ActionSpec, *,
                   correct_staleness: bool = True, obs_dtype=None) -> Algorithm:
    """With `obs_dtype` (the env's observation dtype), `network.torso: auto` is resolved
    from the shape and dtype (tianjax.networks) before the algorithm is built."""
    make = factory(config.algo)
    network = resolve_network(config.network, obs_shape, obs_dtype)
    if network is not config.network:
        config = dataclasses.replace(config, network=network)
    algo = make(config, tuple(obs_shape), action_spec, correct_staleness=correct_staleness)
    if not isinstance(algo, Algorithm):
        raise TypeError(f"algorithm '{config.algo}' ({_qualified(make)}) returned "
                        f"{type(algo).__name__}, not a tianjax.algos.Algorithm")
    return algo


__all__ = ["ALGORITHMS", "ActOutput", "Algorithm", "BUILTIN", "MULTI_AGENT_ALGOS", "check_config", "factory",
           "make_algorithm", "register", "registered", "unregister"]
