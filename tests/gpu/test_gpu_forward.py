"""GPU tests of the Hopper forward kernel beyond tests/gpu/test_gpu_attention.py's grid of shapes: grouped KV heads
(GQA / MQA), strided views (q, k, v as slices of one packed qkv buffer), long sequences with many KV tiles per
CTA, and bitwise repeatability of out and lse; head dims 192 and 256 (64 keys per tile; 192 the forward only) in
each. Every comparison is against the float64 reference with FA3's rule (cupy_dash.reference.assert_close_fa3).
Skipped without a Hopper GPU.
"""
from __future__ import annotations

import types
import zlib
from dataclasses import dataclass

import ml_dtypes
import numpy as np
import pytest

cupy = pytest.importorskip("cupy")
import cupy_dash  # noqa: E402
from cupy_dash import reference  # noqa: E402

pytestmark = pytest.mark.gpu

DTYPES = {"bf16": np.dtype(ml_dtypes.bfloat16), "fp16": np.dtype(np.float16)}
LSE_TOL = 1e-3  # fp32 lse from exact fp32 scores of the same 16-bit inputs (see test_gpu_attention.LSE_CAP)


@dataclass(frozen=True)
class Shape:
    dtype: str
    hdim: int
    causal: bool
    seqlen_q: int
    seqlen_k: int
    batch: int
    heads: int
    heads_kv: int

    @property
    def id(self) -> str:
        mask = "causal" if self.causal else "full"
        return (f"{self.dtype}-d{self.hdim}-{mask}-sq{self.seqlen_q}-sk{self.seqlen_k}-b{self.batch}"
                f"-h{self.heads}-hkv{self.heads_kv}")


def _inputs(shape: Shape):
    rng = np.random.default_rng(zlib.crc32(shape.id.encode()))
    dt = DTYPES[shape.dtype]
    b, sq, sk, d = shape.batch, shape.seqlen_q, shape.seqlen_k, shape.hdim
    q = rng.standard_normal((b, sq, shape.heads, d), dtype=np.float32).astype(dt)
    k = rng.standard_normal((b, sk, shape.heads_kv, d), dtype=np.float32).astype(dt)
    v = rng.standard_normal((b, sk, shape.heads_kv, d), dtype=np.float32).astype(dt)
    return q, k, v


def _dev(a: np.ndarray):
    a = np.ascontiguousarray(a)
    return cupy.asarray(a.view(np.uint16)).view(a.dtype) if a.dtype.itemsize == 2 else cupy.asarray(a)


def _host(x) -> np.ndarray:
    return cupy.asnumpy(x.view(cupy.uint16)).view(x.dtype) if x.dtype.itemsize == 2 else cupy.asnumpy(x)


def _poison():
    """Give back a pool block full of 0xFF bytes, so unwritten outputs read as NaN."""
    buf = cupy.empty(64 << 20, dtype=cupy.uint8)
    buf.fill(0xFF)
    del buf


def _check(shape: Shape, q, k, v, out, lse, window=(-1, -1)):
    dt = DTYPES[shape.dtype]
    out_ref, lse_ref = reference.forward(q, k, v, causal=shape.causal, window=window)
    out_lowp, _ = reference.forward_lowp(q, k, v, causal=shape.causal, window=window, dtype=dt)
    out_h, lse_h = _host(out), _host(lse)
    assert out_h.shape == q.shape and lse_h.shape == (shape.batch, shape.heads, shape.seqlen_q)
    blind = ~reference.visibility_mask(shape.seqlen_q, shape.seqlen_k, shape.causal, window).any(axis=1)
    assert np.isfinite(out_h.astype(np.float32)).all(), "out has non-finite values"
    if blind.any():
        assert (out_h[:, blind].astype(np.float32) == 0).all(), "out must be 0 on rows that see no key"
        assert np.isneginf(lse_h[:, :, blind]).all(), "lse must be -inf on rows that see no key"
    reference.assert_close_fa3("out", out_h, out_ref, out_lowp)
    seen = lse_h[:, :, ~blind].astype(np.float64)
    err = float(np.abs(seen - lse_ref[:, :, ~blind]).max()) if seen.size else 0.0
    assert err <= LSE_TOL, f"lse: max error {err:.3g} > {LSE_TOL}"


GQA_SHAPES = [Shape(dt, d, causal, sq, sk, 2, 8, hkv)
              for dt, d, causal, sq, sk, hkv in [
                  ("bf16", 128, True, 1000, 1000, 1), ("bf16", 128, False, 777, 1500, 2),
                  ("bf16", 64, True, 1500, 777, 2), ("bf16", 64, False, 513, 513, 8),
                  ("fp16", 128, True, 300, 1000, 4), ("fp16", 64, False, 1000, 300, 1),
                  ("bf16", 96, True, 1000, 1000, 2), ("fp16", 96, False, 777, 1500, 1),
                  ("bf16", 192, True, 1000, 1000, 2), ("fp16", 192, False, 777, 1500, 4),
                  ("bf16", 256, False, 1000, 300, 1), ("fp16", 256, True, 300, 1000, 2)]]


