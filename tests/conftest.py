import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
# the suite compiles the same small programs in many tests and actor processes: the
# persistent cache (tianjax/runtime/process/compile_cache.py; opt-in for tianjax.train()
# from Python) is on for it, and child processes inherit it through the environment
from tianjax.runtime.process.compile_cache import DEFAULT as _CACHE  # noqa: E402

os.environ.setdefault("TIANJAX_COMPILE_CACHE", os.path.expanduser(_CACHE))


def pytest_collection_modifyitems(config, items):
    """The slow tests (minutes each: training to a target, real processes and hosts) run
    first. The two workers then share them from the start, and the quick ones, handed out
    as each worker frees up, even out the end: collected in folder order, one worker could
    finish its last slow test alone while the other sat idle. The order is otherwise the
    collection's (a stable sort), the same on every worker, as xdist requires."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
