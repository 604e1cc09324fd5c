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
from gpu_helpers import (_dev, _host, _poison_pool, _poison_size, assert_backward_repeats,
                         assert_scaled_forward, assert_scaled_grads, scaled_case_data, scaled_case_id)

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
    return scaled_case_id(c)


def _data(c):
    return scaled_case_data(c, MAG)


@pytest.mark.parametrize("fma", [4, 8])
@pytest.mark.parametrize("c", CASES, ids=[_id(c) for c in CASES])
def test_forward_and_backward_match_reference(c, fma, monkeypatch):
    data = _data(c)
    q, k, v, do = (_dev(data[n]) for n in ("q", "k", "v", "do"))
    plain = _host(cupy_dash.attention_forward(q, k, v, **data["kw"])[0])
    monkeypatch.setenv("CUPY_DASH_EXP2_FMA", str(fma))
    _poison_pool(_poison_size(q, k, v))
    out, lse = cupy_dash.attention_forward(q, k, v, **data["kw"])
    assert_scaled_forward(data, out, lse, c[-1])
    assert not np.array_equal(_host(out).view(np.uint16), plain.view(np.uint16)), "the knob changed nothing"
    for deterministic in (True, False):
        _poison_pool(_poison_size(do, q, k, v))
        grads = cupy_dash.attention_backward(do, q, k, v, out, lse, **data["kw"], deterministic=deterministic)
        cupy_dash.check_errors()
        assert_scaled_grads(data, grads)
    assert_backward_repeats((do, q, k, v, out, lse), data["kw"], 5)
