"""Deprecated name of `tianjax.core.returns`, kept for one release."""

import importlib
import warnings


def __getattr__(name):
    warnings.warn("tianjax.returns is now tianjax.core.returns; import from there (the old name goes in the "
                  "next release)", DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module("tianjax.core.returns"), name)
