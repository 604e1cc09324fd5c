"""Every Sphinx-style cross-reference in the package's docstrings and comments (``:func:`...```, ``:mod:``,
``:class:``, ``:data:``, ``:attr:``) names something that exists: a dotted name resolved from the top (``cupy_dash.x.y``,
``numpy.z``) or from the module that holds the reference. Modules whose optional dependency (torch, jax,
transformers) is missing here are skipped. CPU only."""
from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted([*(ROOT / "cupy_dash").rglob("*.py"), *(ROOT / "cupy_dash").rglob("*.pyx")])
REFERENCE = re.compile(r":(?:func|mod|class|data|attr):`~?([A-Za-z_][\w.]*)`")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


OPTIONAL = ("torch", "jax", "jaxlib", "transformers")    # not installed in CI: what needs them is not checked there


def _resolves(dotted: str, home) -> bool:
    """Whether ``dotted`` names something: the longest importable prefix, then attributes, else attributes of
    ``home``. True, unchecked, where only a missing optional dependency stands in the way."""
    parts = dotted.split(".")
    try:
        for i in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ImportError as e:
                if e.name in OPTIONAL:
                    return True
                continue
            try:
                for name in parts[i:]:
                    obj = getattr(obj, name)
                return True
            except AttributeError:
                break
        obj = home
        for name in parts:
            obj = getattr(obj, name)
        return True
    except AttributeError:
        return False
    except ImportError as e:                       # a package's lazy attribute that imports an adapter
        if e.name in OPTIONAL:
            return True
        raise


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_cross_references_name_something(path):
    refs = set(REFERENCE.findall(path.read_text()))
    if not refs:
        return
    try:
        home = importlib.import_module(_module_name(path))
    except ImportError as e:
        if e.name in OPTIONAL:
            pytest.skip(f"{e.name} is not installed")
        raise
    unresolved = sorted(r for r in refs if not _resolves(r, home))
    assert not unresolved, f"{path.relative_to(ROOT)}: references that name nothing: {unresolved}"
