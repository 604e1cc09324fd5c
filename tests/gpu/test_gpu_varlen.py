"""GPU tests of the varlen forward (cupy_dash.attention_forward_varlen): each sequence of a packed batch gets
bitwise the out and lse of cupy_dash.attention_forward on that sequence alone (keys of the next sequence that a
tile loads are masked, so they add exact zeros), empty sequences and sequences of one token work, and the
results match the float64 reference."""
from __future__ import annotations

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")
import cupy_dash  # noqa: E402
from cupy_dash import reference  # noqa: E402
from gpu_helpers import BF16, LENGTHS, _dev, _host  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("window", [(-1, -1), (100, 50)], ids=["nowindow", "window"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("hdim", [64, 96, 128, 192, 256])
@pytest.mark.parametrize("lengths", list(LENGTHS), ids=str)
def test_varlen_equals_each_sequence_alone(lengths, hdim, causal, window):
    lq, lk = LENGTHS[lengths]
    if causal and window[1] > 0:
        window = (window[0], 0)                              # causal means right = 0
    H, Hkv = 4, 2
    rng = np.random.default_rng(len(lq) * 1000 + hdim)
    q = rng.standard_normal((sum(lq), H, hdim), dtype=np.float32).astype(BF16)
    k = rng.standard_normal((sum(lk), Hkv, hdim), dtype=np.float32).astype(BF16)
    v = rng.standard_normal((sum(lk), Hkv, hdim), dtype=np.float32).astype(BF16)
    cu_q, cu_k = (np.concatenate([[0], np.cumsum(x)]).astype(np.int32) for x in (lq, lk))
    buf = cupy.empty(64 << 20, dtype=cupy.uint8)
    buf.fill(0xFF)                                           # poison the pool: unwritten outputs would be NaN
    del buf
    out, lse = cupy_dash.attention_forward_varlen(_dev(q), _dev(k), _dev(v), cupy.asarray(cu_q), cupy.asarray(cu_k),
                                                  max(lq), max(lk), causal=causal, window=window)
    out_h, lse_h = _host(out), _host(lse)
    assert out_h.shape == q.shape and lse_h.shape == (H, sum(lq))
    for b, (sq, sk) in enumerate(zip(lq, lk)):
        rows = slice(int(cu_q[b]), int(cu_q[b + 1]))
        if sq == 0:
            continue
        if sk == 0:                                          # no key at all: out 0, lse -inf
            assert (out_h[rows].astype(np.float32) == 0).all() and np.isneginf(lse_h[:, rows]).all()
            continue
        qb, kb, vb = q[None, rows], k[None, int(cu_k[b]):int(cu_k[b + 1])], v[None, int(cu_k[b]):int(cu_k[b + 1])]
        want_out, want_lse = cupy_dash.attention_forward(_dev(qb), _dev(kb), _dev(vb), causal=causal, window=window)
        assert (out_h[rows].view(np.int16) == _host(want_out)[0].view(np.int16)).all(), f"sequence {b}: out"
        assert (lse_h[:, rows].view(np.int32) == _host(want_lse)[0].view(np.int32)).all(), f"sequence {b}: lse"
        if b == 3:                                           # and one sequence against the float64 reference
            ref_out, _ = reference.forward(qb, kb, vb, causal=causal, window=window)
            lowp_out, _ = reference.forward_lowp(qb, kb, vb, causal=causal, window=window, dtype=BF16)
            reference.assert_close_fa3("out", out_h[None, rows], ref_out, lowp_out)


def test_varlen_bits_repeat():
    lq = [100, 900, 1, 2048]
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((sum(lq), 8, 128), dtype=np.float32).astype(BF16) for _ in range(3))
    cu = cupy.asarray(np.concatenate([[0], np.cumsum(lq)]).astype(np.int32))
    args = (_dev(q), _dev(k), _dev(v), cu, cu, max(lq), max(lq))
    out0, lse0 = cupy_dash.attention_forward_varlen(*args, causal=True)
    for _ in range(10):
        out, lse = cupy_dash.attention_forward_varlen(*args, causal=True)
        assert bool((out.view(cupy.int16) == out0.view(cupy.int16)).all())
        assert bool((lse.view(cupy.int32) == lse0.view(cupy.int32)).all())
