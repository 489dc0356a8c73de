"""Loading a config: YAML files, dotted `key.sub=value` overrides, typed coercion of every
value, and the `imports` a config names (a user's env, network or algorithm)."""

from __future__ import annotations

import dataclasses
import math
import os
import types
import typing
from typing import Any, Literal, Mapping, Sequence

import yaml

from tianjax.config.checks import ConfigError, check_key
from tianjax.config.schema import Config
from tianjax.config.sections import registry

# keys renamed: old dotted key -> new one (an algorithm's own are its spec's)
RENAMED_KEYS = {"eval_episodes": "eval.episodes"}
# values renamed: (dotted key, old value) -> new value
RENAMED_VALUES = {("runtime.security", "mac"): "plain"}


def import_modules(names: Sequence[str]) -> None:
    """Imports each module name, or runs each .py file as a module named after the file
    (its `if __name__ == "__main__":` block does not run); ConfigError naming `imports`."""
    import importlib
    import importlib.util
    import sys

    for name in names:
        try:
            if name.endswith(".py"):
                path = os.path.abspath(os.path.expanduser(name))
                mod_name = os.path.splitext(os.path.basename(path))[0]
                if (
                    mod_name in sys.modules
                    and getattr(sys.modules[mod_name], "__file__", None) == path
                ):
                    continue
                spec = importlib.util.spec_from_file_location(mod_name, path)
                if spec is None or not os.path.isfile(path):
                    raise FileNotFoundError(f"no file {path}")
                module = importlib.util.module_from_spec(spec)
                sys.modules[mod_name] = module
                try:
                    spec.loader.exec_module(module)
                except BaseException:
                    del sys.modules[mod_name]
                    raise
            else:
                importlib.import_module(name)
        except Exception as e:
            line = (str(e).strip().splitlines() or [""])[0]
            raise ConfigError(
                f"config key 'imports': cannot import {name!r} ({type(e).__name__}: {line})"
            ) from None


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Checks `value` against the annotation `tp`, converting where it is lossless."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        choices = typing.get_args(tp)
        check_key(value in choices, key, f"must be one of {list(choices)}, got {value!r}")
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None:
            check_key(type(None) in args, key, "must not be null")
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0])
    if origin is dict:
        check_key(isinstance(value, Mapping), key, f"must be a mapping, got {value!r}")
        out = {}
        for k, v in value.items():
            check_key(isinstance(k, str), key, f"keys must be strings, got {k!r}")
            scalar = (bool, int, float, str, type(None))
            is_list = isinstance(v, (list, tuple)) and all(isinstance(x, scalar) for x in v)
            check_key(
                isinstance(v, scalar) or is_list,
                f"{key}.{k}",
                f"must be a number, string, bool, null or a list of them, got {v!r}",
            )
            out[k] = list(v) if isinstance(v, tuple) else v
        return out
    if origin is tuple:
        args = typing.get_args(tp)
        check_key(isinstance(value, (list, tuple)), key, f"must be a list, got {value!r}")
        return tuple(_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value))
    if dataclasses.is_dataclass(tp):
        check_key(isinstance(value, Mapping), key, f"must be a mapping of sub-keys, got {value!r}")
        return _build(tp, value, prefix=f"{key}.")
    if tp is bool:
        check_key(isinstance(value, bool), key, f"must be true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)  # 5e5 in YAML
        if isinstance(value, str):
            try:
                f = float(value)
                value = int(f) if f.is_integer() else value
            except ValueError:
                pass
        check_key(
            isinstance(value, int) and not isinstance(value, bool),
            key,
            f"must be an integer, got {value!r}",
        )
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads 1e-3 as a string
            try:
                value = float(value)
            except ValueError:
                pass
        check_key(
            isinstance(value, (int, float)) and not isinstance(value, bool),
            key,
            f"must be a number, got {value!r}",
        )
        check_key(math.isfinite(value), key, f"must be finite, got {value!r}")
        return float(value)
    if tp is str:
        check_key(isinstance(value, str), key, f"must be a string, got {value!r}")
        return value
    raise TypeError(f"unsupported annotation {tp} for {key}")


def _build(cls, data: Mapping, prefix: str = ""):
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    if cls is Config:  # the algorithms' own sections are top-level keys too
        names.discard("algo_sections")
        hints.update(registry().sections())
        names |= set(registry().sections())
    for k, v in data.items():
        _refuse_renamed(f"{prefix}{k}", v)
        if k not in names:
            raise ConfigError(f"config key '{prefix}{k}': unknown key (known: {sorted(names)})")
    kwargs = {k: _coerce(v, hints[k], f"{prefix}{k}") for k, v in data.items()}
    return cls(**kwargs)


def _refuse_renamed(key: str, value) -> None:
    """A key or value that was renamed is refused with the new name in the message (an
    algorithm's renamed keys are its spec's)."""
    renamed = {**RENAMED_KEYS, **registry().renamed_keys()}
    if key in renamed:
        raise ConfigError(f"config key '{key}': renamed to '{renamed[key]}'")
    if isinstance(value, str) and (key, value) in RENAMED_VALUES:
        raise ConfigError(
            f"config key '{key}': '{value}' is now called '{RENAMED_VALUES[key, value]}'"
        )


def migrate(data: Mapping) -> tuple[dict, list[str]]:
    """A config written before some keys or values were renamed (a run directory's
    config.yaml), brought up to today's names: (the data, what was renamed, one line
    each). A config a user names is refused instead, with the new name in the message."""
    data = _deep_copy(dict(data))
    done = []
    for old, new in {**RENAMED_KEYS, **registry().renamed_keys()}.items():
        *old_path, old_key = old.split(".")
        node = data
        for part in old_path:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict) or old_key not in node:
            continue
        value = node.pop(old_key)
        *new_path, new_key = new.split(".")
        target = data
        for part in new_path:
            target = target.setdefault(part, {})
        target[new_key] = value
        done.append(f"{old} -> {new}")
    for (key, old_value), new_value in RENAMED_VALUES.items():
        *path, last = key.split(".")
        node = data
        for part in path:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict) and node.get(last) == old_value:
            node[last] = new_value
            done.append(f"{key}: {old_value} -> {new_value}")
    return data, done


def parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise ConfigError(f"override '{text}': expected key=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override '{text}': empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def apply_overrides(data: dict, overrides: Sequence[str]) -> dict:
    """Returns a copy of `data` with each `a.b.c=value` applied (value parsed as YAML)."""
    data = _deep_copy(data)
    for text in overrides:
        path, value = parse_override(text)
        node = data
        for i, p in enumerate(path[:-1]):
            sub = node.setdefault(p, {})
            if not isinstance(sub, dict):
                raise ConfigError(f"config key '{'.'.join(path[: i + 1])}': is not a section")
            node = sub
        node[path[-1]] = value
    return data


def _deep_copy(d):
    return {k: _deep_copy(v) if isinstance(v, dict) else v for k, v in d.items()}


def read_yaml(path: str | os.PathLike) -> dict:
    if not os.path.exists(path):
        raise ConfigError(f"config file '{path}': not found")
    with open(path) as f:
        try:
            data = yaml.safe_load(f)
        except yaml.YAMLError as e:
            raise ConfigError(f"config file '{path}': not valid YAML ({e})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file '{path}': the top level must be a mapping of keys")
    return data


def load_config(
    source: str | os.PathLike | Mapping | Config | None = None,
    overrides: Sequence[str] = (),
    *,
    saved: bool = False,
    **kwargs,
) -> Config:
    """Builds a validated Config.

    Args:
      source: a YAML path, a shipped config's name ("ppo_cartpole"; `tianjax configs`
        lists them), a (nested) dict, a Config, or None for the defaults.
      overrides: dotted `key=value` strings, e.g. ["num_envs=8", "staleness.schedule=hinge"].
      saved: the source is a config tianjax wrote (a run directory's config.yaml): keys and
        values renamed since are read under their new names (`migrate`) instead of refused.
      **kwargs: top-level keys, applied last (e.g. run_dir="runs/x").
    """
    if isinstance(source, Config):
        data = source.to_dict()
    elif isinstance(source, Mapping):
        data = _deep_copy(dict(source))
    elif source is None:
        data = {}
    else:
        from tianjax.config.library import resolve

        data = read_yaml(resolve(source))  # a path, or a shipped config's name
    if saved:
        data, _ = migrate(data)
    data = apply_overrides(data, overrides)
    for k, v in kwargs.items():
        data[k] = v
    imports = data.get("imports") or ()
    if isinstance(imports, str):
        imports = data["imports"] = [imports]
    if isinstance(imports, (list, tuple)) and all(isinstance(m, str) for m in imports):
        import_modules(imports)  # first: they may register the algorithm the config names
    return _build(Config, data)


__all__ = [
    "RENAMED_KEYS",
    "migrate",
    "RENAMED_VALUES",
    "apply_overrides",
    "import_modules",
    "load_config",
    "parse_override",
    "read_yaml",
]
