"""GPU test of the host fast path for CuPy callers (cupy_dash.core.fastpath): a repeated call with CuPy arrays is
served from the stored plan (forward and backward), gives the full path's bits, and other arrays of the same
layout get their own tensor maps. Skipped without a Hopper GPU."""
from __future__ import annotations

import numpy as np
import pytest

import cupy
import cupy_dash
from cupy_dash.core import fastpath

pytestmark = pytest.mark.gpu


def _inputs(seed, hdim=128, S=700, H=4, Hkv=2):
    rng = np.random.default_rng(seed)
    mk = lambda n: cupy.asarray(rng.standard_normal((2, S, n, hdim), np.float32)).astype(cupy.float16)  # noqa: E731
    return mk(H), mk(Hkv), mk(Hkv), mk(H)


def _same(a, b):
    return all(np.array_equal(cupy.asnumpy(x).view(np.uint8), cupy.asnumpy(y).view(np.uint8)) for x, y in zip(a, b))


@pytest.mark.parametrize("causal,schedule", [(True, "auto"), (False, "shift")], ids=["causal-auto", "full-shift"])
def test_cupy_calls_are_served_by_the_fast_path_with_the_full_paths_bits(causal, schedule, monkeypatch):
    fastpath.clear()
    q, k, v, do = _inputs(1)
    out, lse = cupy_dash.attention_forward(q, k, v, causal=causal)                   # full path: plans stored
    grads = cupy_dash.attention_backward(do, q, k, v, out, lse, causal=causal, schedule=schedule)
    hits = fastpath.stats()
    out2, lse2 = cupy_dash.attention_forward(q, k, v, causal=causal)
    grads2 = cupy_dash.attention_backward(do, q, k, v, out, lse, causal=causal, schedule=schedule)
    after = fastpath.stats()
    assert after["fwd_hits"] == hits["fwd_hits"] + 1 and after["bwd_hits"] == hits["bwd_hits"] + 1
    assert all(type(x) is cupy.ndarray for x in (out2, lse2, *grads2))
    assert _same((out, lse), (out2, lse2)) and _same(grads, grads2)
    q3, k3, v3, do3 = _inputs(2)                                 # other arrays of the same layout
    fast = cupy_dash.attention_forward(q3, k3, v3, causal=causal)
    fast_grads = cupy_dash.attention_backward(do3, q3, k3, v3, *fast, causal=causal, schedule=schedule)
    monkeypatch.setenv("CUPY_DASH_FASTPATH", "0")
    full = cupy_dash.attention_forward(q3, k3, v3, causal=causal)
    full_grads = cupy_dash.attention_backward(do3, q3, k3, v3, *full, causal=causal, schedule=schedule)
    cupy_dash.check_errors()
    assert fastpath.stats()["fwd_hits"] == after["fwd_hits"] + 1
    assert _same(fast, full) and _same(fast_grads, full_grads)
