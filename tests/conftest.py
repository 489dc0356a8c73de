import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
# the suite compiles the same small programs in many tests and actor processes: the
# persistent cache (opt-in for users, tianjax/runtime/process/compile_cache.py) is on for it,
# and child processes inherit it through the environment
os.environ.setdefault("TIANJAX_COMPILE_CACHE", os.path.expanduser("~/.cache/tianjax/xla"))
