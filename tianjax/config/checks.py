"""ConfigError, and the small checks and conversions every config section shares."""

from __future__ import annotations



class ConfigError(ValueError):
    """A bad config: the message names the offending key."""


def _check(cond: bool, key: str, msg: str) -> None:
    if not cond:
        raise ConfigError(f"config key '{key}': {msg}")



def _is_reference(text: str) -> bool:
    module, sep, attr = text.partition(":")
    return bool(sep and module and attr)


def _to_plain(x):
    if isinstance(x, dict):
        return {k: _to_plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_to_plain(v) for v in x]
    return x


# ----------------------------------------------------------------------------- building
