"""The CUPY_DASH_EXP2_FMA experiment on the GPU (k of every 8 column groups of the softmax take 2^x from
kernels_src/exp2_fma.cuh, a polynomial on the FMA pipe, instead of MUFU's ex2; forward and backward main kernels):
with k = 4 and 8, the forward and the deterministic and atomic backward against the float64 reference under FA3's
rule, with and without soft-capping, head dims 64 and 128, causal / full / a window, Sq != Sk, GQA; the
deterministic backward repeats its bits; the builds differ from the plain ones (the knob reaches the kernels).
CuPy inputs: the functional API builds its launch from the knob on every call (the torch fast path reads it once
per process). Skipped without a Hopper GPU."""
from __future__ import annotations

import numpy as np
import pytest

import cupy_dash
from cupy_dash import reference
from gpu_helpers import DTYPES, _assert_finite, _assert_same_bits, _dev, _host, _poison_pool, _poison_size, _randn, _seed

pytestmark = pytest.mark.gpu

# (dtype, head dim, causal, Sq, Sk, H, Hkv, window, cap)
CASES = [
    ("bf16", 64, True, 1299, 1299, 4, 4, (-1, -1), 0.0),
    ("fp16", 64, False, 1000, 300, 6, 2, (-1, -1), 5.0),
    ("bf16", 64, True, 2048, 2048, 2, 2, (256, 0), 30.0),
    ("bf16", 128, True, 1000, 1000, 4, 2, (-1, -1), 0.0),
    ("bf16", 128, False, 300, 1000, 2, 2, (-1, -1), 50.0),
]
MAG = 3.0       # scores of several units: the cap bends them, and the exponents span a wide range


def _id(c):
    dtype, d, causal, sq, sk, h, hkv, window, cap = c
    text = f"{dtype}-d{d}-{'causal' if causal else 'full'}-sq{sq}-sk{sk}-h{h}-hkv{hkv}-cap{cap:g}"
    return text + (f"-window{window[0]}_{window[1]}" if window != (-1, -1) else "")


_DATA = {}


def _data(c):
    key = _id(c)
    if key not in _DATA:
        dtype, d, causal, sq, sk, h, hkv, window, cap = c
        rng = np.random.default_rng(_seed(key))
        q = (MAG * _randn(rng, (1, sq, h, d), np.float32)).astype(DTYPES[dtype])
        k = (MAG * _randn(rng, (1, sk, hkv, d), np.float32)).astype(DTYPES[dtype])
        v, do = _randn(rng, (1, sk, hkv, d), DTYPES[dtype]), _randn(rng, (1, sq, h, d), DTYPES[dtype])
        kw = dict(causal=causal, window=window, softcap=cap)
        out, lse = reference.forward(q, k, v, **kw)
        out_lowp, lse_lowp = reference.forward_lowp(q, k, v, **kw)
        _DATA[key] = dict(q=q, k=k, v=v, do=do, out=out, lse=lse, out_lowp=out_lowp, kw=kw,
                          grads=reference.backward(do, q, k, v, out, lse, **kw),
                          grads_lowp=reference.backward_lowp(do, q, k, v, out_lowp, lse_lowp, **kw))
    return _DATA[key]


@pytest.mark.parametrize("fma", [4, 8])
@pytest.mark.parametrize("c", CASES, ids=[_id(c) for c in CASES])
def test_forward_and_backward_match_reference(c, fma, monkeypatch):
    data = _data(c)
    q, k, v, do = (_dev(data[n]) for n in ("q", "k", "v", "do"))
    plain = _host(cupy_dash.attention_forward(q, k, v, **data["kw"])[0])
    monkeypatch.setenv("CUPY_DASH_EXP2_FMA", str(fma))
    _poison_pool(_poison_size(q, k, v))
    out, lse = cupy_dash.attention_forward(q, k, v, **data["kw"])
    out_h, lse_h = _host(out), _host(lse)
    _assert_finite("out", out_h)
    reference.assert_close_fa3("out", out_h, data["out"], data["out_lowp"])
    seen = np.isfinite(data["lse"])
    assert np.all(np.isfinite(lse_h) == seen), "lse must be -inf exactly on rows that see no key"
    np.testing.assert_allclose(lse_h[seen], data["lse"][seen], rtol=0, atol=1e-3 + c[-1] * 4.9e-4)
    assert not np.array_equal(out_h.view(np.uint16), plain.view(np.uint16)), "the knob changed nothing"
    for deterministic in (True, False):
        _poison_pool(_poison_size(do, q, k, v))
        grads = cupy_dash.attention_backward(do, q, k, v, out, lse, **data["kw"], deterministic=deterministic)
        cupy_dash.check_errors()
        for name, g, ref, lowp in zip(("dq", "dk", "dv"), grads, data["grads"], data["grads_lowp"]):
            g = _host(g)
            _assert_finite(name, g)
            reference.assert_close_fa3(name, g, ref, lowp)
    first = cupy_dash.attention_backward(do, q, k, v, out, lse, **data["kw"])
    for _ in range(5):
        again = cupy_dash.attention_backward(do, q, k, v, out, lse, **data["kw"])
        for name, a, b in zip(("dq", "dk", "dv"), again, first):
            _assert_same_bits(name, a, b)
    cupy_dash.check_errors()
