"""A resolved config as commented YAML (`tianjax show`): every key with its value and the
comment written beside its field in the schema, so what a key does is said in one place.

The output loads back: `tianjax show ppo_cartpole num_envs=8 > mine.yaml` then
`tianjax train mine.yaml`.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import typing

import yaml

from tianjax.config.schema import Config
from tianjax.config.sections import registry

_FIELD = re.compile(r"^    (\w+)\s*:\s*[^=]+(=.*)?$")


def _inline_comment(line: str) -> str | None:
    """The `# ...` part of a code line (outside string literals), or None."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch == "#":
            return line[i + 1 :].strip()
    return None


def _continues(block: list[str]) -> bool:
    """Whether a block of comment lines after a field's inline comment reads as its
    continuation: it opens in lower case or with a parenthesis."""
    first = block[0][:1] if block else ""
    return bool(first) and (first.islower() or first in "([")


@functools.cache
def field_comments(cls) -> dict[str, str]:
    """Field name -> its comment in the class source: the block of comment lines above the
    field, and its inline comment. A block after an inline comment that reads as its
    continuation (tianjax.config.describe._continues) belongs to that field, unless the
    field after the block has no inline comment of its own: then the block is that
    field's (a field is commented beside itself or above itself, never by nothing)."""
    lines = inspect.getsource(cls).splitlines()[1:]
    out: dict[str, str] = {}
    block: list[str] = []  # comment lines since the last code line
    last = None  # the previous field, while its inline comment may go on in the block

    def attach_to_last() -> bool:
        if last is not None and _continues(block):
            out[last] += " " + " ".join(block)
            return True
        return False

    for line in lines:
        text = line.strip()
        if text.startswith("#"):
            block.append(text.lstrip("#").strip())
            continue
        m = _FIELD.match(line)
        if m and not text.startswith(("def ", "@", "return")):
            name = m.group(1)
            inline = _inline_comment(line)
            above = block if inline is None or not attach_to_last() else []
            out[name] = " ".join([*above, *([inline] if inline else [])])
            last = name if inline is not None else None
        else:
            attach_to_last()
            last = None
        block = []
    attach_to_last()
    return out


def yaml_comments(text: str) -> dict[str, str]:
    """Dotted key -> the inline comment beside it in a config file (two-space sections)."""
    out, section = {}, None
    for line in text.splitlines():
        m = re.match(r"^( *)([A-Za-z_]\w*):(.*)$", line)
        if not m:
            continue
        indent, key, rest = m.groups()
        if not indent:
            section = key if not rest.split("#")[0].strip() else None
        path = f"{section}.{key}" if indent and section else key
        comment = _inline_comment(rest)
        if comment:
            out[path] = comment
    return out


@functools.cache
def _shipped_comments() -> dict[str, str]:
    """Comments of every shipped config, for keys the schema leaves uncommented."""
    import os

    from tianjax.config.library import configs_dir, names

    out: dict[str, str] = {}
    for name in names():
        with open(os.path.join(configs_dir(), name + ".yaml")) as f:
            for k, v in yaml_comments(f.read()).items():
                out.setdefault(k, v)
    return out


def _sections(cls) -> dict[str, type]:
    """Section key -> its class: Config's own sections and the algorithms' (the registry's)."""
    hints = typing.get_type_hints(cls)
    own = {
        f.name: hints[f.name]
        for f in dataclasses.fields(cls)
        if dataclasses.is_dataclass(hints[f.name])
    }
    return {**own, **registry().sections()}


def _value(v) -> str:
    text = yaml.safe_dump(v, default_flow_style=True, width=10_000).strip()
    return text[: -len("\n...")].strip() if text.endswith("...") else text


def render(
    config: Config,
    *,
    read_only: bool = True,
    header: str | None = None,
    source_text: str | None = None,
) -> str:
    """Commented YAML of `config` (only the sections its run reads, unless `read_only` is
    False). A key's comment is its field's in the schema, else the one beside it in
    `source_text` (the config file), else one from the shipped configs."""
    own = yaml_comments(source_text) if source_text else {}
    shipped = _shipped_comments()

    def fallback(path: str) -> str:
        return own.get(path) or shipped.get(path, "")

    data = config.to_dict(read_only=read_only)
    sections = _sections(Config)
    out = [f"# {line}" for line in (header or "").splitlines()]

    def emit(key: str, value, comment: str, indent: str) -> None:
        left = f"{indent}{key}: {_value(value)}"
        out.append(f"{left:<34} # {comment}" if comment else left)

    top = field_comments(Config)
    for key, value in data.items():
        if key in sections:
            continue
        emit(key, value, top.get(key) or fallback(key), "")
    for key, value in data.items():
        if key not in sections:
            continue
        cls = sections[key]
        out.append("")
        doc = top.get(key, "")
        out.append(f"{key}:" + (f"  # {doc}" if doc else ""))
        comments = field_comments(cls)
        for sub, v in value.items():
            emit(sub, v, comments.get(sub) or fallback(f"{key}.{sub}"), "  ")
    return "\n".join(out) + "\n"


__all__ = ["field_comments", "render", "yaml_comments"]
