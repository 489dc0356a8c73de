"""Deprecated name of `tianjax.core.replay.ring`, kept for one release."""

import importlib
import warnings


def __getattr__(name):
    warnings.warn("tianjax.buffers is now tianjax.core.replay.ring; import from there (the old name goes in the "
                  "next release)", DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module("tianjax.core.replay.ring"), name)
