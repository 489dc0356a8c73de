"""Checkpoints of the whole learner state (orbax): save, digest-checked restore with
fallback (`store`), and orbax's failures turned into one line (`failures`).

Import from here. Each name is imported on first use, so orbax loads only where a
checkpoint is read or written.
"""

_LAZY = {  # name -> the module that holds it
    "Checkpointer": "tianjax.checkpoint.store",  # a run's saves, every N updates and at the end
    "CheckpointError": "tianjax.checkpoint.store",  # a checkpoint that cannot be used, why
    "checkpoint_dir": "tianjax.checkpoint.store",
    "has_checkpoint": "tianjax.checkpoint.store",
    "read_meta": "tianjax.checkpoint.store",  # a checkpoint's meta, without its arrays
    "restore_latest": "tianjax.checkpoint.store",  # the newest readable one (digest-checked)
    "restore_step": "tianjax.checkpoint.store",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# with `store` itself, the namespace the runners read it through
__all__ = sorted(_LAZY) + ["store"]
