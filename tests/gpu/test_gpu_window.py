"""GPU tests of the backward with sliding windows (need an NVIDIA Hopper GPU; skipped elsewhere, see conftest.py).

``window=(left, right)``: query i sees key j iff i + Sk - Sq - left <= j <= i + Sk - Sq + right (-1 unbounded,
causal means right = 0). The schedule tables leave out every tile outside the band, and a KV tile that no query
sees has no visit at all (the host zeroes its dk, dv rows). Checked here:

* every schedule and the atomic path against the float64 oracle with FA3's tolerance rule
  (:func:`cupy_dash.reference.assert_close_fa3`), on windows narrower than a tile, one-sided, zero-width, with
  causal, with Sq != Sk both ways; the backward is fed the GPU forward's out and lse for the same window (the
  path autograd takes), as test_gpu_attention.test_causal_rows_without_keys does;
* rows of dq whose query sees no key and rows of dk, dv whose key no query sees are exactly 0 (the pool is
  poisoned with NaN bytes first, so a row nobody writes shows up);
* GQA / MQA with windows, small persistent grids (many band columns per CTA) through explicit plans;
* an unbounded window gives the bits of the plain backward; 20 identical runs give identical bits for every
  schedule; the torch and JAX adapters pass the window to both passes and match the functional API bit for bit.

Helpers (device upload, pool poisoning, repeat loop) are those of gpu_helpers.py.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import pytest

import cupy
import cupy_dash
from cupy_dash import reference
from gpu_helpers import (ATOMIC, DTYPES, POLICIES, _assert_finite, _assert_same_bits, _dev, _host, _poison_pool,
                         _poison_size, _randn, _repeat_backward, _schedule_kwargs, _seed, _torch_from_host)

pytestmark = pytest.mark.gpu

WINDOW_REPEATS = 20
LSE_TOL = 1e-3     # fp32 lse from exact fp32 scores of the same 16-bit inputs (see test_gpu_attention.LSE_CAP)


@dataclass(frozen=True)
class WinCase:
    dtype: str
    hdim: int
    causal: bool
    seqlen_q: int
    seqlen_k: int
    window: tuple
    batch: int = 2
    heads: int = 4
    kv_heads: int = 4
    hdim_v: int = 0         # v's head dim where it differs from hdim (kernels.VALUE_HEAD_DIMS)

    @property
    def dv(self) -> int:
        return self.hdim_v or self.hdim

    @property
    def id(self) -> str:
        mask = "causal" if self.causal else "full"
        value = f"v{self.hdim_v}" if self.hdim_v else ""
        return (f"{self.dtype}-d{self.hdim}{value}-{mask}-sq{self.seqlen_q}-sk{self.seqlen_k}-w{self.window[0]}_"
                f"{self.window[1]}-b{self.batch}-h{self.heads}-hkv{self.kv_heads}")

    @property
    def np_dtype(self):
        return DTYPES[self.dtype]

    def mask(self) -> np.ndarray:
        return reference.visibility_mask(self.seqlen_q, self.seqlen_k, self.causal, self.window)

    def __str__(self):
        return self.id


CASES = [
    WinCase("bf16", 128, False, 1000, 1000, (100, 50)),       # a band narrower than a KV tile, both sides
    WinCase("bf16", 128, True, 1000, 1000, (257, 0)),         # causal sliding window
    WinCase("bf16", 64, False, 777, 1500, (-1, 0)),           # right bound only, Sq < Sk
    WinCase("bf16", 64, False, 1500, 777, (64, 64)),          # Sq > Sk: the first 659 queries see no key
    WinCase("fp16", 128, False, 513, 513, (0, 0)),            # zero width: each query sees its diagonal key
    WinCase("bf16", 128, False, 300, 1000, (10, 5)),          # keys 0..689 unseen: KV tiles 0-4 have no visits
    WinCase("bf16", 64, True, 2048, 2048, (511, 0)),          # many band columns per head
    WinCase("bf16", 128, False, 1000, 300, (10, 5)),          # Sq > Sk, queries 0..694 see no key
    WinCase("bf16", 64, True, 200, 2000, (30, 0)),            # causal, Sq < Sk: 13 of 16 KV tiles unseen
    WinCase("bf16", 64, False, 1000, 1000, (3, -1)),          # left bound only, narrower than a tile
    WinCase("bf16", 256, False, 1000, 1000, (100, 50)),       # head dim 256: a band narrower than a KV tile
    WinCase("bf16", 256, True, 1500, 777, (200, 0)),          # head dim 256: causal window, Sq > Sk
    WinCase("bf16", 192, False, 777, 1500, (100, 200)),       # head dim 192: both sides, Sq < Sk
    WinCase("bf16", 192, True, 1000, 1000, (257, 0)),         # head dim 192: causal sliding window
    WinCase("bf16", 192, False, 777, 1500, (100, 200), hdim_v=128),  # value head dim 128 with 192
]
GQA_CASES = [
    WinCase("bf16", 128, True, 1000, 1000, (300, 0), heads=8, kv_heads=2),
    WinCase("bf16", 64, False, 777, 1500, (100, 200), heads=8, kv_heads=1),
    WinCase("bf16", 128, False, 300, 1000, (10, 5), heads=8, kv_heads=2),
    WinCase("bf16", 64, False, 1200, 640, (0, 64), heads=8, kv_heads=4),
    WinCase("bf16", 256, True, 1000, 1000, (300, 0), heads=8, kv_heads=2),
    WinCase("bf16", 192, False, 1000, 1000, (100, 50), heads=6, kv_heads=2),
    WinCase("bf16", 192, True, 1000, 1000, (300, 0), heads=6, kv_heads=2, hdim_v=128),
]


@functools.lru_cache(maxsize=3)
def _data(case: WinCase) -> dict:
    """Inputs (seeded by the case id) and the float64 / low-precision forward and backward of one case."""
    rng = np.random.default_rng(_seed(case.id))
    dt = case.np_dtype
    b, sq, sk, h, hk, d, dv = case.batch, case.seqlen_q, case.seqlen_k, case.heads, case.kv_heads, case.hdim, case.dv
    x = dict(q=_randn(rng, (b, sq, h, d), dt), k=_randn(rng, (b, sk, hk, d), dt), v=_randn(rng, (b, sk, hk, dv), dt),
             do=_randn(rng, (b, sq, h, dv), dt))
    kw = dict(causal=case.causal, window=case.window)
    x["out_ref"], x["lse_ref"] = reference.forward(x["q"], x["k"], x["v"], **kw)
    x["out_lowp"], x["lse_lowp"] = reference.forward_lowp(x["q"], x["k"], x["v"], dtype=dt, **kw)
    args = (x["do"], x["q"], x["k"], x["v"])
    x["dq_ref"], x["dk_ref"], x["dv_ref"] = reference.backward(*args, x["out_ref"], x["lse_ref"], **kw)
    x["dq_lowp"], x["dk_lowp"], x["dv_lowp"] = reference.backward_lowp(*args, x["out_lowp"], x["lse_lowp"],
                                                                      dtype=dt, **kw)
    return x


def _gpu_forward(case, data):
    """(do, q, k, v, out, lse) on the GPU, out and lse from the GPU forward with the case's window; checks the
    forward on the way (rows without keys: out 0 and lse -inf; the rest close to the reference)."""
    do, q, k, v = (_dev(data[n]) for n in ("do", "q", "k", "v"))
    _poison_pool(_poison_size(do, q, k, v))
    out, lse = cupy_dash.attention_forward(q, k, v, causal=case.causal, window=case.window)
    out_h, lse_h = _host(out), _host(lse)
    blind = ~case.mask().any(axis=1)
    assert np.array_equal(np.isneginf(lse_h), np.broadcast_to(blind, lse_h.shape)), "lse -inf pattern"
    assert (out_h[:, blind].astype(np.float32) == 0).all(), "out must be 0 on rows that see no key"
    seen = lse_h[:, :, ~blind].astype(np.float64)
    if seen.size:
        err = float(np.abs(seen - data["lse_ref"][:, :, ~blind]).max())
        assert err <= LSE_TOL, f"forward lse: max error {err:.3g} > {LSE_TOL}"
    return do, q, k, v, out, lse


def _check_grads(case, data, grads):
    """Shapes, finiteness, exact zeros where no (query, key) pair is visible, FA3's rule for dq, dk, dv."""
    b, sq, sk, h, hk, d, dv = case.batch, case.seqlen_q, case.seqlen_k, case.heads, case.kv_heads, case.hdim, case.dv
    mask = case.mask()
    blind_rows, unseen_keys = ~mask.any(axis=1), ~mask.any(axis=0)
    for name, x, shape in zip(("dq", "dk", "dv"), grads, ((b, sq, h, d), (b, sk, hk, d), (b, sk, hk, dv))):
        assert isinstance(x, cupy.ndarray) and tuple(x.shape) == shape, f"{name}: {type(x)} {x.shape} != {shape}"
        assert np.dtype(x.dtype) == case.np_dtype
        host = _host(x)
        _assert_finite(name, host)
        zero = blind_rows if name == "dq" else unseen_keys
        if zero.any():
            rows = host[:, zero].astype(np.float32)
            assert (rows == 0).all(), (f"{name}: {int((rows != 0).sum())} nonzero values on the {int(zero.sum())} "
                                       f"rows that {'see no key' if name == 'dq' else 'no query sees'}")
        reference.assert_close_fa3(name, host, data[f"{name}_ref"], data[f"{name}_lowp"])


