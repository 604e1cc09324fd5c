"""Portable bits on the GPU: the backward driven by tables built for 114 CTAs (an H100 PCIe) and for 132 (H100
SXM, H200), both run on this GPU, gives bitwise identical dq, dk, dv for the policies of
schedule.PORTABLE_POLICIES (tests/unit/test_schedule_portable.py checks their addition orders on the tables)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

cupy = pytest.importorskip("cupy")
import cupy_dash  # noqa: E402
from cupy_dash import reference, schedule  # noqa: E402
from cupy_dash.core import api  # noqa: E402
from cupy_dash.cuda import kernels  # noqa: E402

pytestmark = pytest.mark.gpu
BF16 = np.dtype(ml_dtypes.bfloat16)


def _dev(a: np.ndarray):
    return cupy.asarray(np.ascontiguousarray(a).view(np.uint16)).view(a.dtype)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("hdim", [64, 128])
@pytest.mark.parametrize("policy", schedule.PORTABLE_POLICIES)
def test_tables_for_114_and_132_ctas_give_the_same_bits(policy, hdim, causal):
    B, S, H = 1, 2048, 16           # 256 KV columns (d128) / 256 (d64): more than either CTA count
    rng = np.random.default_rng(7)
    host = [rng.standard_normal((B, S, H, hdim), dtype=np.float32).astype(BF16) for _ in range(4)]
    q, k, v, do = (_dev(x) for x in host)
    out, lse = cupy_dash.attention_forward(q, k, v, causal=causal)
    tile = kernels.bwd_tile(hdim, causal)
    bits = {}
    for sms in (114, 132):
        plan = schedule.build(policy, seqlen_q=S, seqlen_k=S, block_m=tile.block_m, block_n=tile.block_n,
                              num_heads=B * H, causal=causal, num_sms=sms)
        assert plan.num_ctas == sms
        grads = api._backward_with_plan(do, q, k, v, out, lse, plan=plan, causal=causal)
        cupy_dash.check_errors()
        bits[sms] = [cupy.asnumpy(g.view(cupy.int16)) for g in grads]
    for name, a, b in zip(("dq", "dk", "dv"), bits[114], bits[132]):
        n = int(np.count_nonzero(a != b))
        assert n == 0, f"{policy}: {name} differs in {n} elements between the 114- and 132-CTA tables"
    q_h, k_h, v_h, do_h = host          # and the shared result is right (FA3's rule against float64)
    out_ref, lse_ref = reference.forward(q_h, k_h, v_h, causal=causal)
    dq_ref, dk_ref, _ = reference.backward(do_h, q_h, k_h, v_h, out_ref, lse_ref, causal=causal)
    out_lp, lse_lp = reference.forward_lowp(q_h, k_h, v_h, causal=causal, dtype=BF16)
    dq_lp, dk_lp, _ = reference.backward_lowp(do_h, q_h, k_h, v_h, out_lp, lse_lp, causal=causal, dtype=BF16)
    reference.assert_close_fa3("dq", bits[132][0].view(BF16), dq_ref, dq_lp)
    reference.assert_close_fa3("dk", bits[132][1].view(BF16), dk_ref, dk_lp)
