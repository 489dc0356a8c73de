"""The ready configs shipped with tianjax, found by name from any directory.

The repository's configs/ is the one source of truth; the package ships the same files as
tianjax/configs (a link in the repository, real files in a wheel), so `tianjax train
ppo_cartpole` works wherever tianjax is installed, and `configs/ppo_cartpole.yaml` keeps
working from a clone.
"""

from __future__ import annotations

import os
from importlib import resources
from typing import NamedTuple

from tianjax.config.checks import ConfigError
from tianjax.config.sections import registry


def configs_dir() -> str:
    """The directory of the shipped configs."""
    return str(resources.files("tianjax") / "configs")


def names() -> list[str]:
    d = configs_dir()
    if not os.path.isdir(d):
        return []
    return sorted(f[: -len(".yaml")] for f in os.listdir(d) if f.endswith(".yaml"))


def resolve(source):
    """A config path for `source`: an existing file as given, else a shipped config's name
    ("ppo_cartpole", "ppo_cartpole.yaml", or "configs/ppo_cartpole.yaml" from another
    directory). Anything else (a dict, a Config, None) is returned unchanged."""
    if not isinstance(source, (str, os.PathLike)):
        return source
    text = os.fspath(source)
    if os.path.exists(text):
        return text
    base = os.path.basename(text)
    name = base[: -len(".yaml")] if base.endswith(".yaml") else base
    is_name = os.sep not in text or os.path.dirname(text) in (
        "configs",
        os.path.join(".", "configs"),
    )
    if is_name and name in names():
        return os.path.join(configs_dir(), name + ".yaml")
    known = names()
    close = [n for n in known if name and (name in n or n in name)][:4]
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    if not is_name or text.endswith(".yaml"):
        raise ConfigError(
            f"config file '{text}': not found (nor a shipped config of that name: "
            f"`tianjax configs` lists them){hint}"
        )
    raise ConfigError(
        f"config '{text}': neither a file nor a shipped config name (list them with "
        f"`tianjax configs`){hint}"
    )


class ConfigInfo(NamedTuple):
    name: str
    algo: str
    env: str
    env_backend: str
    mode: str
    summary: str  # the first sentence of the file's opening comment


def describe(name: str) -> ConfigInfo:
    """What a shipped config trains, read from its YAML (without building it)."""
    import yaml

    path = os.path.join(configs_dir(), name + ".yaml")
    with open(path) as f:
        text = f.read()
    data = yaml.safe_load(text) or {}
    head = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        head.append(line.lstrip("# ").rstrip())
    words = " ".join(head)
    summary = words.split(". ")[0].split(": ")[0].rstrip(".")
    return ConfigInfo(
        name,
        str(data.get("algo", registry().default)),
        str(data.get("env", "CartPole-v1")),
        str(data.get("env_backend", "gymnax")),
        str(data.get("mode", "fused")),
        summary,
    )


__all__ = ["ConfigInfo", "configs_dir", "describe", "names", "resolve"]
