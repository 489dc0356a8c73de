"""The layering rule, read from the source text: the functional core (core, algos, networks,
the JAX envs, config) imports nothing from the runtime shell and no I/O module, and no two
tianjax modules import each other, directly or around a loop (lazy imports count: a
function-level import is still a dependency)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "tianjax"

CORE = ("tianjax.core", "tianjax.algos", "tianjax.networks", "tianjax.config",
        "tianjax.envs.gymnax_env", "tianjax.envs.brax_env", "tianjax.envs.marl")
SHELL = ("tianjax.runtime", "tianjax.transport", "tianjax.launch", "tianjax.metrics", "tianjax.checkpoint")
IO_MODULES = ("zmq", "threading", "multiprocessing", "subprocess", "socket", "orbax", "time", "datetime",
              "asyncio", "concurrent")


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _under(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def import_graph(root: Path = PACKAGE) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(module -> tianjax modules it imports, module -> outside top-level modules it imports),
    every import statement in the file, at any depth."""
    files = {_module_name(p, root): p for p in root.rglob("*.py")}
    inner: dict[str, set[str]] = {}
    outer: dict[str, set[str]] = {}
    for name, path in files.items():
        deps, ext = set(), set()
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [(a.name, None) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [(base, a.name) for a in node.names]
            else:
                continue
            for module, attr in targets:
                if module.split(".")[0] != "tianjax":
                    ext.add(module.split(".")[0])
                    continue
                # `from pkg import sub` imports the module pkg.sub where there is one
                full = f"{module}.{attr}" if attr and f"{module}.{attr}" in files else module
                if full in files and full != name:
                    deps.add(full)
        inner[name], outer[name] = deps, ext
    return inner, outer


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_graph_reader_sees_lazy_and_relative_imports(tmp_path):
    pkg = tmp_path / "tianjax"
    (pkg / "core").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "core" / "__init__.py").write_text("from . import a\n")
    (pkg / "core" / "a.py").write_text("def f():\n    from tianjax.core import b\n    import time\n")
    (pkg / "core" / "b.py").write_text("from tianjax.core.a import f\n")
    inner, outer = import_graph(pkg)
    assert inner["tianjax.core"] == {"tianjax.core.a"}
    assert inner["tianjax.core.a"] == {"tianjax.core.b"}
    assert "time" in outer["tianjax.core.a"]
    assert cycles(inner) == [["tianjax.core.a", "tianjax.core.b"]]


def test_core_imports_nothing_from_the_shell():
    inner, _ = import_graph()
    bad = sorted(f"{m} -> {d}" for m, deps in inner.items() if _under(m, CORE)
                 for d in deps if _under(d, SHELL))
    assert not bad, "the functional core imports the runtime shell:\n" + "\n".join(bad)


def test_core_does_no_io():
    _, outer = import_graph()
    bad = sorted(f"{m} imports {e}" for m, ext in outer.items() if _under(m, CORE)
                 for e in ext if e in IO_MODULES)
    assert not bad, "the functional core imports I/O modules:\n" + "\n".join(bad)


def test_no_import_cycles():
    inner, _ = import_graph()
    found = cycles(inner)
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


@pytest.mark.parametrize("name", ["tianjax.core.update", "tianjax.runtime.learner.learner"])
def test_one_name_for_one_thing(name):
    # the pure optimizer step and the learner process are told apart by their paths
    assert (PACKAGE.parent / (name.replace(".", "/") + ".py")).is_file()
    assert not (PACKAGE / "learner.py").exists()
