"""Environments behind two protocols: JAX envs stepped inside a lax.scan (gymnax, brax,
JaxMARL; `tianjax.core.Env`) and host envs stepped from Python (envpool, gymnasium vector
envs; `HostEnv`). The factory builds the env a config names; the adapters build one
directly.

Import from here. Each name is imported on first use: a backend (gymnax, brax, JaxMARL,
envpool) is imported only where its env is built, and the extras stay optional.
"""

_LAZY = {  # name -> the module that holds it
    # the env a config names, and its spaces without stepping it
    "BACKENDS": "tianjax.envs.factory",
    "env_spec": "tianjax.envs.factory",
    "make_host_env": "tianjax.envs.factory",
    "make_jax_env": "tianjax.envs.factory",
    # the host-env protocol an adapter of your own follows
    "HostEnv": "tianjax.envs.host_api",
    "HostStep": "tianjax.envs.host_api",
    "action_spec": "tianjax.envs.spaces",  # an env's action space as an ActionSpec
    # each adapter, built directly (benchmarks time an env without a config)
    "make_gymnax": "tianjax.envs.gymnax_env",
    "make_brax": "tianjax.envs.brax_env",
    "make_jaxmarl": "tianjax.envs.marl",
    "EnvpoolEnv": "tianjax.envs.envpool_env",
    "GymnasiumVectorEnv": "tianjax.envs.gymnasium_env",
    # the latency-bound envs: their ids, and the delay each simulator step sleeps
    "CARTPOLE_ID": "tianjax.envs.latency",
    "LUNARLANDER_ID": "tianjax.envs.latency",
    "Latency": "tianjax.envs.latency",
    "draw_delay_s": "tianjax.envs.latency",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(_LAZY)
