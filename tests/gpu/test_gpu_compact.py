"""GPU tests of the compact-table backward (DASH_COMPACT build, opt-in through CUPY_DASH_COMPACT_TABLES=1; need an
NVIDIA Hopper GPU, skipped elsewhere): the same schedule read from per-column records must give the same bits
as read from the per-visit table (same visits in the same order, same ranks), for every policy; and the float64
oracle's tolerance on one shape. CuPy inputs (not torch) so that the torch fast path plays no part."""
from __future__ import annotations

import numpy as np
import pytest

import cupy_dash
from cupy_dash import reference
from cupy_dash.core import api
from cupy_dash.schedule import compact_device
from gpu_helpers import POLICIES, _assert_same_bits, _dev, _host, _randn, _seed

pytestmark = pytest.mark.gpu

# (B, Sq, Sk, H, Hkv, D, causal, window, dtype)
SHAPES = [
    (2, 1000, 1000, 4, 4, 128, True, (-1, -1), "bfloat16"),
    (1, 777, 1200, 8, 2, 128, True, (-1, -1), "bfloat16"),        # GQA g = 4, Sq != Sk
    (2, 1024, 1024, 8, 2, 64, False, (300, 200), "float16"),     # GQA g = 4, a window
    (1, 2048, 2048, 4, 4, 64, False, (-1, -1), "bfloat16"),
]


def _inputs(shape, seed):
    """(do, q, k, v, out, lse) of a shape; its D is a head dim or (query / key head dim, value head dim)."""
    B, Sq, Sk, H, Hkv, D, causal, window, dtype = shape
    D, Dv = D if isinstance(D, tuple) else (D, D)
    np_dtype = np.float16 if dtype == "float16" else api.NP_DTYPES["bfloat16"]
    rng = np.random.default_rng(seed)
    q = _dev(_randn(rng, (B, Sq, H, D), np_dtype))
    do = _dev(_randn(rng, (B, Sq, H, Dv), np_dtype))
    k = _dev(_randn(rng, (B, Sk, Hkv, D), np_dtype))
    v = _dev(_randn(rng, (B, Sk, Hkv, Dv), np_dtype))
    out, lse = cupy_dash.attention_forward(q, k, v, causal=causal, window=window)
    return do, q, k, v, out, lse


def _both(monkeypatch, shape, args, schedule):
    """(per-visit, compact) gradients of one schedule; the compact build's "auto" is compact_device.KERNEL_AUTO.
    Compact builds keep the 64-query tile: the per-visit call is held to it (from CAUSAL80_MIN_SEQLEN causal queries
    it would take 80, another summation order)."""
    causal, window = shape[6], shape[7]
    kw = dict(causal=causal, schedule=schedule, deterministic=True, window=window)
    monkeypatch.setenv(compact_device.ENV, "0")
    monkeypatch.setenv("CUPY_DASH_BWD_CAUSAL_BLOCK_M" if causal else "CUPY_DASH_BWD_FULL_BLOCK_M", "64")
    per_visit = cupy_dash.attention_backward(
        *args, **dict(kw, schedule=compact_device.KERNEL_AUTO if schedule == "auto" else schedule))
    monkeypatch.setenv(compact_device.ENV, "1")
    compact = cupy_dash.attention_backward(*args, **kw)
    cupy_dash.check_errors()
    return per_visit, compact


