import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
# the suite compiles the same small programs in many tests and actor processes: the
# persistent cache (tianjax/runtime/process/compile_cache.py; opt-in for tianjax.train()
# from Python) is on for it, and child processes inherit it through the environment
from tianjax.runtime.process.compile_cache import DEFAULT as _CACHE  # noqa: E402

os.environ.setdefault("TIANJAX_COMPILE_CACHE", os.path.expanduser(_CACHE))


def pytest_configure(config):
    """Under xdist, hand the workers their tests one at a time (`--maxschedchunk 1`, unless
    given). Its default load scheduling first sends each worker a block of *consecutive*
    tests, a quarter of its share (77 each of 931 with 3 workers), and a worker busy with
    long tests keeps its block: with the slow tests sorted first (below), the first worker
    got every one of them and ran 1,388 s while the other two had finished at 853 s."""
    if hasattr(config.option, "maxschedchunk") and config.option.maxschedchunk is None:
        config.option.maxschedchunk = 1


def pytest_collection_modifyitems(config, items):
    """The slow tests (minutes each: training to a target, real processes and hosts) run
    first. Handed out one at a time (above), they spread over the workers from the start,
    and the quick ones, taken as each worker frees up, even out the end; in folder order,
    one worker could finish its last slow test alone while the others sat idle. The order
    is otherwise the collection's (a stable sort), the same on every worker, as xdist
    requires."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
