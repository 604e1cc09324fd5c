"""The package's import contract, read from the source (AST, no import): layers import downward only, and the
modules form no import cycle.

Layers, top to bottom: the command line (``__main__``, ``cli_*``), the framework adapters (torch, JAX, Hugging
Face transformers and the framework-neutral ``cupy_dash.attention``), and the core (everything else: the functional
API, launches, kernels, schedules). The core never imports an adapter or the command line, not even inside a
function; an adapter never imports the command line. Module-level imports form no cycle. An import inside a function may
close a cycle only where it is one of ``FACADE_IMPORTS``: each is a deliberate late binding, named here so that
the list can only shrink. Modules are named by their dotted names under ``cupy_dash`` (a package by its
``__init__.py``); the Cython modules take part through their ``import`` and ``cimport`` lines. CPU only.
"""
from __future__ import annotations

import ast
import functools
import pathlib
import re

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "cupy_dash"

ADAPTERS = {"torch", "jax", "differentiable", "transformers"}

# (importer, imported): imports inside functions that close a cycle, each a late binding on purpose.
FACADE_IMPORTS = {
    # auto's choice and the per-visit table's size check use the column model of the compact records, which are
    # built from the per-visit module's argument checks and models
    ("cupy_dash.schedule.per_visit", "cupy_dash.schedule.compact"),
    # a torch new packing reuses varlen's checks and launch builder
    ("cupy_dash.core.fastpath_varlen", "cupy_dash.core.varlen"),
    # the C handler is a mechanism picked per call, loaded on use
    ("cupy_dash.jax.ops", "cupy_dash.jax._ffi"),
}

_CYTHON_IMPORT = re.compile(r"^(?:from\s+([\w.]+)\s+c?import|c?import\s+([\w.]+))", re.M)


@functools.lru_cache(maxsize=1)
def _sources() -> dict:
    """Dotted module name (``cupy_dash``, ``cupy_dash.core.api``, ...) -> its source file: every .py and .pyx
    module, and the .pxd files that have no .pyx (cimported only)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*")):
        if path.suffix not in (".py", ".pyx", ".pxd") or "__pycache__" in path.parts:
            continue
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if path.suffix != ".pxd" or name not in found:
            found[name] = path
    return found


def _modules() -> list[str]:
    return sorted(_sources())


def _is_package(module: str) -> bool:
    return _sources()[module].name == "__init__.py"


def _resolve(dotted: str) -> list[str]:
    """The package's modules that importing ``dotted`` (an absolute name) runs: the module and the packages
    above it, innermost first ([] outside cupy_dash)."""
    parts = dotted.split(".")
    return [n for n in (".".join(parts[:i]) for i in range(len(parts), 0, -1)) if n in _sources()]


def _targets(module: str, node) -> list[str]:
    """The modules that the import statement ``node`` in ``module`` runs (``from p import m``: the module p.m
    where there is one, else the names are p's)."""
    if isinstance(node, ast.Import):
        return [t for a in node.names for t in _resolve(a.name)]
    if node.level:
        here = module.split(".")
        base = here if _is_package(module) else here[:-1]
        base = base[:len(base) - (node.level - 1)]
        stem = ".".join(base + ([node.module] if node.module else []))
    else:
        stem = node.module
    return [t for a in node.names for t in _resolve(f"{stem}.{a.name}")] + _resolve(stem)


def _imports(module: str) -> tuple[set, set]:
    """(module-level, in-function) imports of other cupy_dash modules by ``module``, including the packages that
    an import runs on the way (``cupy_dash.a.b`` runs ``cupy_dash.a``), less ``module``'s own packages."""
    path = _sources()[module]
    own = set(_resolve(module))
    top, late = set(), set()
    if path.suffix != ".py":
        text = path.read_text()
        for match in _CYTHON_IMPORT.finditer(text):
            top.update(_resolve(match.group(1) or match.group(2)))
        return top - own, set()

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                (late if inner else top).update(_targets(module, child))
            visit(child, inner)

    visit(ast.parse(path.read_text()), False)
    return top - own, late - top - own


def _cycles(edges: dict) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def connect(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return found


def _layer(module: str) -> int:
    name = module.split(".")[1] if "." in module else ""
    if name in ("__main__", "cli"):
        return 2
    return 1 if name in ADAPTERS else 0


def test_the_graph_sees_every_kind_of_import():
    assert {"cupy_dash", "cupy_dash.core.api", "cupy_dash.schedule", "cupy_dash.schedule._heap"} <= set(_modules())
    assert "cupy_dash.schedule._schedule" in _imports("cupy_dash.schedule.per_visit")[0]
    assert "cupy_dash.schedule._heap" in _imports("cupy_dash.schedule._schedule")[0]
    assert "cupy_dash.schedule.compact" in _imports("cupy_dash.schedule.per_visit")[1]
    assert "cupy_dash.schedule" in _imports("cupy_dash.cuda.device_tables")[0]           # the package, on the way
    assert "cupy_dash.cli.schedule" in _imports("cupy_dash.__main__")[1]


def test_adapters_listed_exist():
    assert {f"cupy_dash.{m}" for m in ADAPTERS} <= set(_modules())
    assert {m for pair in FACADE_IMPORTS for m in pair} <= set(_modules())


def test_imports_go_downward():
    upward = []
    for module in _modules():
        top, late = _imports(module)
        upward += [f"{module} -> {dep}" for dep in sorted(top | late) if _layer(dep) > _layer(module)]
    assert not upward, "imports from a lower layer to a higher one: " + ", ".join(upward)


def test_no_import_cycle_at_module_level():
    assert _cycles({m: _imports(m)[0] for m in _modules()}) == []


def test_late_imports_close_no_other_cycle():
    edges = {}
    for module in _modules():
        top, late = _imports(module)
        edges[module] = top | {dep for dep in late if (module, dep) not in FACADE_IMPORTS}
    assert _cycles(edges) == []


def test_facade_imports_are_still_needed():
    """A facade import that no longer closes a cycle (or no longer exists) leaves the list."""
    for importer, imported in FACADE_IMPORTS:
        assert imported in _imports(importer)[1], f"{importer} no longer imports {imported} late"
        edges = {m: set().union(*_imports(m)) for m in _modules()}
        assert any(importer in c and imported in c for c in _cycles(edges)), \
            f"{importer} -> {imported} closes no cycle: remove it from FACADE_IMPORTS"
