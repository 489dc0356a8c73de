"""The algorithms: one package each (tianjax/algos/<name>/: its config section, its loss and
acting, and its AlgorithmSpec), and the registry that holds them by name.

    tianjax.algos.register(AlgorithmSpec("a2c", make_a2c, config=A2CConfig))
    algo = tianjax.algos.make_algorithm(config, obs_shape, action_spec)

Adding an algorithm is one folder: see docs/guide.md ("Your own algorithm"). What one is
made of comes from here too: `Algorithm` and `ActOutput` (the bundle make returns, from the
core), the buffer kinds, and `actor_critic`, the stochastic policy PPO and IMPALA act with.
"""

from __future__ import annotations

from tianjax.algos.policy import ActorCriticPolicy, actor_critic
from tianjax.algos.registry import (
    BUILTIN,
    DEFAULT,
    check_config,
    factory,
    make_algorithm,
    register,
    registered,
    spec,
    unregister,
)
from tianjax.algos.spec import AlgorithmSpec
from tianjax.core.algorithm import ActOutput, Algorithm
from tianjax.core.buffer_kind import ON_POLICY, SEQUENCES, TRANSITIONS, BufferKind

ALGORITHMS = BUILTIN  # the built-in names (kept for callers that list them)
# the built-in algorithms over a multi-agent env (env_backend: jaxmarl)
MULTI_AGENT_ALGOS = tuple(n for n in BUILTIN if spec(n).multi_agent)

__all__ = [
    "ALGORITHMS",
    "ActOutput",
    "ActorCriticPolicy",
    "Algorithm",
    "AlgorithmSpec",
    "BUILTIN",
    "BufferKind",
    "DEFAULT",
    "MULTI_AGENT_ALGOS",
    "ON_POLICY",
    "SEQUENCES",
    "TRANSITIONS",
    "actor_critic",
    "check_config",  # what a Config cannot check alone; every Config runs it
    "factory",  # a registered algorithm's make, by name
    "make_algorithm",
    "register",
    "registered",
    "spec",  # a registered algorithm's AlgorithmSpec, by name
    "unregister",
]
