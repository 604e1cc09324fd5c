"""One visit of the head-dim-256 backward plan as a unit kernel (tests/gpu/kernels/bwd256_visit.cu;
docs/decisions/tile-plans.md "Head dims 192 and 256: a backward plan"): S^T and dP^T split by queries between the two
MMA warpgroups, P^T and dS^T through shared memory, dV^T, dK^T with MN-major A operands and dQ with an MN-major A
read from the dS^T tile. The kernel compiles on any machine (checked here without a GPU: no spills); on a Hopper
GPU, P^T and dS^T are compared with the float64 math, then the three products with numpy's products of the
kernel's own bf16 P^T and dS^T, so that a layout error shows as a wrong product, not as rounding."""
from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from cupy_dash.cuda import jit

BF16 = np.dtype(ml_dtypes.bfloat16)
SOURCE = Path(__file__).parent / "kernels" / "bwd256_visit.cu"
D = 256
SMEM = 4 * 64 * D * 2 + 2 * 64 * 64 * 2 + 1024


def _compile():
    cubin, log, ok = jit.compile_source(SOURCE.read_text(), "bwd256_visit.cu",
                                        [*jit.BASE_OPTIONS, f"-I{jit.kernel_dir()}"])
    assert ok, log
    return cubin, jit.parse_ptxas_log(log, "bwd256_visit"), log


def test_visit_kernel_compiles_without_spills():
    _, stats, log = _compile()
    assert stats["spill_stores"] == stats["spill_loads"] == stats["stack_frame"] == 0, log


_RESULTS = {}


def _run():
    """Inputs and the kernel's outputs from one launch, cached."""
    if not _RESULTS:
        import cupy
        from cupy.cuda import driver, function
        rng = np.random.default_rng(256)
        q, k, v, do = (rng.standard_normal((64, D), dtype=np.float32).astype(BF16) for _ in range(4))
        scale_log2 = np.float32(D ** -0.5 * np.log2(np.e))
        s = q.astype(np.float64) @ k.astype(np.float64).T * scale_log2            # (queries, keys)
        lse_log2 = (s.max(axis=1) + rng.uniform(0.5, 2.0, 64)).astype(np.float32)
        dpsum = rng.standard_normal(64).astype(np.float32)
        dev = {n: cupy.asarray(x.view(np.uint16)) for n, x in (("q", q), ("k", k), ("v", v), ("do", do))}
        outs = {n: cupy.full(shape, np.nan, dtype=cupy.float32) for n, shape in
                (("pt", (64, 64)), ("dst", (64, 64)), ("dvt", (D, 64)), ("dkt", (D, 64)), ("dq", (64, D)))}
        module = function.Module()
        module.load(_compile()[0])
        kernel = module.get_function("bwd256_visit")
        driver.funcSetAttribute(kernel.ptr, driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, SMEM)
        kernel((1,), (256,), (dev["q"], dev["k"], dev["v"], dev["do"], cupy.asarray(lse_log2),
                               cupy.asarray(dpsum), scale_log2, *outs.values()), shared_mem=SMEM)
        cupy.cuda.Device().synchronize()
        _RESULTS.update(q=q, k=k, v=v, do=do, s=s, lse_log2=lse_log2, dpsum=dpsum,
                        **{n: x.get() for n, x in outs.items()})
    return _RESULTS


def _check(name, got, ref, tol):
    assert np.isfinite(got).all(), f"{name}: {int((~np.isfinite(got)).sum())} elements not written or NaN"
    err = np.abs(got - ref).max() / max(1.0, np.abs(ref).max())
    assert err < tol, f"{name}: max relative error {err:.3g}"


def _f64(x):
    return x.astype(np.float64)


@pytest.mark.gpu
def test_probabilities_and_score_gradients_match_float64():
    r = _run()
    p = np.exp2(r["s"] - r["lse_log2"][:, None].astype(np.float64))                   # (queries, keys)
    dp = _f64(r["do"]) @ _f64(r["v"]).T
    ds = p * (dp - r["dpsum"][:, None])
    _check("P^T", r["pt"], p.T, 2e-3)                     # exp2.approx: ~2^-22 relative, fp32 scores
    _check("dS^T", r["dst"], ds.T, 2e-3)


@pytest.mark.gpu
def test_products_match_numpy_on_the_kernels_own_operands():
    r = _run()
    pt, dst = (_f64(r[n].astype(BF16)) for n in ("pt", "dst"))    # the bf16 tiles the GEMMs read
    _check("dV^T = dO^T P", r["dvt"], _f64(r["do"]).T @ pt.T, 1e-5)
    _check("dK^T = Q^T dS", r["dkt"], _f64(r["q"]).T @ dst.T, 1e-5)
    _check("dQ = dS K", r["dq"], dst.T @ _f64(r["k"]), 1e-5)
