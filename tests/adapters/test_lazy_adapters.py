"""``cupy_dash.torch`` and ``cupy_dash.jax`` are attributes of the package, imported on first access (the
README writes ``cupy_dash.jax.attention(...)`` after a plain ``import cupy_dash``), while ``import cupy_dash``
itself imports neither framework. Each check runs in a fresh interpreter, so that no earlier import hides a
missing attribute; no GPU needed.
"""
from __future__ import annotations

import importlib.util

import pytest

import cupy_dash

from fresh_interpreter import run


def test_adapter_is_imported_on_first_attribute_access():
    # a stand-in for JAX with just what cupy_dash/jax/__init__.py uses at import time, so this runs without JAX
    run("""
        import sys, types
        import cupy_dash
        assert "cupy_dash.jax" not in sys.modules and "jax" not in sys.modules
        stub = types.ModuleType("jax")
        class custom_vjp:
            def __init__(self, fun, nondiff_argnums=()):
                self.fun = fun
            def defvjp(self, fwd, bwd, symbolic_zeros=False):
                self.fwd, self.bwd = fwd, bwd
        stub.custom_vjp = custom_vjp
        stub.jit = lambda fun, **options: fun
        sys.modules["jax"] = stub
        adapter = cupy_dash.jax                      # no "import cupy_dash.jax" anywhere
        assert adapter is sys.modules["cupy_dash.jax"]
        assert callable(cupy_dash.jax.attention)
        assert "cupy_dash.torch" not in sys.modules  # only the adapter asked for
    """)


def test_missing_framework_raises_module_not_found():
    run("""
        import sys
        sys.modules["torch"] = None                  # torch is "not installed" (import raises)
        import cupy_dash
        try:
            cupy_dash.torch
        except ModuleNotFoundError as e:
            assert "torch" in str(e), e
        else:
            raise AssertionError("cupy_dash.torch imported without torch")
        assert "cupy_dash.torch" not in sys.modules
    """)


def test_unknown_attribute_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'tensorflow'"):
        cupy_dash.tensorflow  # noqa: B018
    assert not hasattr(cupy_dash, "keras")


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_readme_usage_without_explicit_import(framework):
    if importlib.util.find_spec(framework) is None:
        pytest.skip(f"{framework} is not installed")
    run(f"""
        import sys
        import cupy_dash
        assert "{framework}" not in sys.modules
        assert callable(cupy_dash.{framework}.attention)
        assert sys.modules["cupy_dash.{framework}"] is cupy_dash.{framework}
    """)
