"""One visit of each head-dim-192 backward tile as a unit kernel (docs/decisions/head-dim-plans.md), three MMA
warpgroups that split the head dim:
- ``bwd192_visit`` (tests/gpu/kernels/bwd192_visit.cu, the 96 x 64 tile of compact tables, "Head dim 192 on the
  same family"): S^T and dP^T split by queries, P and dS stored transposed (queries x keys), dV^T and dK^T with
  MN-major A and B, dQ^T with an MN-major A (K) and a K-major B read from the dS tile at row 48 c (two m64n48 chunks);
- ``bwd192_keys_visit`` (tests/gpu/kernels/bwd192_keys_visit.cu, FA3's 64 x 96 tile, the main kernel's GEMMs of
  kernels_src/bwd/keys_gemms.cuh): S and dP split by keys, P^T and dS^T stored as keys x queries, dV^T and dK^T with
  an MN-major A and a K-major B at N = 96, dQ with an MN-major A read from the 96-row dS^T tile and an MN-major B
  (K).
The kernels compile on any machine (checked here without a GPU: no spills); on a Hopper GPU, P and dS are compared
with the float64 math, then the three products with numpy's products of the kernel's own bf16 P and dS, so that a
layout error shows as a wrong product, not as rounding."""
from __future__ import annotations

import functools

import pytest

from unit_kernels import assert_no_spills, bf16_f64, check_close, run_visit, visit_p_ds, visit_problem

D = 192
# name: (queries, keys, seed, dQ output (name, shape), its product from (dS, K) as numpy computes it)
KERNELS = {
    "bwd192_visit": (96, 64, 192, ("dqt", (D, 96)), "dQ^T = K^T dS^T", lambda ds, k: k.T @ ds.T),
    "bwd192_keys_visit": (64, 96, 1920, ("dq", (64, D)), "dQ = dS K", lambda ds, k: ds @ k),
}


@pytest.mark.parametrize("name", KERNELS)
def test_visit_kernel_compiles_without_spills(name):
    assert_no_spills(name)


@functools.cache
def _run(name: str) -> dict:
    """Inputs and the kernel's outputs from one launch (P and dS tiles: one panel of 96 rows each)."""
    m, n, seed, dq, *_ = KERNELS[name]
    smem = 2 * m * D * 2 + 2 * n * D * 2 + 2 * 96 * 64 * 2 + 1024
    return run_visit(name, 384, visit_problem(seed, m, n, D),
                     (("p", (m, n)), ("ds", (m, n)), ("dvt", (D, n)), ("dkt", (D, n)), dq), smem)


@pytest.mark.gpu
@pytest.mark.parametrize("name", KERNELS)
def test_probabilities_and_score_gradients_match_float64(name):
    r = _run(name)
    p, ds = visit_p_ds(r)
    check_close("P", r["p"], p, 2e-3)                          # exp2.approx: ~2^-22 relative, fp32 scores
    check_close("dS", r["ds"], ds, 2e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("name", KERNELS)
def test_products_match_numpy_on_the_kernels_own_operands(name):
    r = _run(name)
    _, _, _, (dq_name, _), dq_label, dq_product = KERNELS[name]
    p, ds, do, q, k = bf16_f64(r["p"], r["ds"], r["do"], r["q"], r["k"])    # P, dS: the bf16 tiles the GEMMs read
    check_close("dV^T = dO^T P", r["dvt"], do.T @ p, 1e-5)
    check_close("dK^T = Q^T dS", r["dkt"], q.T @ ds, 1e-5)
    check_close(dq_label, r[dq_name], dq_product(ds, k), 1e-5)
