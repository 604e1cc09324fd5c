"""benchmarks/dsmem_exchange.py without a GPU: its cluster kernel compiles for sm_90a with NVRTC, without spills, and
a buffer size that shared memory cannot hold is refused before anything is compiled."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "dsmem_exchange.py"


def test_the_kernel_compiles_without_spills():
    run = subprocess.run([sys.executable, str(BENCH), "--compile-only"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "no spills" in run.stdout


def test_buffers_beyond_shared_memory_are_refused():
    run = subprocess.run([sys.executable, str(BENCH), "--compile-only", "--kb", "128"], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 2 and "--kb" in run.stderr
