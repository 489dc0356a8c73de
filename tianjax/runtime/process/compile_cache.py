"""JAX's persistent compilation cache: opt-in, through the config key `compile_cache` (a
directory) or the environment variable TIANJAX_COMPILE_CACHE (the same; the key wins).
Switched on by the launchers (never at import); it changes process-wide JAX settings
(the cache directory, and caching every program however quick to compile), which then
apply to the user's own jits too, so it is off unless asked for.

Re-running a config is the common case (tuning, seeds, resumes, sync vs async), and on a
small CPU machine compilation is often most of a short run's wall time; with the cache a
program compiled once is loaded in milliseconds by every later run and actor process.

The processes tianjax starts itself are the exception: `tianjax train` (and what it
launches) and every actor process, where nothing but tianjax runs. They use DEFAULT when
neither the key nor the variable names a directory: each actor would otherwise compile the
same policy program, and every re-run of a config its programs. Measured with 32
latency-bound actors (configs/ppo_latency_async.yaml, 2 cores): each actor held 284 MiB RSS
(140 MiB of its own) when every actor compiled, 225 MiB (106) from the cache, and the
learner's compile beside them took 44 s, 33 s with the actors' cache, 14.5 s with its own.
`compile_cache: false` (or the variable set to "off") turns the cache off there too;
`compile_cache: true` names DEFAULT, in tianjax.train() from Python as well.
"""

from __future__ import annotations

import os

import jax

ENV = "TIANJAX_COMPILE_CACHE"


OFF = "off"
# the directory the test suite uses too; $XDG_CACHE_HOME moves it as it moves ~/.cache
DEFAULT = os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "tianjax", "xla")


def resolve(path: str | bool | None, default: str | None = None) -> str | None:
    """The cache directory a process uses: the config's key (a directory, true for DEFAULT,
    false for none), else $TIANJAX_COMPILE_CACHE, else `default`; None (no cache) when
    that is empty or "off"."""
    if path is False:
        return None
    if path is True:
        path = DEFAULT
    path = path or os.environ.get(ENV) or default
    if not path or path.strip().lower() == OFF:
        return None
    return os.path.expanduser(path)


def enable(path: str | bool | None, default: str | None = None) -> None:
    path = resolve(path, default)
    if path is None:
        return
    os.makedirs(path, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", path)
    # our programs are small: cache them all, not only those that took over a second
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


__all__ = ["DEFAULT", "ENV", "OFF", "enable", "resolve"]
