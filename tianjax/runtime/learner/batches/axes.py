"""How the learner's batches are shaped: the B axis of each field, and actor batches
joined along it into one batch. The choice of what to learn from next is the batch
strategies' (the onpolicy and replay modules beside this one).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from tianjax.core.types import Sequences

# Trajectory fields that are [B, ...] rather than [T, B, ...]
_PER_ENV = ("last_obs", "trunc_obs", "trunc_t")


def batch_axis(field: str, kind: type | None = None) -> int:
    """The B axis of a field of a batch of type `kind`: [T, B, ...] leaves, except the
    per-env ones [B, ...]; Sequences are batch-major [B, T, ...] (carry [B, ...]) throughout."""
    if kind is Sequences:
        return 0
    return 0 if field in _PER_ENV else 1


def concat_batches(batches: list):
    """Joins actor batches along B (device-resident leaves on the device: the join is
    queued behind the running update, and the host does not wait for it)."""
    first = batches[0]  # a field may be a tree itself (multi-agent observations)
    if len(batches) == 1:
        return first

    def join(*xs, a):
        return (
            jnp.concatenate(xs, axis=a)
            if isinstance(xs[0], jax.Array)
            else np.concatenate(xs, axis=a)
        )

    return type(first)(
        *[
            jax.tree.map(
                lambda *xs, a=batch_axis(name): join(*xs, a=a), *[getattr(b, name) for b in batches]
            )
            for name in first._fields
        ]
    )


__all__ = ["batch_axis", "concat_batches"]