@pytest.mark.parametrize("schedule", POLICIES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_compact_tables_same_bits_as_per_visit(shape, schedule, monkeypatch):
    args = _inputs(shape, _seed(f"compact{shape}"))
    per_visit, compact = _both(monkeypatch, shape, args, schedule)
    for name, a, e in zip(("dq", "dk", "dv"), compact, per_visit):
        _assert_same_bits(name, a, e)
    again = cupy_dash.attention_backward(*args, causal=shape[6], schedule=schedule, window=shape[7])
    for name, a, e in zip(("dq", "dk", "dv"), again, compact):      # run to run, from the cached records
        _assert_same_bits(name, a, e)


# Every compact main kernel the dispatcher emits, one case each (auto), each of them unfolded (more than
# FOLD_MAX_TILES tile pairs: the compact preprocess / postprocess run too): head dims 64, 96, 128 and 256 keep the
# per-visit call's tile and give its bits; head dim 192 (and with value head dim 128) keeps the 96 x 64 tile for
# compact tables, per-visit ones take 64 x 96, so the two differ in summation order and each is held to float64.
EVERY_BUILD = [(1, 777, 1200, 6, 2, D, causal, (-1, -1), dtype)
               for dtype in ("bfloat16", "float16") for D in (64, 96, 128, 256) for causal in (False, True)]
D192_BUILDS = [(1, 777, 1200, 6, 2, D, causal, (-1, -1), dtype)
               for dtype in ("bfloat16", "float16") for D in (192, (192, 128)) for causal in (False, True)]


@pytest.mark.parametrize("shape", EVERY_BUILD, ids=str)
def test_every_compact_build_gives_the_per_visit_bits(shape, monkeypatch):
    args = _inputs(shape, _seed(f"compact-every{shape}"))
    per_visit, compact = _both(monkeypatch, shape, args, "auto")
    for name, a, e in zip(("dq", "dk", "dv"), compact, per_visit):
        _assert_same_bits(name, a, e)


@pytest.mark.parametrize("shape", [SHAPES[1], *D192_BUILDS], ids=str)
def test_compact_tables_match_float64(shape, monkeypatch):
    do, q, k, v, _, _ = _inputs(shape, _seed("compact-fp64"))
    causal, window = shape[6], shape[7]
    host = [_host(x) for x in (q, k, v, do)]
    out_ref, lse_ref = reference.forward(*host[:3], causal=causal, window=window)
    out_lp, lse_lp = reference.forward_lowp(*host[:3], causal=causal, window=window, dtype=host[0].dtype)
    ref = reference.backward(host[3], *host[:3], out_ref, lse_ref, causal=causal, window=window)
    lowp = reference.backward_lowp(host[3], *host[:3], out_lp, lse_lp, causal=causal, window=window,
                                   dtype=host[0].dtype)
    out, lse = cupy_dash.attention_forward(q, k, v, causal=causal, window=window)
    monkeypatch.setenv(compact_device.ENV, "1")
    grads = cupy_dash.attention_backward(do, q, k, v, out, lse, causal=causal, window=window)
    cupy_dash.check_errors()
    for name, g, r, lp in zip(("dq", "dk", "dv"), grads, ref, lowp):
        reference.assert_close_fa3(name, _host(g), r, lp)


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["auto", "symmetric_shift"])
def test_compact_tables_long_context_smoke(schedule, monkeypatch):
    """S = 32k causal, B = 1, H = 4, d128: the compact records give the per-visit path's bits."""
    shape = (1, 32768, 32768, 4, 4, 128, True, (-1, -1), "bfloat16")
    args = _inputs(shape, _seed("compact-32k"))
    per_visit, compact = _both(monkeypatch, shape, args, schedule)
    for name, a, e in zip(("dq", "dk", "dv"), compact, per_visit):
        _assert_same_bits(name, a, e)
    assert np.isfinite(_host(compact[0]).astype(np.float32)).all()


@pytest.mark.parametrize("mechanism", ["ffi", "callback"])
def test_jax_jit_reads_the_same_compact_tables(mechanism, monkeypatch):
    """Under jax.jit the backward takes the compact build where the eager path does (here forced with
    CUPY_DASH_COMPACT_TABLES=1) and gives the eager call's bits."""
    jax = pytest.importorskip("jax")
    import cupy_dash.jax as cj
    if mechanism == "ffi":
        pytest.importorskip("cupy_dash.jax._xla_ffi", reason="the extension is not built")
    monkeypatch.setenv("CUPY_DASH_JAX_FFI", "1" if mechanism == "ffi" else "0")
    shape = SHAPES[1]
    causal, window = shape[6], shape[7]
    do, q, k, v = (jax.device_put(_host(x)) for x in _inputs(shape, _seed("compact-jax"))[:4])
    out, lse = cupy_dash.attention_forward(q, k, v, causal=causal, window=window)
    monkeypatch.setenv(compact_device.ENV, "1")
    eager = cupy_dash.attention_backward(do, q, k, v, out, lse, causal=causal, window=window)
    jitted = jax.jit(lambda *a: cj.attention_backward(*a, causal=causal, window=window))(do, q, k, v, out, lse)
    cupy_dash.check_errors()
    for name, a, e in zip(("dq", "dk", "dv"), jitted, eager):
        _assert_same_bits(name, a, e)
