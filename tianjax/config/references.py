"""References to user code, "module:Attr": how a config names an env, a network, a logger."""

from __future__ import annotations

import importlib

from tianjax.config.checks import ConfigError


def resolve_reference(text: str, key: str):
    """The object named by "module:Attr" (Attr may be dotted); ConfigError naming `key`."""
    module_name, sep, attr = text.partition(":")
    if not (sep and module_name and attr):
        raise ConfigError(f"config key '{key}': must be 'module:Attr', got {text!r}")
    try:
        obj = importlib.import_module(module_name)
    except Exception as e:
        line = (str(e).strip().splitlines() or [""])[0]
        raise ConfigError(
            f"config key '{key}': cannot import {module_name!r} ({type(e).__name__}: {line})"
        ) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"config key '{key}': module {module_name!r} has no {attr!r}")
        obj = getattr(obj, part)
    return obj


__all__ = ["resolve_reference"]
