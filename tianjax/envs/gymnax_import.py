"""gymnax, imported without loading seaborn or matplotlib.pyplot until something reads
from them.

gymnax's Pong module imports seaborn at its top for a palette its renderer draws with, and
seaborn brings scipy.stats and pandas; several of its envs import matplotlib.pyplot at their
tops for their renderers. `make_gymnax("CartPole-v1")` in a fresh process took 2.58 s
with both loaded and takes 1.15 s without (2 cores), in every process that makes a gymnax
env: every fused run, and every learner and actor on a gymnax config. Rendering a gymnax env
(evaluation videos) loads them as before.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types


class _Deferred(types.ModuleType):
    """Stands in sys.modules for a module not loaded yet, and loads it at the first read of
    an attribute it lacks: it then puts the real module in sys.modules and takes on its
    namespace, so that whoever imported the stand-in reads the real names through it.
    (importlib.util.LazyLoader does not do here: on Python 3.11 an `import` statement
    reads the module's __spec__, which loads it.)"""

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        name = self.__name__
        if sys.modules.get(name) is self:
            del sys.modules[name]
        real = importlib.import_module(name)
        self.__dict__.update(real.__dict__)
        return getattr(real, attr)


DEFERRED = ("seaborn", "matplotlib.pyplot")


def import_gymnax():
    """gymnax. Each of DEFERRED not loaded yet has a stand-in (`_Deferred`) in its place in
    sys.modules until something reads from it."""
    if "gymnax" not in sys.modules:
        for name in DEFERRED:
            if name in sys.modules:
                continue
            spec = importlib.util.find_spec(name)
            if spec is None:
                continue
            stand_in = _Deferred(name)
            stand_in.__spec__ = spec
            if spec.submodule_search_locations is not None:
                stand_in.__path__ = spec.submodule_search_locations  # its submodules import
            sys.modules[name] = stand_in
    import gymnax

    return gymnax


__all__ = ["import_gymnax"]
