"""Head dims 192 and 256: the forward kernel with a 128 x 64 tile (docs/decisions/head-dim-plans.md) launched below
the public API (its launch plan, cupy_dash.cuda.plans, run on the current stream), against the float64 reference under
FA3's rule, causal and full, GQA, odd lengths: the groundwork test of these head dims, kept as the one that needs
nothing above the launch layer. Skipped without a Hopper GPU."""
from __future__ import annotations

import numpy as np
import pytest

import cupy
from cupy_dash import reference, schedule
from cupy_dash.core import problem
from cupy_dash.cuda import kernels, launchers, plans
from gpu_helpers import BF16, _dev, _host, _randn, _seed

pytestmark = pytest.mark.gpu

TILE = kernels.TileConfig(128, 64, kernels.MAIN_THREADS)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [192, 256])
def test_forward_matches_reference(head_dim, causal):
    B, Sq, Sk, H, Hkv = 2, 777, 1000, 4, 2
    rng = np.random.default_rng(_seed(f"probe-{head_dim}-{causal}"))
    q_h = _randn(rng, (B, Sq, H, head_dim), BF16)
    k_h, v_h = (_randn(rng, (B, Sk, Hkv, head_dim), BF16) for _ in range(2))
    q, k, v = (_dev(x) for x in (q_h, k_h, v_h))
    out = _dev(np.zeros((B, Sq, H, head_dim), BF16))
    lse = cupy.empty((B, H, Sq), dtype=cupy.float32)
    p = problem.Problem(B, Sq, Sk, H, Hkv, D=head_dim, Dv=head_dim, dtype="bfloat16", scale=head_dim ** -0.5, softcap=0.0,
                    device_id=q.device.id)
    window = schedule.canonical_window((-1, 0) if causal else (-1, -1), Sq, Sk, causal)
    spec = kernels._spec("fwd", TILE, "bfloat16", head_dim, DASH_CAUSAL=causal)
    plan = plans.forward_plan(spec, launchers.fwd_grid(p, TILE.block_m), TILE.block_m, TILE.block_n, p, window,
                              tuple(launchers.bsh_strides(x.shape) for x in (q, k, v)))
    launchers.enqueue_forward(plan, cupy.cuda.get_current_stream(),
                              (q.data.ptr, k.data.ptr, v.data.ptr, out.data.ptr, lse.data.ptr))
    cupy.cuda.get_current_stream().synchronize()
    ref_out, ref_lse = reference.forward(q_h, k_h, v_h, causal=causal)
    lowp_out, _ = reference.forward_lowp(q_h, k_h, v_h, causal=causal)
    reference.assert_close_fa3("out", _host(out), ref_out, lowp_out)
    seen = np.isfinite(ref_lse)
    lse_h = cupy.asnumpy(lse)
    assert np.all(np.isfinite(lse_h) == seen)
    np.testing.assert_allclose(lse_h[seen], ref_lse[seen], rtol=0, atol=1e-3)
