"""The layering rule, read from the source text: the functional core (core, algos, networks,
the JAX envs, config) imports nothing from the runtime shell and no I/O module, and no two
tianjax modules import each other, directly or around a loop (lazy imports count: a
function-level import is still a dependency)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "tianjax"

CORE = (
    "tianjax.core",
    "tianjax.algos",
    "tianjax.networks",
    "tianjax.config",
    "tianjax.envs.gymnax_env",
    "tianjax.envs.brax_env",
    "tianjax.envs.marl",
)
SHELL = (
    "tianjax.runtime",
    "tianjax.transport",
    "tianjax.launch",
    "tianjax.metrics",
    "tianjax.checkpoint",
)
IO_MODULES = (
    "zmq",
    "threading",
    "multiprocessing",
    "subprocess",
    "socket",
    "orbax",
    "time",
    "datetime",
    "asyncio",
    "concurrent",
)


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
    (pkg / "core" / "a.py").write_text(
        "def f():\n    from tianjax.core import b\n    import time\n"
    )
    (pkg / "core" / "b.py").write_text("from tianjax.core.a import f\n")
    inner, outer = import_graph(pkg)
    assert inner["tianjax.core"] == {"tianjax.core.a"}
    assert inner["tianjax.core.a"] == {"tianjax.core.b"}
    assert "time" in outer["tianjax.core.a"]
    assert cycles(inner) == [["tianjax.core.a", "tianjax.core.b"]]


def test_core_imports_nothing_from_the_shell():
    inner, _ = import_graph()
    bad = sorted(
        f"{m} -> {d}"
        for m, deps in inner.items()
        if _under(m, CORE)
        for d in deps
        if _under(d, SHELL)
    )
    assert not bad, "the functional core imports the runtime shell:\n" + "\n".join(bad)


def test_core_does_no_io():
    _, outer = import_graph()
    bad = sorted(
        f"{m} imports {e}"
        for m, ext in outer.items()
        if _under(m, CORE)
        for e in ext
        if e in IO_MODULES
    )
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


# ----------------------------------------------------------------------------- the rooms
# the fixed layout of an algorithm's package (tianjax/algos/<name>/): every algorithm has
# these files, and the folder gives them their name
ALGORITHM_LAYOUT = ("__init__.py", "config.py", "loss.py", "spec.py")


def test_every_module_basename_is_unique():
    seen: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        in_algorithm_package = (
            len(rel.parts) == 3 and rel.parts[0] == "algos" and path.name in ALGORITHM_LAYOUT
        )
        if path.name == "__init__.py" or in_algorithm_package:
            continue
        seen.setdefault(path.name, []).append(str(rel))
    twice = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not twice, f"module basenames used more than once: {twice}"


def test_the_core_imports_nothing_from_the_algorithms():
    inner, _ = import_graph()
    bad = sorted(
        f"{m} -> {d}"
        for m, deps in inner.items()
        if _under(m, ("tianjax.core",))
        for d in deps
        if _under(d, ("tianjax.algos",))
    )
    assert not bad, "the core imports the algorithms:\n" + "\n".join(bad)


def _names_of_algorithms(path: Path, names) -> list[str]:
    """Code (not comments, not docstrings) of `path` that names one of `names`: a string
    that is a name or a dotted key of its section ("dqn", "ppo.lr"), an attribute
    (config.dqn), or an import of its package."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
        ):
            text = node.value
            if text in names or any(text.startswith(n + ".") for n in names):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {text!r}")
        elif isinstance(node, ast.Attribute) and node.attr in names:
            found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} .{node.attr}")
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
            )
            for m in modules:
                if any(
                    m == f"tianjax.algos.{n}" or m.startswith(f"tianjax.algos.{n}.") for n in names
                ):
                    found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} import {m}")
    return found


def test_no_module_outside_the_algorithms_names_a_built_in_one():
    from tianjax.algos import BUILTIN

    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).parts[0] == "algos":
            continue
        found += _names_of_algorithms(path, BUILTIN)
    assert not found, "outside tianjax/algos these name a built-in algorithm:\n" + "\n".join(found)


def test_the_algorithm_check_sees_a_name_in_code(tmp_path):
    bad = tmp_path / "tianjax" / "x.py"
    bad.parent.mkdir()
    bad.write_text(
        '"""The dqn docstring is prose."""\n# ppo in a comment\nk = "ppo.lr"\nv = config.dqn\n'
        "from tianjax.algos.qmix import loss\n"
    )
    global PACKAGE
    saved, PACKAGE = PACKAGE, tmp_path / "tianjax"
    try:
        found = _names_of_algorithms(bad, ("ppo", "dqn", "qmix"))
    finally:
        PACKAGE = saved
    assert sorted(f.split(" ", 1)[1] for f in found) == [
        "'ppo.lr'",
        ".dqn",
        "import tianjax.algos.qmix",
    ]
