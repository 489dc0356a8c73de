"""JAX's persistent compilation cache: opt-in, through the config key `compile_cache` (a
directory) or the environment variable TIANJAX_COMPILE_CACHE (the same; the key wins).
Switched on by the launchers (never at import); it changes process-wide JAX settings
(the cache directory, and caching every program however quick to compile), which then
apply to the user's own jits too, so it is off unless asked for.

Re-running a config is the common case (tuning, seeds, resumes, sync vs async), and on a
small CPU machine compilation is often most of a short run's wall time; with the cache a
program compiled once is loaded in milliseconds by every later run and actor process.
"""

from __future__ import annotations

import os

import jax


ENV = "TIANJAX_COMPILE_CACHE"


def enable(path: str | None) -> None:
    path = path or os.environ.get(ENV) or None
    if not path:
        return
    path = os.path.expanduser(path)
    os.makedirs(path, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", path)
    # our programs are small: cache them all, not only those that took over a second
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
