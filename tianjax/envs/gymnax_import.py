"""gymnax, imported without loading seaborn until something reads from it.

gymnax's Pong module imports seaborn at its top for a palette its renderer draws with, and
seaborn brings scipy.stats and pandas: about 1 s of every process that makes a gymnax env
(1.6 s for `import seaborn` against 2.5 s for `import gymnax`, 2 cores), every fused run and
every learner and actor on a gymnax config among them.
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


def import_gymnax():
    """gymnax. Where seaborn is not loaded yet, a stand-in (`_Deferred`) takes its place in
    sys.modules until something reads from it."""
    if "gymnax" not in sys.modules and "seaborn" not in sys.modules:
        spec = importlib.util.find_spec("seaborn")
        if spec is not None:
            stand_in = _Deferred("seaborn")
            stand_in.__spec__ = spec
            stand_in.__path__ = spec.submodule_search_locations  # its submodules import
            sys.modules["seaborn"] = stand_in
    import gymnax

    return gymnax


__all__ = ["import_gymnax"]