def _params(cases, schedules):
    return [pytest.param(c, s, id=f"{c.id}-{s}") for c in cases for s in schedules]


@pytest.mark.parametrize("case,schedule", _params(CASES + GQA_CASES, POLICIES + (ATOMIC,)))
def test_window_backward(case, schedule):
    data = _data(case)
    do, q, k, v, out, lse = _gpu_forward(case, data)
    _poison_pool(_poison_size(do, q, k, v))
    grads = cupy_dash.attention_backward(do, q, k, v, out, lse, causal=case.causal, window=case.window,
                                         **_schedule_kwargs(schedule))
    cupy_dash.check_errors()
    _check_grads(case, data, grads)


# Small persistent grids: every CTA runs many band columns of several heads back to back (K, V reloaded, dK, dV
# restarted at each change), and KV tiles without visits sit between the heads' runs of columns.
SMALL_GRID_CASES = [WinCase("bf16", 128, True, 1537, 1537, (400, 0), batch=1, heads=3, kv_heads=3),
                    WinCase("bf16", 64, False, 700, 1299, (200, 100), batch=2, heads=4, kv_heads=2),
                    WinCase("bf16", 128, False, 300, 1000, (10, 5), batch=2, heads=2, kv_heads=2)]


@pytest.mark.parametrize("num_ctas", [1, 3, 7])
@pytest.mark.parametrize("case,schedule", _params(SMALL_GRID_CASES, ("fa3", "descending", "shift",
                                                                     "symmetric_shift")))
