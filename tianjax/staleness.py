"""Deprecated name of `tianjax.core.staleness`, kept for one release."""

import importlib
import warnings


def __getattr__(name):
    warnings.warn("tianjax.staleness is now tianjax.core.staleness; import from there (the old name goes in the "
                  "next release)", DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module("tianjax.core.staleness"), name)
