"""``python -m cupy_dash --help`` (and every command's ``--help``) answers without importing the heavy modules:
ml_dtypes alone took 1.2 s of a 1.8 s ``--help``. Checked by what the interpreter imports (``-X importtime``
lists every module), not by the clock. CPU only.
"""
from __future__ import annotations

import subprocess
import sys

import pytest

import cupy_dash

HEAVY = ("ml_dtypes", "cupy", "cupyx", "cuda", "matplotlib", "jax", "torch", "scipy")


def imported_by(args) -> set:
    """The top-level modules that ``python ARGS`` imports, from its ``-X importtime`` report."""
    proc = subprocess.run([sys.executable, "-X", "importtime", *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("import time:")]
    assert len(lines) > 10, proc.stderr[-2000:]                           # the report is there
    return {line.rsplit("|", 1)[1].strip().split(".")[0] for line in lines}


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["compile", "--help"], ["schedule", "--help"],
                                  ["demo", "--help"]], ids=" ".join)
def test_help_imports_no_heavy_module(argv):
    modules = imported_by(["-m", "cupy_dash", *argv])
    assert "cupy_dash" in modules
    assert not modules & set(HEAVY), sorted(modules & set(HEAVY))


def test_import_cupy_dash_imports_nothing_heavy():
    modules = imported_by(["-c", "import cupy_dash"])
    assert not modules & {*HEAVY, "numpy"}, sorted(modules & {*HEAVY, "numpy"})


def test_the_public_names_are_there_on_first_access():
    from cupy_dash import reference, schedule
    from cupy_dash.core import api, varlen
    assert cupy_dash.attention_forward is api.attention_forward and cupy_dash.check_errors is api.check_errors
    assert cupy_dash.attention_backward_varlen is varlen.attention_backward_varlen
    assert cupy_dash.schedule is schedule and cupy_dash.reference is reference
    for name in cupy_dash.__all__:
        assert getattr(cupy_dash, name) is not None
    assert set(cupy_dash.__all__) <= set(dir(cupy_dash))
    from cupy_dash import attention, prepare_varlen_backward     # noqa: F401  (from-imports too)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        cupy_dash.nope
    with pytest.raises(AttributeError):
        cupy_dash.__wrapped__
