"""tests/conftest.py shares the cores between pytest-xdist workers: with ``-n N`` each worker's BLAS thread count
(OPENBLAS_NUM_THREADS, OMP_NUM_THREADS, MKL_NUM_THREADS) is the cores over N, at least 1, unless the caller set it;
without workers nothing is set. CPU only (runs pytest on a generated test file with the root conftest's hooks)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CONFTEST = f"""
import importlib.util
spec = importlib.util.spec_from_file_location("dash_root_conftest", {str(ROOT / "tests" / "conftest.py")!r})
root = importlib.util.module_from_spec(spec)
spec.loader.exec_module(root)
pytest_addoption, pytest_configure = root.pytest_addoption, root.pytest_configure
"""

PROBE = """
import os


def test_probe():
    name = os.environ.get("PYTEST_XDIST_WORKER", "controller")
    values = [os.environ.get(v, "unset") for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")]
    with open(os.path.join(os.environ["PROBE_DIR"], name), "w") as f:
        f.write(" ".join(values))
"""


def _run(tmp_path, args, **env_vars) -> dict:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_probe.py").write_text(PROBE)
    out = tmp_path / "out"
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS",
                                                          "MKL_NUM_THREADS", "PYTEST_XDIST_WORKER",
                                                          "PYTEST_ADDOPTS")}
    env.update(PROBE_DIR=str(out), **env_vars)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, "test_probe.py"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    return {p.name: p.read_text().split() for p in out.iterdir()}


def _cores():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def test_workers_get_the_cores_over_n(tmp_path):
    pytest.importorskip("xdist")
    seen = _run(tmp_path, ["-n", "2"])
    (values,) = seen.values()
    assert next(iter(seen)).startswith("gw")
    assert values == [str(max(1, _cores() // 2))] * 3


def test_a_value_the_caller_set_is_kept(tmp_path):
    pytest.importorskip("xdist")
    (values,) = _run(tmp_path, ["-n", "2"], OPENBLAS_NUM_THREADS="97").values()
    assert values[0] == "97" and values[1:] == [str(max(1, _cores() // 2))] * 2


def test_the_workers_that_run_count_not_the_ones_asked_for(tmp_path):
    pytest.importorskip("xdist")
    assert _run(tmp_path, ["-n", "8", "--maxprocesses", "1"]) == {"gw0": ["unset"] * 3}   # one worker runs


@pytest.mark.parametrize("args", [[], ["-n", "0"], ["-n", "1"], ["-p", "no:xdist"]],
                         ids=["no-option", "n0", "n1", "no-xdist"])
def test_nothing_is_set_without_two_workers(tmp_path, args):
    if args[:1] == ["-n"]:
        pytest.importorskip("xdist")
    seen = _run(tmp_path, args)
    assert list(seen.values()) == [["unset"] * 3]
