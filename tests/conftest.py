import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
# the suite compiles the same small programs in many tests and actor processes: the
# persistent cache (tianjax/runtime/process/compile_cache.py; opt-in for tianjax.train()
# from Python) is on for it, and child processes inherit it through the environment
from tianjax.runtime.process.compile_cache import DEFAULT as _CACHE  # noqa: E402

os.environ.setdefault("TIANJAX_COMPILE_CACHE", os.path.expanduser(_CACHE))
