"""The declared surface, read from the source text: every public face declares `__all__` and
has what it declares; experiments/, the notebook and the Python blocks of README.md and
docs/*.md import tianjax only through the faces (no module below one, no name a face or an
exported module does not declare); and no module of tianjax takes a `_private` name from
another package, nor any name the module it takes it from leaves out of its `__all__`. The
checked files are parsed, never imported."""

from __future__ import annotations

import ast
import importlib
import json
import re
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tianjax"

# the faces a user, an experiment or a doc imports from; everything else is reached through
# them (a face may export a submodule: `from tianjax.core import staleness`)
PUBLIC = (
    "tianjax",
    "tianjax.errors",  # how a run fails, caught by type
    "tianjax.config",
    "tianjax.algos",
    "tianjax.core",
    "tianjax.networks",
    "tianjax.envs",
    "tianjax.transport",
    "tianjax.metrics",
    "tianjax.checkpoint",
    "tianjax.runtime",
    "tianjax.runtime.runners",  # a face of its own: the runner modules a benchmark tunes
    "tianjax.launch",
)


def _module_name(path: Path, root: Path | None = None) -> str:
    parts = list(path.relative_to((root or PACKAGE).parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def package_of(module: str) -> str:
    """The top-level package a module belongs to (tianjax.runtime for
    tianjax.runtime.learner.pool); the modules at the top of tianjax/ are tianjax's own."""
    parts = module.split(".")
    if len(parts) > 1 and (PACKAGE / parts[1]).is_dir():
        return ".".join(parts[:2])
    return "tianjax"


def declared_all(module: str) -> list[str] | None:
    """A module's `__all__` as written (a literal list or tuple), without importing it."""
    tree = ast.parse(MODULES[module].read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return [e.value for e in node.value.elts] if hasattr(node.value, "elts") else None
    return None


def surface() -> dict[str, dict[str, str | None]]:
    """face -> {declared name -> the module it is (an exported submodule), else None}."""
    out = {}
    for face in PUBLIC:
        module = importlib.import_module(face)
        names = {}
        for name in module.__all__:
            sub = f"{face}.{name}"
            value = getattr(module, name, None)
            is_module = isinstance(value, ModuleType) or (value is None and sub in MODULES)
            names[name] = sub if is_module and sub in MODULES else None
        out[face] = names
    return out


# ----------------------------------------------------------------------------- the checker
def surface_violations(tree: ast.AST, faces: dict[str, dict[str, str | None]]) -> list[str]:
    """Where `tree` reaches tianjax other than through `faces`: an import of a module below
    a face, a name a face does not declare, or an attribute path (tianjax.core.fused_loop,
    rollout.helper) through a module that does not declare its next step."""
    found: list[str] = []
    bound: dict[str, str] = {}  # local name -> the tianjax module it is

    def declares(module: str, name: str) -> tuple[bool, str | None]:
        if module in faces:
            return name in faces[module], faces[module].get(name)
        sub = f"{module}.{name}"
        return name in (declared_all(module) or ()), sub if sub in MODULES else None

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != "tianjax":
                    continue
                if alias.name not in faces:
                    found.append(f"line {node.lineno}: import {alias.name} (below a face)")
                if alias.asname:
                    bound[alias.asname] = alias.name
                else:
                    bound["tianjax"] = "tianjax"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "tianjax":
            if node.module not in faces:
                names = ", ".join(a.name for a in node.names)
                found.append(
                    f"line {node.lineno}: from {node.module} import {names} (below a face)"
                )
                continue
            for alias in node.names:
                ok, sub = declares(node.module, alias.name)
                if not ok:
                    found.append(
                        f"line {node.lineno}: from {node.module} import {alias.name} "
                        f"(not in {node.module}.__all__)"
                    )
                elif sub:
                    bound[alias.asname or alias.name] = sub
    inner_nodes: set[int] = set()  # each attribute path once, from its outermost node
    for node in ast.walk(tree):  # (breadth first: a.b.c comes before its a.b)
        if not isinstance(node, ast.Attribute) or id(node) in inner_nodes:
            continue
        chain, inner = [], node
        while isinstance(inner, ast.Attribute):
            chain.append(inner.attr)
            inner_nodes.add(id(inner.value))
            inner = inner.value
        if not (isinstance(inner, ast.Name) and inner.id in bound):
            continue
        module = bound[inner.id]
        for attr in reversed(chain):
            ok, sub = declares(module, attr)
            if not ok:
                found.append(f"line {node.lineno}: {module}.{attr} (not in {module}.__all__)")
                break
            if sub is None:
                break
            module = sub
    return found


def private_imports(path: Path) -> list[str]:
    """`_private` names (or modules) this tianjax module takes from another package, by
    import or as an attribute of a module it imported."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    found, bound = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            if base.split(".")[0] != "tianjax":
                continue
            for alias in node.names:
                full = f"{base}.{alias.name}"
                taken = full if full in MODULES else base
                if full in MODULES:
                    bound[alias.asname or alias.name] = full
                privately = _is_private(alias.name) or any(map(_is_private, base.split(".")))
                if privately and package_of(taken) != package_of(name):
                    found.append(f"{name}:{node.lineno} from {base} import {alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "tianjax":
                    bound[alias.asname or "tianjax"] = alias.name if alias.asname else "tianjax"
                    if any(map(_is_private, alias.name.split("."))) and package_of(
                        alias.name
                    ) != package_of(name):
                        found.append(f"{name}:{node.lineno} import {alias.name}")
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        chain, inner = [node.attr], node.value
        while isinstance(inner, ast.Attribute):
            chain.append(inner.attr)
            inner = inner.value
        if not (isinstance(inner, ast.Name) and inner.id in bound):
            continue
        path_ = [bound[inner.id], *reversed(chain)]
        if _is_private(path_[-1]):
            owner = ".".join(path_[:-1])
            if owner in MODULES and package_of(owner) != package_of(name):
                found.append(f"{name}:{node.lineno} {'.'.join(path_)}")
    return found


# ----------------------------------------------------------------------------- the sources
def python_blocks(path: Path) -> list[tuple[int, str]]:
    """(line, code) of each ```python block of a Markdown file."""
    text = path.read_text()
    return [
        (text[: m.start()].count("\n") + 2, m.group(1))
        for m in re.finditer(r"^```python\n(.*?)^```", text, flags=re.S | re.M)
    ]


def notebook_code(path: Path) -> str:
    cells = json.loads(path.read_text())["cells"]
    lines = [
        line
        for c in cells
        if c["cell_type"] == "code"
        for line in "".join(c["source"]).splitlines()
        if not line.lstrip().startswith(("%", "!"))  # IPython magics and shell lines
    ]
    return "\n".join(lines)


def user_sources() -> list[tuple[str, str]]:
    """(where, code) of every file and snippet that must use only the surface."""
    out = [
        (str(p.relative_to(ROOT)), p.read_text()) for p in sorted(ROOT.glob("experiments/**/*.py"))
    ]
    out += [
        (str(p.relative_to(ROOT)), notebook_code(p))
        for p in sorted(ROOT.glob("experiments/**/*.ipynb"))
    ]
    for md in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        out += [(f"{md.relative_to(ROOT)}:{line}", code) for line, code in python_blocks(md)]
    return out


# ----------------------------------------------------------------------------- the tests
@pytest.mark.parametrize("face", PUBLIC)
def test_every_face_declares_what_it_offers(face):
    module = importlib.import_module(face)
    assert "__all__" in vars(module), f"{face} declares no __all__"
    names = list(module.__all__)
    assert names and len(names) == len(set(names)), f"{face}.__all__ is empty or repeats a name"
    missing = []
    for name in names:
        if hasattr(module, name):
            continue
        try:  # a package may declare a submodule, imported when named
            importlib.import_module(f"{face}.{name}")
        except ModuleNotFoundError:
            missing.append(name)
    assert not missing, f"{face}.__all__ declares what it does not have: {missing}"


def test_every_module_declares_its_public_names():
    bare = []
    for module, path in sorted(MODULES.items()):
        tree = ast.parse(path.read_text())
        defined = [
            n.name
            for n in tree.body
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            and not n.name.startswith("_")
        ]
        has_all = any(
            isinstance(n, ast.Assign)
            and any(getattr(t, "id", None) == "__all__" for t in n.targets)
            for n in tree.body
        )
        if defined and not has_all:
            bare.append(module)
    assert not bare, f"modules with public functions or classes but no __all__: {bare}"


def test_experiments_and_docs_use_only_the_surface():
    faces = surface()
    found = []
    for where, code in user_sources():
        try:
            tree = ast.parse(code, where)
        except SyntaxError as e:
            found.append(f"{where}: does not parse: {e}")
            continue
        found += [f"{where}: {v}" for v in surface_violations(tree, faces)]
    assert not found, "reached below the public surface:\n" + "\n".join(found)


def test_no_private_name_crosses_a_package():
    found = [f for path in sorted(PACKAGE.rglob("*.py")) for f in private_imports(path)]
    assert not found, "private names imported from another package:\n" + "\n".join(found)


def test_other_packages_take_only_declared_names():
    found = []
    for module, path in sorted(MODULES.items()):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0):
                continue
            source = node.module or ""
            if source not in MODULES or package_of(source) == package_of(module):
                continue
            declared = declared_all(source)
            if declared is None:  # a face that builds its __all__ (its lazy names)
                declared = getattr(importlib.import_module(source), "__all__", [])
            found += [
                f"{module}:{node.lineno} from {source} import {alias.name}"
                for alias in node.names
                if alias.name not in declared and f"{source}.{alias.name}" not in MODULES
            ]
    assert not found, "names taken from another package that it does not declare:\n" + "\n".join(
        found
    )


def test_the_surface_check_sees_what_it_must():
    faces = {
        "tianjax": {"train": None, "core": "tianjax.core"},
        "tianjax.core": {"gae": None, "rollout": "tianjax.core.rollout"},
    }
    code = (
        "import tianjax\nimport tianjax.core.fused_loop\nfrom tianjax.core import gae, make_x\n"
        "from tianjax.core.returns import vtrace\nfrom tianjax.core import rollout as R\n"
        "tianjax.train()\ntianjax.core.gae()\ntianjax.core.update.init_state()\n"
        "R.make_rollout()\nR._helper()\n"
    )
    found = surface_violations(ast.parse(code), faces)
    assert [f.split(": ", 1)[1].split(" (")[0] for f in found] == [
        "import tianjax.core.fused_loop",
        "from tianjax.core import make_x",
        "from tianjax.core.returns import vtrace",
        "tianjax.core.update",
        "tianjax.core.rollout._helper",
    ]


def test_the_private_check_sees_imports_and_attributes(tmp_path):
    global PACKAGE, MODULES
    pkg = tmp_path / "tianjax"
    for sub in ("a", "b"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "x.py").write_text("def _h(): pass\n")
    (pkg / "a" / "y.py").write_text("from tianjax.a.x import _h\n")  # same package: fine
    (pkg / "b" / "z.py").write_text(
        "from tianjax.a.x import _h\nfrom tianjax.a import x\nimport tianjax.a.x as ax\n"
        "def f():\n    return x._h, ax._h, x.public\n"
    )
    saved = PACKAGE, MODULES
    PACKAGE, MODULES = pkg, {_module_name(p, pkg): p for p in pkg.rglob("*.py")}
    try:
        assert private_imports(pkg / "a" / "y.py") == []
        found = private_imports(pkg / "b" / "z.py")
    finally:
        PACKAGE, MODULES = saved
    assert sorted(f.split(" ", 1)[1] for f in found) == [
        "from tianjax.a.x import _h",
        "tianjax.a.x._h",
        "tianjax.a.x._h",
    ]
