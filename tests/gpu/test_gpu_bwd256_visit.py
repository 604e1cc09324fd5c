"""One visit of the head-dim-256 backward plan as a unit kernel (tests/gpu/kernels/bwd256_visit.cu;
docs/decisions/tile-plans.md "Head dims 192 and 256: a backward plan"): S^T and dP^T split by queries between the two
MMA warpgroups, P^T and dS^T through shared memory, dV^T, dK^T with MN-major A operands and dQ with an MN-major A
read from the dS^T tile. The kernel compiles on any machine (checked here without a GPU: no spills); on a Hopper
GPU, P^T and dS^T are compared with the float64 math, then the three products with numpy's products of the
kernel's own bf16 P^T and dS^T, so that a layout error shows as a wrong product, not as rounding."""
from __future__ import annotations

import functools

import ml_dtypes
import numpy as np
import pytest

from unit_kernels import assert_no_spills, check_close, compile_unit, launch_unit

BF16 = np.dtype(ml_dtypes.bfloat16)
D = 256
SMEM = 4 * 64 * D * 2 + 2 * 64 * 64 * 2 + 1024


def test_visit_kernel_compiles_without_spills():
    assert_no_spills("bwd256_visit")


@functools.cache
def _run() -> dict:
    """Inputs and the kernel's outputs from one launch."""
    import cupy
    rng = np.random.default_rng(256)
    q, k, v, do = (rng.standard_normal((64, D), dtype=np.float32).astype(BF16) for _ in range(4))
    scale_log2 = np.float32(D ** -0.5 * np.log2(np.e))
    s = q.astype(np.float64) @ k.astype(np.float64).T * scale_log2            # (queries, keys)
    lse_log2 = (s.max(axis=1) + rng.uniform(0.5, 2.0, 64)).astype(np.float32)
    dpsum = rng.standard_normal(64).astype(np.float32)
    dev = {n: cupy.asarray(x.view(np.uint16)) for n, x in (("q", q), ("k", k), ("v", v), ("do", do))}
    outs = {n: cupy.full(shape, np.nan, dtype=cupy.float32) for n, shape in
            (("pt", (64, 64)), ("dst", (64, 64)), ("dvt", (D, 64)), ("dkt", (D, 64)), ("dq", (64, D)))}
    launch_unit(compile_unit("bwd256_visit")[0], "bwd256_visit", 256,
                (dev["q"], dev["k"], dev["v"], dev["do"], cupy.asarray(lse_log2), cupy.asarray(dpsum), scale_log2,
                 *outs.values()), SMEM)
    return dict(q=q, k=k, v=v, do=do, s=s, lse_log2=lse_log2, dpsum=dpsum, **{n: x.get() for n, x in outs.items()})


def _f64(x):
    return x.astype(np.float64)


@pytest.mark.gpu
def test_probabilities_and_score_gradients_match_float64():
    r = _run()
    p = np.exp2(r["s"] - r["lse_log2"][:, None].astype(np.float64))                   # (queries, keys)
    dp = _f64(r["do"]) @ _f64(r["v"]).T
    ds = p * (dp - r["dpsum"][:, None])
    check_close("P^T", r["pt"], p.T, 2e-3)                     # exp2.approx: ~2^-22 relative, fp32 scores
    check_close("dS^T", r["dst"], ds.T, 2e-3)


@pytest.mark.gpu
def test_products_match_numpy_on_the_kernels_own_operands():
    r = _run()
    pt, dst = (_f64(r[n].astype(BF16)) for n in ("pt", "dst"))    # the bf16 tiles the GEMMs read
    check_close("dV^T = dO^T P", r["dvt"], _f64(r["do"]).T @ pt.T, 1e-5)
    check_close("dK^T = Q^T dS", r["dkt"], _f64(r["q"]).T @ dst.T, 1e-5)
    check_close("dQ = dS K", r["dq"], dst.T @ _f64(r["k"]), 1e-5)
