"""The package's import contract, read from the source (AST, no import): layers import downward only, the modules
form no import cycle, and no module uses a private name of another subpackage.

A *unit* is a subpackage of cupy_dash (``cupy_dash.core``, with everything in it) or a module at the package's top
(``cupy_dash.config``; ``__init__`` is the package's own). ``LAYERS`` lists the units layer by layer, top first:
the ``__main__`` entry point, the command line, the public facade (``cupy_dash``'s lazy names,
``cupy_dash.attention``, which hands torch and JAX inputs to their adapters, and the public name
``cupy_dash.varlen_schedule``), the transformers adapter (built on the torch adapter), the torch and JAX adapters,
the core (the functional API), cuda (kernels, launches, device tables, error records), the schedules (host only),
and the base modules that every layer may use (configuration, the GPU probe, the float64 reference, the version).

The rules:

* an import from one unit to another goes to a lower layer, at module level and inside functions alike (two units
  of one layer never import each other; imports inside a unit are free, as long as they form no cycle);
* module-level imports form no cycle; an import inside a function may close one only where it is one of
  ``FACADE_IMPORTS``: each is a deliberate late binding, named here so that the list can only shrink;
* a private name (one leading underscore) is used only inside the package that defines it: a module's private
  names and private modules by the modules of its own subpackage (the top-level package's by all), whether
  imported (``from ..core.api import _validate``) or reached through a module (``api._validate``).

Modules are named by their dotted names (a package by its ``__init__.py``); importing ``cupy_dash.a.b`` also runs
``cupy_dash.a``, and the graph has that edge too. The Cython modules take part through their ``import`` and
``cimport`` lines. CPU only.
"""
from __future__ import annotations

import ast
import functools
import pathlib
import re

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "cupy_dash"

LAYERS = [                                              # top first: (layer, its units)
    ("entry point", {"__main__"}),
    ("command line", {"cli"}),
    ("public facade", {"__init__", "differentiable", "varlen_schedule"}),
    ("transformers adapter", {"transformers"}),
    ("framework adapters", {"torch", "jax"}),
    ("core", {"core"}),
    ("cuda", {"cuda"}),
    ("schedule", {"schedule"}),
    ("base", {"_version", "config", "gpu", "reference"}),
]

# (importer, imported): imports inside functions that close a cycle, each a late binding on purpose (none now).
FACADE_IMPORTS: set[tuple[str, str]] = set()

_CYTHON_IMPORT = re.compile(r"^(?:from\s+([\w.]+)\s+c?import\s+(\([^)]*\)|[^\n#]*)|c?import\s+([\w.]+))", re.M)


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


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _layer(module: str) -> int:
    return next(i for i, (_, units) in enumerate(LAYERS) if _unit(module) in units)


def _resolve(dotted: str) -> list[str]:
    """The package's modules that importing ``dotted`` (an absolute name) runs: the module and the packages
    above it, innermost first ([] outside cupy_dash)."""
    parts = dotted.split(".")
    return [n for n in (".".join(parts[:i]) for i in range(len(parts), 0, -1)) if n in _sources()]


def _stem(module: str, node: ast.ImportFrom) -> str:
    """The absolute name of the module that ``node`` (in ``module``) imports from."""
    if not node.level:
        return node.module
    base = module.split(".")
    base = base if _is_package(module) else base[:-1]
    return ".".join(base[:len(base) - (node.level - 1)] + ([node.module] if node.module else []))


def _targets(module: str, node) -> list[str]:
    """The modules that the import statement ``node`` in ``module`` runs (``from p import m``: the module p.m
    where there is one, else the names are p's)."""
    if isinstance(node, ast.Import):
        return [t for a in node.names for t in _resolve(a.name)]
    stem = _stem(module, node)
    return [t for a in node.names for t in _resolve(f"{stem}.{a.name}")] + _resolve(stem)


def _cython_imports(module: str) -> list[tuple[str, list[str]]]:
    """(module imported from, names) of every module-level import / cimport line of a Cython source."""
    found = []
    for match in _CYTHON_IMPORT.finditer(_sources()[module].read_text()):
        names = re.findall(r"\w+", match.group(2) or "")
        found.append((match.group(1) or match.group(3), names))
    return found


@functools.lru_cache(maxsize=None)
def _imports(module: str) -> tuple[set, set]:
    """(module-level, in-function) imports of other cupy_dash modules by ``module``, including the packages that
    an import runs on the way (``cupy_dash.a.b`` runs ``cupy_dash.a``), less ``module``'s own packages."""
    path = _sources()[module]
    own = set(_resolve(module))
    top, late = set(), set()
    if path.suffix != ".py":
        for stem, _ in _cython_imports(module):
            top.update(_resolve(stem))
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


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _visible(owner: str, importer: str) -> bool:
    """Whether a private name of module ``owner`` (or the private module ``owner`` itself, with ``owner`` then
    its package) may be used by ``importer``: only inside the package that holds it."""
    package = owner if owner in _sources() and _is_package(owner) else owner.rsplit(".", 1)[0]
    return importer == package or importer.startswith(package + ".")


