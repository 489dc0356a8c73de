"""Checks a config can run before anything is written: the optional extras it needs are
installed, its env id exists, the modules it names (`network.module`, loggers) import, the
devices it lists exist on this host.

`tianjax train`, `tianjax launch` and `tianjax.train()` call `check(config)` before they
make a run directory, so a typo in an env id or a missing extra leaves nothing behind.
Modules named in `imports` are already imported (and checked) by `load_config`.
"""

from __future__ import annotations

import importlib.util

from tianjax.config import Config, ConfigError

# env_backend -> (the module it imports, the extra that installs it)
BACKEND_EXTRAS = {
    "envpool": ("envpool", "envpool"),
    "gymnasium": ("gymnasium", "gymnasium"),
    "jaxmarl": ("jaxmarl", "marl"),
    "brax": ("brax", "brax"),
}
# built-in logger name -> (module, extra)
LOGGER_EXTRAS = {"wandb": ("wandb", "wandb")}
# eval.video: the encoder's modules and the extra that installs them
VIDEO_MODULES = ("imageio", "imageio_ffmpeg")


def install_hint(extra: str) -> str:
    return f'pip install "tianjax[{extra}]" (from a clone: pip install -e ".[{extra}]")'


def require(module: str, extra: str, key: str, what: str) -> None:
    """ConfigError naming `key` and the extra when `module` is not installed."""
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise ConfigError(
            f"config key '{key}': {what} needs the {extra} extra, which is not installed; "
            f"{install_hint(extra)}"
        )


def check_extras(config: Config) -> None:
    if config.env_backend in BACKEND_EXTRAS:
        module, extra = BACKEND_EXTRAS[config.env_backend]
        require(module, extra, "env_backend", f"env_backend '{config.env_backend}'")
    for name in getattr(config, "loggers", ()):
        if name in LOGGER_EXTRAS:
            module, extra = LOGGER_EXTRAS[name]
            require(module, extra, "loggers", f"logger '{name}'")
    if config.eval.on and config.eval.video:
        for module in VIDEO_MODULES:
            require(module, "video", "eval.video", "an evaluation video")


def check_env_id(config: Config) -> None:
    """ConfigError naming 'env' when the backend does not know the env id. Host envs are
    looked up in their registry; JAX envs are built (cheap: no compilation)."""
    backend = config.env_backend
    if backend == "envpool":
        from tianjax.envs.envpool_env import check_env_id as check
    elif backend == "gymnasium":
        from tianjax.envs.gymnasium_env import check_env_id as check
    else:
        from tianjax.envs.factory import make_jax_env

        make_jax_env(backend, config.env, config.env_options)
        return
    check(config.env)


def check(config: Config, *, env_given: bool = False) -> None:
    """Everything that can be checked without side effects. `env_given`: train() was handed
    an env object, so the config's env id is not looked up."""
    check_extras(config)
    if not env_given:
        check_env_id(config)
    if config.network.module:  # imported here, as the actors will (a factory is called later)
        from tianjax.config.references import resolve_reference

        resolve_reference(config.network.module, "network.module")
    from tianjax.metrics.loggers import check_loggers

    check_loggers(config)
    if not config.in_process:
        from tianjax.launch.placement import check_devices

        check_devices(config)


def needed_extras(config: Config) -> list[str]:
    """The extras a config needs beyond the core (e.g. ["envpool"]), installed or not."""
    out = []
    if config.env_backend in BACKEND_EXTRAS:
        out.append(BACKEND_EXTRAS[config.env_backend][1])
    out += [LOGGER_EXTRAS[n][1] for n in getattr(config, "loggers", ()) if n in LOGGER_EXTRAS]
    if config.eval.on and config.eval.video:
        out.append("video")
    return out


def _main(argv=None) -> int:
    # `python -m tianjax.runtime.runners.preflight CONFIG [key=value ...]` prints the extras the config needs,
    # comma-separated (quickstart.sh installs them)
    import sys

    from tianjax.config import load_config
    from tianjax.config.library import resolve

    args = sys.argv[1:] if argv is None else argv
    if not args:
        print(
            "usage: python -m tianjax.runtime.runners.preflight CONFIG [key=value ...]",
            file=sys.stderr,
        )
        return 2
    try:
        config = load_config(resolve(args[0]), args[1:])
    except ConfigError as e:
        print(f"tianjax: error: {e}", file=sys.stderr)
        return 2
    print(",".join(needed_extras(config)))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())


__all__ = [
    "BACKEND_EXTRAS",
    "LOGGER_EXTRAS",
    "VIDEO_MODULES",
    "check",
    "check_env_id",
    "check_extras",
    "install_hint",
    "needed_extras",
    "require",
]
