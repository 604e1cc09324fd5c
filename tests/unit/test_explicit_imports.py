"""Every dotted use of a cupy_dash submodule (``cupy_dash.core.api.NP_DTYPES``) in the tests, benchmarks and
examples is backed by an import of that submodule in the same file, or by its package importing it: a file that
works only because another module happened to import the submodule first fails when run alone (as a GPU test file
once did). Read from the source (AST, no import); CPU only.
"""
from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "cupy_dash"
FILES = sorted(p for d in ("tests", "benchmarks", "examples") for p in (ROOT / d).rglob("*.py"))


def _is_module(dotted: str) -> bool:
    path = ROOT.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or path.with_suffix(".pyx").is_file() or path.is_dir()


def _imported_by_package(parent: str, name: str) -> bool:
    """Whether ``parent``'s ``__init__.py`` imports its submodule ``name`` at module level, or imports any submodule
    on first access (a module ``__getattr__`` that calls ``importlib.import_module``, as ``cupy_dash``'s does)."""
    init = ROOT.joinpath(*parent.split("."), "__init__.py")
    if not init.is_file():
        return False
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.FunctionDef) and node.name == "__getattr__" and any(   # imports any submodule
                isinstance(c, ast.Attribute) and c.attr == "import_module" for c in ast.walk(node)):
            return True
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module in (None, name):
            if node.module == name or any(a.name == name for a in node.names):
                return True
        if isinstance(node, ast.Import) and any(a.name == f"{parent}.{name}" for a in node.names):
            return True
    return False


def _imports(tree: ast.AST) -> set[str]:
    """The dotted modules a file imports (``import a.b.c`` also makes ``a.b`` and ``a`` available)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                out.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def _dotted_uses(tree: ast.AST) -> set[str]:
    """Every ``cupy_dash.x.y...`` attribute chain, as its longest prefix that names a module."""
    uses = set()
    for node in ast.walk(tree):
        chain, cur = [], node
        while isinstance(cur, ast.Attribute):
            chain.append(cur.attr)
            cur = cur.value
        if not (isinstance(cur, ast.Name) and cur.id == "cupy_dash" and len(chain) >= 2):
            continue
        parts = ["cupy_dash"] + chain[::-1]
        for i in range(len(parts), 2, -1):
            if _is_module(".".join(parts[:i])):
                uses.add(".".join(parts[:i]))
                break
    return uses


def _missing(tree: ast.AST) -> list[str]:
    """The submodules a file reaches by a dotted chain without importing them (nor their package doing so)."""
    imported = _imports(tree)
    missing = []
    for use in sorted(_dotted_uses(tree)):
        parts = use.split(".")
        for i in range(2, len(parts) + 1):   # every submodule along the chain must be imported by someone
            mod = ".".join(parts[:i])
            if mod not in imported and not _imported_by_package(".".join(parts[:i - 1]), parts[i - 1]):
                missing.append(mod)
                break
    return missing


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_dotted_submodule_uses_are_imported(path):
    missing = _missing(ast.parse(path.read_text()))
    assert not missing, f"{path.relative_to(ROOT)} uses {missing} without importing them"


def test_the_check_sees_the_form_that_failed():
    bad = "import cupy_dash\nx = cupy_dash.core.api.NP_DTYPES\n"
    assert _missing(ast.parse(bad)) == ["cupy_dash.core.api"]
    assert _missing(ast.parse("import cupy_dash.core.api\n" + bad)) == []
    assert _missing(ast.parse("from cupy_dash.core import api\n" + bad)) == []
