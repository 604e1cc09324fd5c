"""One visit of the head-dim-256 backward plan as a unit kernel (tests/gpu/kernels/bwd256_visit.cu;
docs/decisions/head-dim-plans.md "Head dims 192 and 256: a backward plan"): S^T and dP^T split by queries between
the two MMA warpgroups, P^T and dS^T through shared memory, dV^T, dK^T with MN-major A operands and dQ with an MN-major A
read from the dS^T tile. The kernel compiles on any machine (checked here without a GPU: no spills); on a Hopper
GPU, P^T and dS^T are compared with the float64 math, then the three products with numpy's products of the
kernel's own bf16 P^T and dS^T, so that a layout error shows as a wrong product, not as rounding."""
from __future__ import annotations

import functools

import pytest

from unit_kernels import assert_no_spills, bf16_f64, check_close, run_visit, visit_p_ds, visit_problem

D = 256
SMEM = 4 * 64 * D * 2 + 2 * 64 * 64 * 2 + 1024


def test_visit_kernel_compiles_without_spills():
    assert_no_spills("bwd256_visit")


@functools.cache
def _run() -> dict:
    """Inputs and the kernel's outputs from one launch."""
    return run_visit("bwd256_visit", 256, visit_problem(256, 64, 64, D),
                     (("pt", (64, 64)), ("dst", (64, 64)), ("dvt", (D, 64)), ("dkt", (D, 64)), ("dq", (64, D))), SMEM)


@pytest.mark.gpu
def test_probabilities_and_score_gradients_match_float64():
    r = _run()
    p, ds = visit_p_ds(r)
    check_close("P^T", r["pt"], p.T, 2e-3)                     # exp2.approx: ~2^-22 relative, fp32 scores
    check_close("dS^T", r["dst"], ds.T, 2e-3)


@pytest.mark.gpu
def test_products_match_numpy_on_the_kernels_own_operands():
    r = _run()
    pt, dst, do, q, k = bf16_f64(r["pt"], r["dst"], r["do"], r["q"], r["k"])   # P^T, dS^T: the tiles GEMMs read
    check_close("dV^T = dO^T P", r["dvt"], do.T @ pt.T, 1e-5)
    check_close("dK^T = Q^T dS", r["dkt"], q.T @ dst.T, 1e-5)
    check_close("dQ = dS K", r["dq"], dst.T @ k, 1e-5)
