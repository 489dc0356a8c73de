"""Process plumbing: starting, supervising and placing processes (ports held across
learner restarts, the actor supervisor, one role process, SLURM tasks, bounded ends, the
collectives' address, where processes go on one host's devices, and hosts made of network namespaces for tests).

Import from here. Each name is imported on first use, so naming one does not start the
others' machinery.
"""

_LAZY = {  # name -> the module that holds it
    # a local run's actor processes: started, replaced when dead or silent, stopped
    "ActorSupervisor": "tianjax.launch.supervisor",
    "ACTOR_XLA_FLAGS": "tianjax.launch.supervisor",  # one XLA thread pool per actor process
    "actor_jax": "tianjax.launch.role",  # JAX set up as an actor process sets it up
    # where a run's processes go on one host: each acting process's device and environment,
    # the learner's, and the refusal of a device the host does not have
    "actor_environment": "tianjax.launch.placement",
    "learner_environment": "tianjax.launch.placement",
    "check_devices": "tianjax.launch.placement",
    "MEMORY_SHARE": "tianjax.launch.placement",  # of a GPU, split among the processes on it
    # hosts made of network namespaces on one machine, for multi-host tests
    "NamespaceCluster": "tianjax.launch.netns",
    "NetnsError": "tianjax.launch.netns",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(_LAZY)
