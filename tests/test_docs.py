"""docs/architecture.md stays true to the tree: every module of tianjax/ is listed exactly
once, nothing listed is missing, and every module path the picture names exists."""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tianjax"
DOC = ROOT / "docs" / "architecture.md"
TREE_HEADING = "## Every module"


def _blocks(text: str) -> list[str]:
    return re.findall(r"^```text\n(.*?)^```", text, flags=re.S | re.M)


def parse_tree(block: str) -> list[str]:
    """The listed paths, relative to the repository root: folders end with '/'. Each line is
    '<indent><name>  <what it holds>', indented two spaces per level."""
    paths, stack = [], []
    for n, line in enumerate(block.splitlines(), 1):
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        if indent % 2:
            raise ValueError(f"tree line {n}: odd indent: {line!r}")
        level = indent // 2
        if level > len(stack):
            raise ValueError(f"tree line {n}: indented under no folder: {line!r}")
        del stack[level:]
        name = line.split()[0]
        paths.append("".join(stack) + name)
        if name.endswith("/"):
            stack.append(name)
        elif len(line.split()) < 2:
            raise ValueError(f"tree line {n}: {name} says nothing about what it holds")
    return paths


def actual_tree() -> set[str]:
    """tianjax/'s folders and modules, a package's __init__.py standing for it, except the
    top level's, which holds the public API."""
    out = {"tianjax/", "tianjax/__init__.py"}
    for f in PACKAGE.rglob("*.py"):
        if "__pycache__" in f.parts:
            continue
        rel = f.relative_to(ROOT).as_posix()
        if f.name == "__init__.py":
            out.add(rel[: -len("__init__.py")])
        else:
            out.add(rel)
    return out


def _doc_tree() -> list[str]:
    text = DOC.read_text()
    after = text.split(TREE_HEADING, 1)
    assert len(after) == 2, f"{DOC.name} has no '{TREE_HEADING}' section"
    blocks = _blocks(after[1])
    assert blocks, f"{DOC.name}'s '{TREE_HEADING}' section has no ```text tree"
    return parse_tree(blocks[0])


def test_every_module_is_listed_once_and_every_listed_one_exists():
    listed = _doc_tree()
    twice = sorted({p for p in listed if listed.count(p) > 1})
    actual = actual_tree()
    missing = sorted(actual - set(listed))
    stale = sorted(set(listed) - actual)
    assert not missing and not stale and not twice, (
        f"docs/architecture.md is out of date: missing {missing}, listed but absent {stale}, "
        f"listed twice {twice}"
    )


def test_every_module_path_in_the_picture_exists():
    text = DOC.read_text().split(TREE_HEADING, 1)[0]
    named = set(re.findall(r"\b(?:[a-z_]+/)+[a-z_]+\.py\b", text)) | set(
        re.findall(r"`([a-z_]+\.py)`", text)
    )
    assert len(named) > 20  # the picture names the module at each step
    absent = sorted(p for p in named if not (PACKAGE / p).is_file() and not (ROOT / p).is_file())
    assert not absent, f"docs/architecture.md names modules that do not exist: {absent}"


@pytest.mark.parametrize(
    "block, expected",
    [
        (
            "tianjax/\n  a.py  x\n  sub/  y\n    b.py  z\n  c.py  w\n",
            ["tianjax/", "tianjax/a.py", "tianjax/sub/", "tianjax/sub/b.py", "tianjax/c.py"],
        ),
    ],
)
def test_parse_tree(block, expected):
    assert parse_tree(block) == expected


@pytest.mark.parametrize(
    "block",
    ["tianjax/\n   a.py  odd indent\n", "tianjax/\n    a.py  too deep\n", "tianjax/\n  a.py\n"],
)
def test_parse_tree_rejects_a_malformed_tree(block):
    with pytest.raises(ValueError):
        parse_tree(block)
