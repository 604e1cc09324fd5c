"""The head-dim-96 probe (tests/gpu/kernels/wgmma_n96.cu; docs/decisions/tile-plans.md "Head dim 96"): an MN-major
B operand of 96 columns in 128B-swizzled 64-column panels, read by one m64n96k16 per k-step, and by m64n64k16 plus
m64n32k16. The kernel compiles on any machine (checked here without a GPU: no spills); the products are compared
with numpy on a Hopper GPU. The N = 96 result decides the head-dim-96 plan: if it fails while the split passes, the
head dim's GEMMs are issued as 64 + 32."""
from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from cupy_dash.cuda import jit

BF16 = np.dtype(ml_dtypes.bfloat16)
SOURCE = Path(__file__).parent / "kernels" / "wgmma_n96.cu"
SMEM = (64 * 128 + 128 * 128) * 2 + 1024


def _compile():
    cubin, log, ok = jit.compile_source(SOURCE.read_text(), "wgmma_n96.cu",
                                        [*jit.BASE_OPTIONS, f"-I{jit.kernel_dir()}"])
    assert ok, log
    return cubin, jit.parse_ptxas_log(log, "wgmma_n96"), log


def test_probe_compiles_without_spills():
    _, stats, log = _compile()
    assert stats["spill_stores"] == stats["spill_loads"] == stats["stack_frame"] == 0, log


_RESULTS = {}


def _run():
    """(A B in float64, E96, E64_32) from one launch, cached."""
    if not _RESULTS:
        import cupy
        from cupy.cuda import driver, function
        rng = np.random.default_rng(96)
        a = rng.standard_normal((64, 128), dtype=np.float32).astype(BF16)
        b = rng.standard_normal((128, 96), dtype=np.float32).astype(BF16)
        a_dev, b_dev = cupy.asarray(a.view(np.uint16)), cupy.asarray(b.view(np.uint16))
        e96, e64_32 = (cupy.full((64, 96), np.nan, dtype=cupy.float32) for _ in range(2))
        module = function.Module()
        module.load(_compile()[0])
        kernel = module.get_function("wgmma_n96")
        driver.funcSetAttribute(kernel.ptr, driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, SMEM)
        kernel((1,), (128,), (a_dev, b_dev, e96, e64_32), shared_mem=SMEM)
        cupy.cuda.Device().synchronize()
        _RESULTS.update(ref=a.astype(np.float64) @ b.astype(np.float64), e96=e96.get(), e64_32=e64_32.get())
    return _RESULTS


def _check(name, got, ref):
    assert np.isfinite(got).all(), f"{name}: {int((~np.isfinite(got)).sum())} elements not written or NaN"
    err = np.abs(got - ref).max() / max(1.0, np.abs(ref).max())
    assert err < 1e-5, f"{name}: max relative error {err:.3g}"


@pytest.mark.gpu
def test_n64_plus_n32_matches_numpy():
    r = _run()
    _check("E = A B as m64n64k16 + m64n32k16", r["e64_32"], r["ref"])


@pytest.mark.gpu
def test_n96_across_one_and_a_half_panels_matches_numpy():
    r = _run()
    _check("E = A B as one m64n96k16 per k-step", r["e96"], r["ref"])
