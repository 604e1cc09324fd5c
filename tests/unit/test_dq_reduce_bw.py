"""benchmarks/dq_reduce_bw.py without a GPU: its kernel compiles for sm_90a with NVRTC, without spills, and its
command line parses as documented."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "dq_reduce_bw.py"


def test_the_kernel_compiles_without_spills():
    run = subprocess.run([sys.executable, str(BENCH), "--compile-only"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "no spills" in run.stdout


def test_in_flight_counts_outside_the_kernels_instances_are_refused():
    run = subprocess.run([sys.executable, str(BENCH), "--compile-only", "--in-flight", "3"], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 2 and "--in-flight" in run.stderr


def test_staging_beyond_shared_memory_is_refused_before_compiling():
    run = subprocess.run([sys.executable, str(BENCH), "--compile-only", "--chunk-kb", "64", "--in-flight", "4"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "shared memory" in run.stderr