@pytest.mark.parametrize("shape", GQA_SHAPES, ids=lambda s: s.id)
def test_forward_grouped_kv_heads(shape):
    q, k, v = _inputs(shape)
    _poison()
    out, lse = cupy_dash.attention_forward(_dev(q), _dev(k), _dev(v), causal=shape.causal)
    _check(shape, q, k, v, out, lse)


@pytest.mark.parametrize("hdim", [64, 96, 128, 192, 256])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_forward_strided_packed_qkv(hdim, causal):
    """q, k, v as views into one (B, S, 3, H, D) buffer: row stride 3 H D, head stride D, read in place by TMA."""
    shape = Shape("bf16", hdim, causal, 999, 999, 2, 4, 4)
    q, k, v = _inputs(shape)
    packed = _dev(np.stack([q, k, v], axis=2))
    qv, kv, vv = packed[:, :, 0], packed[:, :, 1], packed[:, :, 2]
    assert not qv.flags.c_contiguous
    _poison()
    out, lse = cupy_dash.attention_forward(qv, kv, vv, causal=causal)
    _check(shape, q, k, v, out, lse)


@pytest.mark.parametrize("shape", [Shape("bf16", 128, True, 4096, 4096, 1, 2, 2),
                                   Shape("bf16", 64, False, 3000, 5000, 1, 2, 1),
                                   Shape("bf16", 128, False, 4097, 4097, 1, 1, 1),
                                   Shape("bf16", 96, True, 4097, 4097, 1, 2, 1),
                                   Shape("bf16", 192, False, 4097, 3001, 1, 1, 1),
                                   Shape("fp16", 256, True, 4096, 4096, 1, 2, 1)], ids=lambda s: s.id)
def test_forward_long_sequences(shape):
    """Many KV tiles per CTA (32-40): the K / V stage rings wrap many times and the online softmax rescales
    across them."""
    q, k, v = _inputs(shape)
    _poison()
    out, lse = cupy_dash.attention_forward(_dev(q), _dev(k), _dev(v), causal=shape.causal)
    _check(shape, q, k, v, out, lse)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("hdim", [64, 96, 128, 192, 256])
def test_forward_bitwise_repeatable(hdim, causal):
    shape = Shape("bf16", hdim, causal, 2048, 2048, 2, 8, 8)
    q, k, v = (_dev(x) for x in _inputs(shape))
    out0, lse0 = cupy_dash.attention_forward(q, k, v, causal=causal)
    bits0 = out0.view(cupy.int16), lse0.view(cupy.int32)
    diffs = []
    for _ in range(20):
        out, lse = cupy_dash.attention_forward(q, k, v, causal=causal)
        diffs.append(int(cupy.count_nonzero(out.view(cupy.int16) != bits0[0])))
        diffs.append(int(cupy.count_nonzero(lse.view(cupy.int32) != bits0[1])))
    assert not any(diffs), f"forward bits changed between identical runs: {diffs}"


# (left, right) windows: narrower than a tile, straddling tiles, one-sided, with causal, with Sq != Sk (rows
# whose whole window lies outside the keys see nothing)
WINDOW_CASES = [(Shape("bf16", 128, False, 1000, 1000, 2, 4, 4), (100, 50)),
                (Shape("bf16", 128, True, 1000, 1000, 2, 4, 2), (257, -1)),
                (Shape("bf16", 64, False, 777, 1500, 1, 4, 4), (-1, 0)),
                (Shape("bf16", 64, False, 1500, 777, 1, 4, 1), (64, 64)),
                (Shape("fp16", 128, False, 513, 513, 2, 2, 2), (0, 0)),
                (Shape("bf16", 128, False, 300, 1000, 2, 2, 2), (-1, 130)),
                (Shape("bf16", 64, True, 2048, 2048, 1, 2, 2), (511, -1)),
                (Shape("bf16", 128, False, 1000, 300, 1, 2, 2), (10, 5)),
                (Shape("bf16", 96, False, 1000, 1000, 2, 4, 2), (100, 50)),
                (Shape("bf16", 96, True, 777, 1500, 1, 2, 2), (257, -1)),
                (Shape("bf16", 192, False, 1000, 1000, 2, 4, 2), (100, 50)),
                (Shape("bf16", 256, True, 777, 1500, 1, 2, 2), (257, -1))]


