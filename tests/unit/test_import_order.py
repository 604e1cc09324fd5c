"""Imports that do not depend on their order, and a package that a folder cannot shadow. CPU only.

The reported failure: run from the folder that holds a clone of this repository under git's default name
(``cupy_dash``), ``python -m cupy_dash`` took the clone for a namespace package, so the package's ``__init__``
never ran, the editable install supplied the submodules, and the first of them imported, ``cupy_dash.compact``
(now ``cupy_dash.schedule.compact``), died in the compact <-> schedule import cycle (``ImportError: cannot
import name 'CompactSchedule' from partially initialized module 'cupy_dash.compact'``).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import cupy_dash

PKG = Path(cupy_dash.__file__).resolve().parent
ROOT = PKG.parent
SMALL = ["--seqlen-q", "256", "--heads", "2", "--num-sms", "4"]
# The import graph itself (no cycles, layers) is checked by test_import_layers.py.


def run(args, cwd, **kw):
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=300, **kw)


@pytest.mark.parametrize("module", ["schedule.compact", "schedule.auto", "schedule.varlen", "schedule",
                                    "schedule.compact_device", "varlen_schedule", "cli.schedule"])
def test_each_schedule_module_imports_first_without_the_package_init(module):
    """What the shadowed run did: the package's __init__ never runs, ``module`` is the first one imported."""
    code = f"""
        import sys, types
        package = types.ModuleType("cupy_dash")
        package.__path__ = [{str(PKG)!r}]
        sys.modules["cupy_dash"] = package              # a bare package: its __init__ does not run
        import cupy_dash.{module}
        from cupy_dash.schedule import (CompactSchedule, VarlenSchedule, build, build_compact, build_varlen,
                                        expand)
        plan = build_compact("shift", seqlen_q=512, seqlen_k=512, block_m=64, block_n=128, num_heads=2,
                             causal=False, num_sms=4).validate()
        assert isinstance(plan, CompactSchedule) and len(expand(plan)[1]) == plan.num_visits
        assert issubclass(VarlenSchedule, sys.modules["cupy_dash.schedule.compact"].ColumnRecords)
        assert callable(build_varlen)
    """
    proc = run(["-c", textwrap.dedent(code)], cwd=ROOT)
    assert proc.returncode == 0, proc.stderr


def test_schedule_names_of_the_compact_and_varlen_modules():
    from cupy_dash import schedule, varlen_schedule
    from cupy_dash.schedule import auto, compact, per_visit, varlen
    assert schedule.CompactSchedule is compact.CompactSchedule and schedule.expand is compact.expand
    assert schedule.build_compact is auto.build_compact
    assert schedule.VarlenSchedule is varlen.VarlenSchedule is varlen_schedule.VarlenSchedule
    assert schedule.build_varlen is varlen.build_varlen is varlen_schedule.build_varlen
    assert varlen_schedule.expand is varlen.expand and varlen_schedule.RANK_ASC_N == varlen.RANK_ASC_N
    assert schedule.build is auto.build and schedule.Schedule is per_visit.Schedule
    assert set(schedule.__all__) <= set(dir(schedule))
    assert {"CompactSchedule", "build_compact", "expand", "VarlenSchedule", "build_varlen"} <= set(dir(schedule))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        schedule.nope


@pytest.fixture
def clone_folder(tmp_path):
    """A folder holding a directory ``cupy_dash`` shaped like a clone of this repository (no __init__.py at its
    top): what shadows the installed package when Python runs from the folder."""
    clone = tmp_path / "cupy_dash"
    clone.mkdir()
    for name in ("README.md", "setup.py", "setup.cfg", "pyproject.toml"):
        shutil.copy(ROOT / name, clone / name)
    shutil.copytree(ROOT / "kernels_src", clone / "kernels_src")
    (clone / "cupy_dash").mkdir()                      # the clone's package folder, not built
    (clone / "cupy_dash" / "__init__.py").write_text("raise ImportError('the clone was imported')\n")
    return tmp_path


def test_python_m_cupy_dash_from_a_folder_holding_a_clone(clone_folder):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    shadowed = run(["-c", "import cupy_dash; print(cupy_dash.__file__)"], cwd=clone_folder, env=env)
    # With an editable install (the README's), Python takes the clone for a namespace package (__file__ None);
    # an installed copy in site-packages is a regular package and wins over it.
    assert shadowed.returncode == 0 and shadowed.stdout.strip() in ("None", str(PKG / "__init__.py")), shadowed
    for args, expect in ((["--help"], "usage: python -m cupy_dash"), (["--version"], "cupy_dash "),
                         (["schedule", *SMALL], "auto picks"), (["compile", "--help"], "--jobs")):
        proc = run(["-m", "cupy_dash", *args], cwd=clone_folder, env=env)
        assert proc.returncode == 0 and expect in proc.stdout, (args, proc.stderr)
    # the run puts the installed package, __init__ run, in the clone's place (the demo calls cupy_dash.attention_*)
    code = """
        import runpy, sys
        installed = sys.argv[1]
        sys.argv = ["cupy_dash", "--version"]
        try:
            runpy.run_module("cupy_dash", run_name="__main__", alter_sys=True)
        except SystemExit as exit_:
            assert exit_.code == 0, exit_.code
        import cupy_dash
        assert cupy_dash.__file__ == installed, (cupy_dash.__file__, cupy_dash.__path__)
        assert callable(cupy_dash.attention_forward) and cupy_dash.schedule.build_compact
    """
    proc = run(["-c", textwrap.dedent(code), str(PKG / "__init__.py")], cwd=clone_folder, env=env)
    assert proc.returncode == 0, proc.stderr
