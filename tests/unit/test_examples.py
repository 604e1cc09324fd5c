"""The examples' scripts, run here (no GPU) as a user would: one line on stderr naming what is missing (the GPU,
and the framework where it is not installed) and exit status 1, not a traceback. Each run stops before its
framework is imported (examples/preflight.py), so this takes about a second per script."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from cupy_dash import gpu

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SCRIPTS = sorted(p.name for p in EXAMPLES.glob("*.py") if '__name__ == "__main__"' in p.read_text())
FRAMEWORK = {"finetune_transformers.py": "torch", "train_data_parallel.py": "torch",
             "train_jax_dp.py": "jax", "train_tiny_transformer.py": "torch", "train_tiny_transformer_jax.py": "jax"}
MODULES = {"finetune_transformers.py": ("transformers",)}     # what else a script imports (pip names)


def _absent(script):
    """The framework and other modules of ``script`` that cannot be imported here."""
    return [m for m in (FRAMEWORK[script], *MODULES.get(script, ())) if importlib.util.find_spec(m) is None]


def test_every_script_is_covered():
    assert SCRIPTS == sorted(FRAMEWORK)


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_without_a_gpu_says_what_is_missing(script):
    if gpu.state(0)[0] == "hopper":
        pytest.skip("a Hopper GPU is present: the example would train")
    run = subprocess.run([sys.executable, str(EXAMPLES / script), "--steps", "1"], capture_output=True, text=True,
                         timeout=120, cwd=EXAMPLES.parent)
    assert run.returncode == 1 and run.stdout == "", (run.returncode, run.stdout)
    lines = run.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr
    assert lines[0].startswith(f"{script}: cannot run here, it needs an NVIDIA Hopper GPU (sm_90a"), lines[0]
    for module in (FRAMEWORK[script], *MODULES.get(script, ())):
        assert (f"; and {module} (pip install" in lines[0]) == (module in _absent(script)), lines[0]


def _preflight():
    spec = importlib.util.spec_from_file_location("preflight", EXAMPLES / "preflight.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("machine, backend, framework, message", [
    (("hopper", "NVIDIA H200 (sm_90, 132 SMs)"), None, "numpy", None),
    (("hopper", "NVIDIA H200 (sm_90, 132 SMs)"), None, "no_such_framework_here", "needs no_such_framework_here (x)"),
    (("hopper", "NVIDIA H200 (sm_90, 132 SMs)"), "a CUDA build of it", "numpy", "needs a CUDA build of it"),
    (("other", "NVIDIA A100 (sm_80, 108 SMs)"), "never asked", "numpy",
     "needs an NVIDIA Hopper GPU (sm_90a, e.g. H100 / H200) with a CUDA 13 driver (>= 580), found NVIDIA A100 "
     "(sm_80, 108 SMs)"),
], ids=["all-there", "no-framework", "no-backend", "other-gpu"])
def test_preflight_names_each_missing_thing(monkeypatch, machine, backend, framework, message):
    """The branches a machine without a GPU does not reach: a Hopper GPU without the framework or its GPU
    backend, and another GPU (whose framework backend is then not asked about)."""
    monkeypatch.setattr(gpu, "state", lambda device=0: machine)
    monkeypatch.setattr(sys, "argv", ["example.py"])
    require = _preflight().require
    if message is None:
        assert require(framework, "x", lambda: backend) is None
        return
    with pytest.raises(SystemExit) as exc:
        require(framework, "x", lambda: backend)
    assert exc.value.code == f"example.py: cannot run here, it needs {message.removeprefix('needs ')}"


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_needs_no_gpu(script):
    """``--help`` prints the usage without a GPU (where the framework and the script's other modules are installed;
    else the one line naming what is missing, never a traceback)."""
    run = subprocess.run([sys.executable, str(EXAMPLES / script), "--help"], capture_output=True, text=True,
                         timeout=120, cwd=EXAMPLES.parent)
    absent = _absent(script)
    if absent:
        assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr[-500:]
        assert all(f"{m} (pip install" in run.stderr for m in absent), run.stderr
    else:
        assert run.returncode == 0 and "usage:" in run.stdout, (run.returncode, run.stderr[-500:])
