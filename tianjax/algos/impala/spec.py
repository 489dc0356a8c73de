"""The spec of IMPALA (V-trace): tianjax.algos.impala.loss."""

from __future__ import annotations

from tianjax.algos.impala.config import IMPALAConfig
from tianjax.algos.spec import AlgorithmSpec
from tianjax.core.buffer_kind import ON_POLICY


def describe(config) -> list[str]:
    """The dry run's line on how an update splits the batch."""
    section, n = config.impala, config.batch_trajectories
    return [
        f"  minibatches   {section.num_minibatches} of {n * config.num_envs // section.num_minibatches} "
        f"trajectories of {config.rollout_len} steps"
    ]


SPEC = AlgorithmSpec(
    "impala",
    "tianjax.algos.impala.loss:make",
    config=IMPALAConfig,
    check="tianjax.algos.impala.loss:check_config",
    buffer=ON_POLICY,
    sweepable=(
        "impala.lr",
        "impala.ent_coef",
        "impala.vf_coef",
        "impala.gamma",
        "impala.rho_bar",
        "impala.c_bar",
        "impala.pg_rho_bar",
        "impala.max_grad_norm",
    ),
    describe=describe,
)


__all__ = ["SPEC", "describe"]
