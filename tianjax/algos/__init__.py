"""Algorithm registry: `make_algorithm(config, obs_shape, action_spec)` -> Algorithm."""

from __future__ import annotations

import importlib

from tianjax.algos.base import ActOutput, Algorithm
from tianjax.config import Config
from tianjax.networks import ActionSpec

ALGORITHMS = ("ppo", "impala", "dqn", "ippo", "qmix", "maddpg")


def make_algorithm(config: Config, obs_shape, action_spec: ActionSpec, *,
                   correct_staleness: bool = True) -> Algorithm:
    if config.algo not in ALGORITHMS:
        raise ValueError(f"config key 'algo': unknown algorithm {config.algo!r} (known: {ALGORITHMS})")
    module = importlib.import_module(f"tianjax.algos.{config.algo}")
    return module.make(config, tuple(obs_shape), action_spec, correct_staleness=correct_staleness)


__all__ = ["ALGORITHMS", "ActOutput", "Algorithm", "make_algorithm"]
