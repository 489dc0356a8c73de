"""Typed, frozen run configuration: YAML loading, dotted overrides, validation.

A config is a tree of frozen dataclasses. `load_config` reads a YAML file (or takes a
dict), applies `key.sub=value` overrides, and builds the tree; every unknown key, wrong
type or impossible value raises `ConfigError` with a message that names the key. Jitted
code closes over these objects, never over dicts.

The package, by part: `checks` (ConfigError, check_key), `sections` (the sections every
algorithm may read, the replay settings, and the registry hook through which the
algorithms' own sections arrive), `runtime` (staleness, runtime, balance, checkpoint,
groups), `eval_section` (eval), `device_lists` (runtime's device lists, parsed), `schema`
(`Config` and the checks across sections; an algorithm's are the registry's, tianjax.algos),
`loading` (YAML, overrides, coercion, imports). Import from here.
"""

from __future__ import annotations

from tianjax.config.checks import ConfigError, check_key, is_reference
from tianjax.config.device_lists import DeviceList, parse_devices
from tianjax.config.eval_section import EvalConfig
from tianjax.config.loading import (
    apply_overrides,
    import_modules,
    load_config,
    parse_override,
    read_yaml,
)
from tianjax.config.runtime import (
    BalanceConfig,
    CheckpointConfig,
    GroupsConfig,
    RuntimeConfig,
    StalenessConfig,
    WandbConfig,
)
from tianjax.config.schema import Config
from tianjax.config.sections import (
    AlgorithmRegistry,
    MultiAgentConfig,
    NetworkConfig,
    ReplaySection,
    Sections,
    install_registry,
)

__all__ = [
    "AlgorithmRegistry",  # what a Config asks of the algorithm registry (install_registry)
    "BalanceConfig",
    "CheckpointConfig",
    "Config",
    "ConfigError",
    "DeviceList",  # a platform and device ids ("gpu:0,1"), parse_devices' result
    "EvalConfig",
    "GroupsConfig",
    "MultiAgentConfig",
    "NetworkConfig",
    "ReplaySection",  # the base of an off-policy algorithm's section
    "RuntimeConfig",
    "Sections",  # the algorithms' own sections of one Config, by key
    "StalenessConfig",
    "WandbConfig",
    "apply_overrides",
    "check_key",
    "import_modules",
    "install_registry",
    "is_reference",  # whether a value names user code, "module:Attr"
    "load_config",
    "parse_devices",
    "parse_override",
    "read_yaml",
]
