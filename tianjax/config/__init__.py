"""Typed, frozen run configuration: YAML loading, dotted overrides, validation.

A config is a tree of frozen dataclasses. `load_config` reads a YAML file (or takes a
dict), applies `key.sub=value` overrides, and builds the tree; every unknown key, wrong
type or impossible value raises `ConfigError` with a message that names the key. Jitted
code closes over these objects, never over dicts.

The package, by part: `checks` (ConfigError), `algos` (the algorithm sections),
`runtime` (staleness, runtime, balance, checkpoint), `schema` (`Config` and the checks
across sections; an algorithm's are the registry's, tianjax.algos), `loading` (YAML,
overrides, coercion, imports). Import from here.
"""

from __future__ import annotations

from tianjax.config.algos import (DQNConfig, IMPALAConfig, MADDPGConfig, MultiAgentConfig, NetworkConfig, PPOConfig, QMIXConfig)
from tianjax.config.checks import ConfigError
from tianjax.config.loading import apply_overrides, import_modules, load_config, parse_override, read_yaml
from tianjax.config.runtime import BalanceConfig, CheckpointConfig, RuntimeConfig, StalenessConfig, WandbConfig
from tianjax.config.schema import Config, install_algorithm_check

__all__ = ["BalanceConfig", "CheckpointConfig", "Config", "ConfigError", "DQNConfig", "IMPALAConfig",
           "MADDPGConfig", "MultiAgentConfig", "NetworkConfig", "PPOConfig", "QMIXConfig", "RuntimeConfig",
           "StalenessConfig", "WandbConfig", "apply_overrides", "import_modules", "install_algorithm_check", "load_config",
           "parse_override", "read_yaml"]
