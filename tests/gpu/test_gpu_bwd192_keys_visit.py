"""One visit of the candidate head-dim-192 backward tile, 64 queries x 96 keys, as a unit kernel
(tests/gpu/kernels/bwd192_keys_visit.cu; docs/decisions/head-dim-plans.md "Head dim 192: FA3's 64 x 96 tile, a
candidate"): three MMA warpgroups, S and dP split by keys, P^T and dS^T stored as keys x queries, dV^T and dK^T with an
MN-major A and a K-major B at N = 96, dQ with an MN-major A read from the 96-row dS^T tile and an MN-major B (K). The
kernel compiles on any machine (checked here without a GPU: no spills); on a Hopper GPU, P and dS are compared with the
float64 math, then the three products with numpy's products of the kernel's own bf16 P and dS, so that a layout error
shows as a wrong product, not as rounding."""
from __future__ import annotations

import functools

import pytest

from unit_kernels import assert_no_spills, bf16_f64, check_close, run_visit, visit_p_ds, visit_problem

D, M, N = 192, 64, 96
SMEM = 2 * M * D * 2 + 2 * N * D * 2 + 2 * N * 64 * 2 + 1024


def test_visit_kernel_compiles_without_spills():
    assert_no_spills("bwd192_keys_visit")


@functools.cache
def _run() -> dict:
    """Inputs and the kernel's outputs from one launch."""
    return run_visit("bwd192_keys_visit", 384, visit_problem(1920, M, N, D),
                     (("p", (M, N)), ("ds", (M, N)), ("dvt", (D, N)), ("dkt", (D, N)), ("dq", (M, D))), SMEM)


@pytest.mark.gpu
def test_probabilities_and_score_gradients_match_float64():
    r = _run()
    p, ds = visit_p_ds(r)
    check_close("P", r["p"], p, 2e-3)                          # exp2.approx: ~2^-22 relative, fp32 scores
    check_close("dS", r["ds"], ds, 2e-3)


@pytest.mark.gpu
def test_products_match_numpy_on_the_kernels_own_operands():
    r = _run()
    p, ds, do, q, k = bf16_f64(r["p"], r["ds"], r["do"], r["q"], r["k"])    # P, dS: the bf16 tiles the GEMMs read
    check_close("dV^T = dO^T P", r["dvt"], do.T @ p, 1e-5)
    check_close("dK^T = Q^T dS", r["dkt"], q.T @ ds, 1e-5)
    check_close("dQ = dS K", r["dq"], ds @ k, 1e-5)
