"""The package's import contract, read from the source (AST, no import): layers import downward only, and the
modules form no import cycle.

Layers, top to bottom: the command line (``__main__``, ``cli_*``), the framework adapters (torch, JAX, Hugging
Face transformers and the framework-neutral ``cupy_dash.attention``), and the core (everything else: the functional
API, launches, kernels, schedules). The core never imports an adapter or the command line, not even inside a
function; an adapter never imports the command line. Module-level imports form no cycle. An import inside a function may
close a cycle only where it is one of ``FACADE_IMPORTS``: each is a deliberate late binding, named here so that
the list can only shrink. CPU only.
"""
from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "cupy_dash"

ADAPTERS = {"torch", "torch_ops", "torch_varlen", "jax", "jax_ops", "jax_varlen", "jax_varlen_dyn", "_jax_ffi",
            "differentiable", "transformers"}

# (importer, imported): imports inside functions that close a cycle, each a late binding on purpose.
FACADE_IMPORTS = {
    ("schedule", "compact"),          # schedule re-exports the compact builders (CompactSchedule, build_compact)
    ("portable", "schedule"),         # portable checks its plan argument with schedule's checker
    ("fastpath_varlen", "varlen"),    # a torch new packing reuses varlen's checks and launch builder
    ("jax_ops", "_jax_ffi"),          # the C handler is a mechanism picked per call, loaded on use
}


def _modules() -> list[str]:
    return sorted(p.stem for p in PACKAGE.glob("*.py"))


def _imports(module: str) -> tuple[set, set]:
    """(module-level, in-function) imports of other cupy_dash modules by ``module``."""
    names = set(_modules())
    top, late = set(), set()

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            found = set()
            if isinstance(child, ast.ImportFrom):
                if child.level == 1:
                    found = {child.module.split(".")[0]} if child.module else {a.name for a in child.names}
                elif child.module and child.module.split(".")[0] == "cupy_dash":
                    parts = child.module.split(".")
                    found = {parts[1]} if len(parts) > 1 else {a.name for a in child.names}
            elif isinstance(child, ast.Import):
                found = {a.name.split(".")[1] for a in child.names if a.name.startswith("cupy_dash.")}
            (late if inner else top).update(n for n in found if n in names and n != module)
            visit(child, inner)

    visit(ast.parse((PACKAGE / f"{module}.py").read_text()), False)
    return top, late - top


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
    if module == "__main__" or module.startswith("cli_"):
        return 2
    return 1 if module in ADAPTERS else 0


def test_adapters_listed_exist():
    assert ADAPTERS <= set(_modules())
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
