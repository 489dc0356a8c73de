"""Env shards: the deterministic-lag mode's unit of acting (runtime.deterministic).

A run's envs are `batch_trajectories` shards of `num_envs` envs each, whatever the number of
actor processes: shard s is seeded from the run's seed and s alone, and actor process p of P
hosts the shards s with s mod P = p, stepping each with the same compiled rollout (the same
shapes per call). So an actor process with two shards makes exactly the arrays that two
processes with one shard each make, and the learner, which orders by (round, shard), learns
the same batches.

Every trajectory of a shard carries its round r and shard s in its message's JSON body
(`tag`); the learner reads them back with `order_of`, which refuses anything malformed.
Rollout r acts with version max(0, r - k): tianjax.core.lag's rule, read from the ring of
the last k + 1 versions that every parameter message carries in this mode.
"""

from __future__ import annotations

# the seed stride between actors' (and shards') env streams
SEED_STRIDE = 7919


def shard_seed(seed: int, shard: int) -> int:
    """The env and acting seed of shard `shard` (an actor's own seed where actor id = shard,
    so a run with one shard per actor process seeds as every async run does)."""
    return seed + SEED_STRIDE * (shard + 1)


def shards_of(actor_id: int, num_actors: int, shards: int) -> list[int]:
    """The shards actor process `actor_id` of `num_actors` hosts, ascending."""
    return [s for s in range(shards) if s % max(num_actors, 1) == actor_id]


def tag(round_: int, shard: int) -> dict:
    """The JSON body that says which rollout of which shard a trajectory is."""
    return {"round": int(round_), "shard": int(shard)}


def order_of(body, shards: int) -> tuple[int, int] | None:
    """(round, shard) from a trajectory's body, or None where it is missing or malformed."""
    if not isinstance(body, dict):
        return None
    r, s = body.get("round"), body.get("shard")
    for v in (r, s):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            return None
    return (r, s) if s < shards else None


__all__ = ["SEED_STRIDE", "order_of", "shard_seed", "shards_of", "tag"]