def test_window_backward_small_grid(case, schedule, num_ctas):
    from cupy_dash import schedule as dash_schedule
    from cupy_dash.cuda import kernels
    from cupy_dash.core.api import _backward_with_plan

    data = _data(case)
    do, q, k, v, out, lse = _gpu_forward(case, data)
    tile = kernels.bwd_tile(case.hdim, case.causal)
    plan = dash_schedule.build(schedule, seqlen_q=case.seqlen_q, seqlen_k=case.seqlen_k, block_m=tile.block_m,
                               block_n=tile.block_n, num_heads=case.batch * case.heads,
                               group_size=case.heads // case.kv_heads, causal=case.causal, num_sms=num_ctas,
                               window=case.window).validate()
    assert 1 <= plan.num_ctas <= num_ctas
    _poison_pool(_poison_size(do, q, k, v))
    grads = _backward_with_plan(do, q, k, v, out, lse, plan=plan, causal=case.causal, window=case.window)
    cupy_dash.check_errors()
    _check_grads(case, data, grads)


@pytest.mark.parametrize("schedule", POLICIES)
def test_unbounded_window_is_bitwise_the_plain_backward(schedule):
    case = WinCase("bf16", 128, True, 1000, 1000, (-1, 0))
    do, q, k, v, out, lse = _gpu_forward(case, _data(case))
    kw = _schedule_kwargs(schedule)
    plain = cupy_dash.attention_backward(do, q, k, v, out, lse, causal=True, **kw)
    same = [cupy_dash.attention_backward(do, q, k, v, out, lse, causal=True, window=w, **kw)
            for w in ((-1, 0), (999, -1), (5000, 0))]                  # left >= Sk - 1 bounds nothing
    cupy_dash.check_errors()
    for grads in same:
        for name, x, e in zip(("dq", "dk", "dv"), grads, plain):
            _assert_same_bits(name, x, e)


