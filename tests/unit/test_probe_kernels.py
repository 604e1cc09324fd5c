"""The probe kernels of benchmarks/ (dq_reduce_bw.py, dsmem_exchange.py, gemm_chain.py, pipe_interference.py) without
a GPU: each compiles for sm_90a with NVRTC without spills (benchmarks/measure.py's compile_probe), and the first two
refuse, before compiling, a size that shared memory cannot hold."""
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


@pytest.mark.parametrize("script", [*sorted(PROBES), "gemm_chain.py", "pipe_interference.py"])
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



def test_gemm_chain_legs_and_refusals():
    """gemm_chain.py's legs: every level in the kernel's order, the early-exp2 and early-dV legs only where the
    rebuilt math exists (levels 2-11); the phase builds outside levels 3-11, the stamped builds below level 5 or with
    the phase builds, and out-of-range k-slices are refused before anything compiles."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import gemm_chain
    finally:
        sys.path.remove(str(BENCHMARKS))
    assert gemm_chain.legs([1, 3], [0, 2], dv_early=True) == [(1, 0, False), (3, 0, False), (3, 2, False),
                                                             (3, 0, True)]
    assert gemm_chain.legs([0], [5]) == [(0, 0, False)]
    assert gemm_chain.legs([11, 12], [2], dv_early=True) == [(11, 0, False), (11, 2, False), (12, 0, False),
                                                             (11, 0, True)]
    for args, named in ((["--phases", "--levels", "2"], "--phases"), (["--phases", "--levels", "12"], "--phases"),
                        (["--exp2-early", "6"], "--exp2-early"),
                        (["--stamps", "--levels", "4", "9"], "--stamps"),
                        (["--stamps", "--levels", "9", "--phases"], "--stamps"),
                        (["--levels", "9", "--run-logic", "3"], "--run-logic"),
                        (["--levels", "12", "--run", "512", "--run-logic", "3"], "--run-logic"),
                        (["--run", "1"], "--run")):
        run = _run("gemm_chain.py", *args)
        assert run.returncode == 2 and named in run.stderr, run.stderr[-500:]


def test_gemm_chain_rank_chain_orders_each_tile_by_visit():
    """Level 11's ranks: on every dQ tile, the visits in the order of their index j within their CTAs, 0 to n - 1 (a
    visit waits only for visits earlier in their CTA's order, so the chain cannot deadlock)."""
    import numpy as np
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import gemm_chain
    finally:
        sys.path.remove(str(BENCHMARKS))
    sms, visits = 132, 512
    rank = gemm_chain.chain_ranks(sms, visits)
    tile, j = (x.ravel() for x in gemm_chain.chain_tiles(sms, visits))
    for t in range(gemm_chain.DQ_TILES):
        on = tile == t
        assert sorted(rank[on]) == list(range(on.sum()))
        assert (np.argsort(j[on], kind="stable") == np.argsort(rank[on], kind="stable")).all()
