"""One converter from an env's action space to the `ActionSpec` a policy is built for.

gymnax, gymnasium, envpool and JaxMARL spaces all name their kinds Discrete and Box, so
the space is read by its kind's name: a Discrete space of actions 0..n-1, or a Box of
continuous actions with its bounds (broadcast to the action shape, so that a space with
scalar bounds clips every dimension alike)."""

from __future__ import annotations

import numpy as np

from tianjax.config import ConfigError
from tianjax.core.types import ActionSpec


def action_spec(space, env_id: str | None = None) -> ActionSpec:
    """The ActionSpec of one env's (or one agent's) action space; `env_id` names the env
    in the error for any other kind of space."""
    kind = type(space).__name__
    where = "" if env_id is None else f" (env '{env_id}')"
    if kind == "Discrete":
        start = int(getattr(space, "start", 0))
        if start != 0:
            raise ConfigError(
                f"config key 'env': a Discrete action space starting at {start} is not "
                f"supported{where}; only actions 0..n-1 are"
            )
        return ActionSpec(discrete=True, num_actions=int(space.n))
    if kind == "Box":
        shape = tuple(space.shape)
        return ActionSpec(
            discrete=False,
            shape=shape,
            low=np.broadcast_to(np.asarray(space.low, np.float32), shape),
            high=np.broadcast_to(np.asarray(space.high, np.float32), shape),
        )
    raise ConfigError(
        f"config key 'env': a {kind} action space is not supported{where}; only Discrete "
        "and Box actions are"
    )


__all__ = ["action_spec"]