@pytest.mark.parametrize("shape,window", WINDOW_CASES, ids=lambda x: x.id if isinstance(x, Shape) else
                         f"w{x[0]}_{x[1]}")
def test_forward_sliding_window(shape, window):
    q, k, v = _inputs(shape)
    _poison()
    out, lse = cupy_dash.attention_forward(_dev(q), _dev(k), _dev(v), causal=shape.causal, window=window)
    _check(shape, q, k, v, out, lse, window)


def test_forward_unbounded_window_is_bitwise_the_plain_forward():
    shape = Shape("bf16", 128, True, 1000, 1000, 1, 2, 2)
    q, k, v = (_dev(x) for x in _inputs(shape))
    a = cupy_dash.attention_forward(q, k, v, causal=True)
    b = cupy_dash.attention_forward(q, k, v, causal=True, window=(-1, 0))
    c = cupy_dash.attention_forward(q, k, v, causal=True, window=(4096, -1))   # wider than the sequence
    for x, y in ((a, b), (a, c)):
        assert bool((x[0].view(cupy.int16) == y[0].view(cupy.int16)).all())
        assert bool((x[1].view(cupy.int32) == y[1].view(cupy.int32)).all())


# (shape, K and V bytes of L2 per (b, h) pair): a causal launch walks L2 sections of (b, h) pairs (FwdParams.
# head_section); 3 of 10 pairs per section leaves a last section of one, 1 is the per-head order
SECTION_CASES = [(Shape("bf16", 128, True, 1000, 1000, 2, 5, 5), 3), (Shape("bf16", 64, True, 1537, 777, 2, 6, 2), 2),
                 (Shape("fp16", 256, True, 777, 1500, 1, 4, 4), 1),
                 (Shape("bf16", 192, True, 1000, 1000, 2, 3, 3), 4)]


@pytest.mark.parametrize("shape,pairs", SECTION_CASES, ids=lambda x: x.id if isinstance(x, Shape) else f"pairs{x}")
def test_forward_causal_head_sections(shape, pairs, monkeypatch):
    """Forced sections (the L2 size made to hold ``pairs`` pairs' K and V, the SM count made large): correct against
    the float64 reference, and bitwise equal to the launch with every pair in one section."""
    from cupy_dash.cuda import kernels, launchers
    monkeypatch.setenv("CUPY_DASH_FASTPATH", "0")           # the fast path's plans hold the packed block
    group = shape.heads // shape.heads_kv
    kv_head = shape.seqlen_k * 2 * shape.hdim * 2
    l2 = {"bytes": 1 << 40}
    monkeypatch.setattr(launchers, "l2_bytes", lambda dev: l2["bytes"])
    monkeypatch.setattr(kernels, "sm_count", lambda dev: 1 << 20)     # the L2 decides
    q, k, v = _inputs(shape)
    dq, dk, dv = _dev(q), _dev(k), _dev(v)
    whole = cupy_dash.attention_forward(dq, dk, dv, causal=True)
    l2["bytes"] = (pairs * kv_head // group + 1) * 10 // 4 + 8    # L2_SECTION_SHARE = 0.4 of it holds `pairs` pairs
    p = types.SimpleNamespace(B=shape.batch, Sq=shape.seqlen_q, Sk=shape.seqlen_k, H=shape.heads,
                              Hkv=shape.heads_kv, D=shape.hdim, Dv=shape.hdim, device_id=cupy.cuda.Device().id)
    assert launchers.fwd_head_section(p, 128) == pairs
    _poison()
    out, lse = cupy_dash.attention_forward(dq, dk, dv, causal=True)
    _check(shape, q, k, v, out, lse)
    assert bool((out.view(cupy.int16) == whole[0].view(cupy.int16)).all())
    assert bool((lse.view(cupy.int32) == whole[1].view(cupy.int32)).all())


@pytest.mark.parametrize("hdim", [192])
def test_backward_refuses_the_forward_only_head_dims(hdim, monkeypatch):
    """A backward head dim not shipped (kernels.BWD_PENDING_HEAD_DIMS, as 192 was before it passed on the H200): the
    API raises before anything is launched, naming the head dims."""
    from cupy_dash.cuda import kernels
    monkeypatch.setattr(kernels, "BWD_HEAD_DIMS", tuple(d for d in kernels.BWD_HEAD_DIMS if d != hdim))
    shape = Shape("bf16", hdim, True, 200, 200, 1, 2, 2)
    q, k, v = (_dev(x) for x in _inputs(shape))
    out, lse = cupy_dash.attention_forward(q, k, v, causal=True)
    with pytest.raises(NotImplementedError, match="by the backward"):
        cupy_dash.attention_backward(out, q, k, v, out, lse, causal=True)
