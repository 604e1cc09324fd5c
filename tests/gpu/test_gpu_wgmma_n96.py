"""The head-dim-96 probe (tests/gpu/kernels/wgmma_n96.cu; docs/decisions/head-dim-plans.md "Head dim 96"): an MN-major
B operand of 96 columns in 128B-swizzled 64-column panels, read by one m64n96k16 per k-step, and by m64n64k16 plus
m64n32k16. The kernel compiles on any machine (checked here without a GPU: no spills); the products are compared
with numpy on a Hopper GPU. The N = 96 result decides the head-dim-96 plan: if it fails while the split passes, the
head dim's GEMMs are issued as 64 + 32."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from unit_kernels import assert_no_spills, check_close, compile_unit, launch_unit

BF16 = np.dtype(ml_dtypes.bfloat16)
SMEM = (64 * 128 + 128 * 128) * 2 + 1024


def test_probe_compiles_without_spills():
    assert_no_spills("wgmma_n96")


_RESULTS = {}


def _run():
    """(A B in float64, E96, E64_32) from one launch, cached."""
    if not _RESULTS:
        import cupy
        rng = np.random.default_rng(96)
        a = rng.standard_normal((64, 128), dtype=np.float32).astype(BF16)
        b = rng.standard_normal((128, 96), dtype=np.float32).astype(BF16)
        a_dev, b_dev = cupy.asarray(a.view(np.uint16)), cupy.asarray(b.view(np.uint16))
        e96, e64_32 = (cupy.full((64, 96), np.nan, dtype=cupy.float32) for _ in range(2))
        launch_unit(compile_unit("wgmma_n96")[0], "wgmma_n96", 128, (a_dev, b_dev, e96, e64_32), SMEM)
        _RESULTS.update(ref=a.astype(np.float64) @ b.astype(np.float64), e96=e96.get(), e64_32=e64_32.get())
    return _RESULTS


@pytest.mark.gpu
def test_n64_plus_n32_matches_numpy():
    r = _run()
    check_close("E = A B as m64n64k16 + m64n32k16", r["e64_32"], r["ref"])


@pytest.mark.gpu
def test_n96_across_one_and_a_half_panels_matches_numpy():
    r = _run()
    check_close("E = A B as one m64n96k16 per k-step", r["e96"], r["ref"])
