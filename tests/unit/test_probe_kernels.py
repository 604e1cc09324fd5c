"""The probe kernels of benchmarks/ (dq_reduce_bw.py, dsmem_exchange.py, gemm_chain.py) without a GPU: each compiles
for sm_90a with NVRTC without spills (benchmarks/measure.py's compile_probe), and the first two refuse, before
compiling, a size that shared memory cannot hold."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
# script -> (arguments that ask for more shared memory than a CTA gets, the option the error names)
PROBES = {"dq_reduce_bw.py": (["--chunk-kb", "64", "--in-flight", "4"], "shared memory"),
          "dsmem_exchange.py": (["--kb", "128"], "--kb")}


def _run(script, *args):
    return subprocess.run([sys.executable, str(BENCHMARKS / script), "--compile-only", *args], capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("script", [*sorted(PROBES), "gemm_chain.py"])
def test_the_kernel_compiles_without_spills(script):
    run = _run(script)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "no spills" in run.stdout


@pytest.mark.parametrize("script", sorted(PROBES))
def test_sizes_beyond_shared_memory_are_refused_before_compiling(script):
    args, named = PROBES[script]
    run = _run(script, *args)
    assert run.returncode == 2 and named in run.stderr, run.stderr[-500:]


def test_dq_reduce_bw_refuses_in_flight_counts_it_has_no_instance_for():
    run = _run("dq_reduce_bw.py", "--in-flight", "3")
    assert run.returncode == 2 and "--in-flight" in run.stderr

