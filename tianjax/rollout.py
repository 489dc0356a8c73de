"""Deprecated name of `tianjax.core.rollout`, kept for one release."""

import importlib
import warnings


def __getattr__(name):
    warnings.warn("tianjax.rollout is now tianjax.core.rollout; import from there (the old name goes in the "
                  "next release)", DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module("tianjax.core.rollout"), name)