DET_CASE = WinCase("bf16", 128, True, 1024, 1024, (300, 0), batch=2, heads=4)


@pytest.mark.parametrize("schedule", POLICIES)
def test_window_backward_bitwise_deterministic(schedule, request):
    rng = np.random.default_rng(_seed(request.node.nodeid))
    c = DET_CASE
    q, do = (_dev(_randn(rng, (c.batch, c.seqlen_q, c.heads, c.hdim), c.np_dtype)) for _ in range(2))
    k, v = (_dev(_randn(rng, (c.batch, c.seqlen_k, c.kv_heads, c.hdim), c.np_dtype)) for _ in range(2))
    out, lse = cupy_dash.attention_forward(q, k, v, causal=c.causal, window=c.window)
    kwargs = dict(_schedule_kwargs(schedule), window=c.window)
    first, counts = _repeat_backward(c, (do, q, k, v, out, lse), kwargs, WINDOW_REPEATS)
    cupy_dash.check_errors()
    for name, x in zip(("dq", "dk", "dv"), first):
        _assert_finite(name, _host(x))
    bad = np.nonzero(counts.any(axis=1))[0]
    assert bad.size == 0, (f"{bad.size} of {WINDOW_REPEATS - 1} repeats differ bitwise from the first (first at "
                           f"repeat {int(bad[0]) + 1}: differing elements dq/dk/dv = {counts[bad[0]].tolist()})")


# The adapters: a window with unseen keys (dk, dv zeroed by the host on the caller's stream) and GQA.
ADAPTER_CASE = WinCase("bf16", 64, False, 300, 1000, (20, 40), heads=4, kv_heads=2)


def test_torch_autograd_window_matches_functional_api():
    torch = pytest.importorskip("torch")
    import cupy_dash.torch as dash_torch
    c, data = ADAPTER_CASE, _data(ADAPTER_CASE)
    device = torch.device("cuda", cupy.cuda.Device().id)
    q, k, v, do = (_torch_from_host(data[n], device) for n in ("q", "k", "v", "do"))
    qg, kg, vg = (x.clone().requires_grad_(True) for x in (q, k, v))
    out = dash_torch.attention(qg, kg, vg, causal=c.causal, window=c.window)
    out.backward(do)
    out2, lse2 = cupy_dash.attention_forward(q, k, v, causal=c.causal, window=c.window)
    dq2, dk2, dv2 = cupy_dash.attention_backward(do, q, k, v, out2, lse2, causal=c.causal, window=c.window)
    cupy_dash.check_errors()
    for name, x, e in (("out", out, out2), ("dq", qg.grad, dq2), ("dk", kg.grad, dk2), ("dv", vg.grad, dv2)):
        _assert_same_bits(name, x, e)
    unseen = ~c.mask().any(axis=0)
    assert unseen.sum() >= 128 and not kg.grad[:, torch.from_numpy(unseen).to(device)].any()
    reference.assert_close_fa3("dk", kg.grad.float().cpu().numpy(), data["dk_ref"], data["dk_lowp"],
                               dtype=c.np_dtype)
    plain = dash_torch.attention(q.clone().requires_grad_(True), k, v, causal=c.causal)
    assert not torch.equal(plain, out), "the window must reach the forward"


def test_jax_vjp_window_matches_functional_api():
    jax = pytest.importorskip("jax")
    import cupy_dash.jax as dash_jax
    c, data = ADAPTER_CASE, _data(ADAPTER_CASE)
    device = jax.devices("gpu")[0]
    q, k, v, do = (jax.device_put(data[n], device) for n in ("q", "k", "v", "do"))
    out, vjp = jax.vjp(lambda q_, k_, v_: dash_jax.attention(q_, k_, v_, causal=c.causal, window=c.window),
                       q, k, v)
    dq, dk, dv = vjp(do)
    out2, lse2 = cupy_dash.attention_forward(q, k, v, causal=c.causal, window=c.window)
    dq2, dk2, dv2 = cupy_dash.attention_backward(do, q, k, v, out2, lse2, causal=c.causal, window=c.window)
    cupy_dash.check_errors()
    for name, x, e in (("out", out, out2), ("dq", dq, dq2), ("dk", dk, dk2), ("dv", dv, dv2)):
        _assert_same_bits(name, x, e)
    reference.assert_close_fa3("dv", np.asarray(dv), data["dv_ref"], data["dv_lowp"])
