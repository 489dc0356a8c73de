"""Deprecated name of `tianjax.core.fused`, kept for one release."""

import importlib
import warnings


def __getattr__(name):
    warnings.warn("tianjax.fused is now tianjax.core.fused; import from there (the old name goes in the "
                  "next release)", DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module("tianjax.core.fused"), name)
