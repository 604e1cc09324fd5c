"""benchmarks/ncu_legs.sh (Nsight Compute of the backward beside patched copies, on the GPU machine), legs_bits.sh
(the same with each leg's bits) and standing.sh parse before device time is spent on them, legs_bits.sh stops at
once without its PATCHES, and benchmarks/read_cuts.py counts the visits of its two shapes. CPU only."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
@pytest.mark.parametrize("script", ["ncu_legs.sh", "legs_bits.sh", "standing.sh"])
def test_bash_parses_it(script):
    proc = subprocess.run(["bash", "-n", str(BENCHMARKS / script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_legs_bits_needs_its_patches_and_legs(tmp_path):
    proc = subprocess.run(["bash", str(BENCHMARKS / "legs_bits.sh")], capture_output=True, text=True, cwd=tmp_path,
                          env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path)})
    assert proc.returncode != 0 and "PATCHES" in proc.stderr


def test_read_cuts_counts_the_visits_of_the_80_query_tile():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import read_cuts
    finally:
        sys.path.remove(str(BENCHMARKS))
    assert read_cuts.visits("seqlen3840batch4") == 4 * 16 * 30 * 48    # B 4, 16 heads, 30 KV tiles x 48 Q tiles
    causal = read_cuts.visits("causalseqlen8192batch2")
    assert 2 * 16 * 64 * 103 // 2 < causal < 2 * 16 * 64 * 103    # about half of the full grid's visits