def _private_uses(module: str) -> list[str]:
    """Every private name of another package that ``module`` uses: imported, reached through an imported module,
    or a private module on the way."""
    found = []

    def check_path(dotted):
        parts = dotted.split(".")
        for i, part in enumerate(parts[1:], 1):
            owner = ".".join(parts[:i])
            if _private(part) and not _visible(owner, module):
                found.append(f"{owner}.{part}")

    if _sources()[module].suffix != ".py":
        for stem, names in _cython_imports(module):
            check_path(stem)
            found.extend(f"{stem}.{n}" for n in names if _private(n) and not _visible(stem, module))
        return found
    aliases = {}                                       # local name -> the cupy_dash module bound to it
    tree = ast.parse(_sources()[module].read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "cupy_dash":
                    check_path(a.name)
                    if a.asname:
                        aliases[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom):
            stem = _stem(module, node)
            if stem.split(".")[0] != "cupy_dash":
                continue
            check_path(stem)
            for a in node.names:
                if f"{stem}.{a.name}" in _sources():
                    check_path(f"{stem}.{a.name}")
                    aliases[a.asname or a.name] = f"{stem}.{a.name}"
                elif _private(a.name) and not _visible(stem, module):
                    found.append(f"{stem}.{a.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            owner = aliases[node.value.id]
            if _private(node.attr) and not _visible(owner, module):
                found.append(f"{owner}.{node.attr}")
    return sorted(set(found))


def test_the_graph_sees_every_kind_of_import():
    assert {"cupy_dash", "cupy_dash.core.api", "cupy_dash.schedule", "cupy_dash.schedule._heap"} <= set(_modules())
    assert "cupy_dash.schedule._schedule" in _imports("cupy_dash.schedule.per_visit")[0]
    assert "cupy_dash.schedule._heap" in _imports("cupy_dash.schedule._schedule")[0]
    assert "cupy_dash.config" in _imports("cupy_dash.schedule.auto")[1]
    assert "cupy_dash.cli.schedule" in _imports("cupy_dash.__main__")[1]
    assert "cupy_dash.schedule" in _imports("cupy_dash.cuda.device_tables")[0]           # the package, on the way
    assert "cupy_dash.core.api" in _imports("cupy_dash.torch.ops")[0]


def test_the_private_name_check_sees_every_kind_of_use():
    assert not _visible("cupy_dash.core.api", "cupy_dash.torch.ops")
    assert _visible("cupy_dash.core.api", "cupy_dash.core.varlen")
    assert _visible("cupy_dash.schedule", "cupy_dash.schedule.compact")             # a package's own names
    assert _visible("cupy_dash", "cupy_dash.cuda.jit")                              # cupy_dash._version
    assert not _visible("cupy_dash.jax", "cupy_dash.differentiable")               # cupy_dash.jax._ffi


def test_every_module_is_in_one_layer():
    units = [unit for _, layer in LAYERS for unit in layer]
    assert len(units) == len(set(units)), "a unit is listed in two layers"
    found = {_unit(m) for m in _modules()}
    assert found == set(units), f"not in LAYERS: {sorted(found - set(units))}; gone: {sorted(set(units) - found)}"
    assert {m for pair in FACADE_IMPORTS for m in pair} <= set(_modules())


def test_imports_go_downward():
    upward = []
    for module in _modules():
        top, late = _imports(module)
        upward += [f"{module} -> {dep}" for dep in sorted(top | late)
                   if _unit(dep) != _unit(module) and _layer(dep) <= _layer(module)]
    assert not upward, "imports that do not go to a lower layer: " + ", ".join(upward)


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


def test_the_schedules_need_no_gpu():
    """The schedule layer is host only (``python -m cupy_dash schedule`` runs without a GPU): none of its modules
    imports CuPy or a framework, not even inside a function."""
    heavy = {"cupy", "cupyx", "cuda", "torch", "jax", "jaxlib", "transformers"}
    found = []
    for module in _modules():
        if _unit(module) != "schedule":
            continue
        if _sources()[module].suffix != ".py":
            found += [f"{module} -> {stem}" for stem, _ in _cython_imports(module) if stem.split(".")[0] in heavy]
            continue
        for node in ast.walk(ast.parse(_sources()[module].read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            found += [f"{module} -> {name}" for name in names if name.split(".")[0] in heavy]
    assert not found, found


def test_no_private_name_of_another_package():
    used = {module: _private_uses(module) for module in _modules()}
    used = {module: names for module, names in used.items() if names}
    assert not used, "private names used outside their package: " + "; ".join(
        f"{module}: {', '.join(names)}" for module, names in sorted(used.items()))
