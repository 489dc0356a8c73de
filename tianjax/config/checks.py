"""ConfigError, and the small checks and conversions every config section shares."""

from __future__ import annotations


class ConfigError(ValueError):
    """A bad config: the message names the offending key."""


def check_key(cond: bool, key: str, msg: str) -> None:
    """Raises ConfigError "config key 'KEY': MSG" unless `cond`."""
    if not cond:
        raise ConfigError(f"config key '{key}': {msg}")


def is_reference(text: str) -> bool:
    """Whether `text` has the form "module:Attr"."""
    return _is_reference(text)


def _is_reference(text: str) -> bool:
    module, sep, attr = text.partition(":")
    return bool(sep and module and attr)


def _to_plain(x):
    if isinstance(x, dict):
        return {k: _to_plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_to_plain(v) for v in x]
    return x


__all__ = ["ConfigError", "check_key", "is_reference"]
