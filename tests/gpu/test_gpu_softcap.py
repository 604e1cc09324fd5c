"""Logit soft-capping (``softcap=c``: logits c * tanh(softmax_scale * q.k / c)) through the functional API on the
GPU: the forward and the backward of the DASH_SOFTCAP builds against the float64 reference under FA3's rule (the
low-precision baseline with the same cap), every schedule and the atomic path, head dims 64, 96, 128, 192 and 256
(whose backwards keep the cap's derivative differently: kernels_src/bwd/visit_math.cuh), causal and full, Sq !=
Sk, GQA, a window; from compact schedule tables too (the reference, and the per-visit call's bits); the
deterministic backward repeats its bits; a cap far above every logit gives the uncapped results to rounding; bad
caps raise before any launch. Skipped without a Hopper GPU."""
from __future__ import annotations

import numpy as np
import pytest

import cupy
import cupy_dash
from gpu_helpers import (ATOMIC, DTYPES, POLICIES, _assert_same_bits, _dev, _host, _poison_pool, _poison_size,
                         _randn, _schedule_kwargs, assert_backward_repeats, assert_scaled_forward,
                         assert_scaled_grads, scaled_case_data, scaled_case_id)

pytestmark = pytest.mark.gpu

# (dtype, head dim, causal, Sq, Sk, H, Hkv, window, cap): odd lengths, Sq != Sk both ways, several KV tiles per
# CTA and heads, GQA, a sliding window; caps from Gemma 2's 50 down to 5 (scores of magnitude ~3 x scale bend).
CASES = [
    ("bf16", 128, True, 1000, 1000, 4, 4, (-1, -1), 50.0),
    ("bf16", 128, False, 300, 1000, 4, 2, (-1, -1), 5.0),
    ("fp16", 128, True, 1537, 1299, 2, 1, (-1, -1), 20.0),
    ("bf16", 64, True, 1299, 1299, 4, 4, (-1, -1), 30.0),
    ("fp16", 64, False, 1000, 300, 6, 2, (-1, -1), 5.0),
    ("bf16", 64, True, 2048, 2048, 2, 2, (256, 0), 50.0),
    ("bf16", 256, True, 1000, 1000, 4, 2, (-1, -1), 50.0),   # Gemma 2's head dim and cap
    ("bf16", 256, True, 2048, 2048, 2, 2, (255, 0), 30.0),
    ("fp16", 256, False, 300, 777, 2, 1, (-1, -1), 5.0),
    ("fp16", 192, False, 300, 777, 2, 1, (-1, -1), 5.0),
    ("bf16", 192, True, 1000, 1000, 6, 2, (-1, -1), 30.0),
    ("bf16", (192, 128), False, 777, 1000, 6, 2, (-1, -1), 30.0),   # value head dim 128 with 192
    ("bf16", 128, False, 1299, 1000, 4, 2, (-1, -1), 30.0),   # full from 1024 queries: the 80-query tile
    ("fp16", 128, False, 1100, 1537, 2, 1, (-1, -1), 20.0),
    ("bf16", 96, False, 1100, 1100, 3, 3, (-1, -1), 30.0),
    ("fp16", 96, False, 1100, 1031, 2, 2, (-1, -1), 20.0),   # fp16's head-dim-96 80-query build
    # the other capped builds, one case each (every (dtype, head dim, mask) the dispatcher emits meets the reference)
    ("bf16", 64, False, 1000, 300, 6, 2, (-1, -1), 5.0),
    ("bf16", 96, False, 300, 777, 2, 1, (-1, -1), 5.0),
    ("bf16", 192, False, 300, 777, 2, 1, (-1, -1), 5.0),
    ("bf16", (192, 128), True, 1000, 1000, 6, 2, (-1, -1), 30.0),
    ("bf16", 256, False, 300, 777, 2, 1, (-1, -1), 5.0),
    ("fp16", 64, True, 1299, 1299, 4, 4, (-1, -1), 30.0),
    ("fp16", 96, False, 300, 777, 2, 1, (-1, -1), 5.0),
    ("fp16", 96, True, 1000, 1000, 2, 2, (-1, -1), 50.0),
    ("fp16", 128, False, 300, 1000, 4, 2, (-1, -1), 5.0),
    ("fp16", 192, True, 1000, 1000, 6, 2, (-1, -1), 30.0),
    ("fp16", (192, 128), False, 777, 1000, 6, 2, (-1, -1), 30.0),
    ("fp16", (192, 128), True, 1000, 1000, 6, 2, (-1, -1), 30.0),
    ("fp16", 256, True, 1000, 1000, 4, 2, (-1, -1), 50.0),
]
REPEATS = CASES[:2] + CASES[3:4] + CASES[12:13]
MAG = 3.0       # q, k scaled so that scale * q.k reaches several units and the cap matters


def _id(c):
    return scaled_case_id(c)


def _data(c):
    return scaled_case_data(c, MAG)


@pytest.mark.parametrize("c", CASES, ids=[_id(c) for c in CASES])
def test_forward_matches_reference(c):
    data = _data(c)
    q, k, v = (_dev(data[n]) for n in ("q", "k", "v"))
    _poison_pool(_poison_size(q, k, v))
    out, lse = cupy_dash.attention_forward(q, k, v, **data["kw"])
    assert_scaled_forward(data, out, lse, c[-1])


def _check_backward(c, schedule):
    """Case c's forward, then its backward with ``schedule`` into a poisoned pool, against the reference."""
    data = _data(c)
    q, k, v, do = (_dev(data[n]) for n in ("q", "k", "v", "do"))
    out, lse = cupy_dash.attention_forward(q, k, v, **data["kw"])
    _poison_pool(_poison_size(do, q, k, v))
    grads = cupy_dash.attention_backward(do, q, k, v, out, lse, **data["kw"], **_schedule_kwargs(schedule))
    cupy_dash.check_errors()
    assert_scaled_grads(data, grads)


@pytest.mark.parametrize("schedule", [*POLICIES, ATOMIC])
@pytest.mark.parametrize("c", CASES, ids=[_id(c) for c in CASES])
def test_backward_matches_reference(c, schedule):
    _check_backward(c, schedule)


# Causal calls take the 80-query tile from 8192 queries; forced here on shorter ones (as test_gpu_attention.py's long
# cases do), so that its capped causal builds (bf16 keeps 12 of 20 pairs of 1 - t^2, fp16 4) meet the reference.
CAUSAL80 = [("bf16", 128, True, 1100, 1299, 2, 1, (-1, -1), 30.0),
            ("fp16", 128, True, 1299, 1299, 2, 2, (-1, -1), 20.0),
            ("bf16", 96, True, 1000, 1000, 2, 2, (-1, -1), 50.0),
            ("fp16", 96, True, 1000, 1000, 2, 2, (-1, -1), 20.0)]


@pytest.mark.parametrize("schedule", ["auto", "shift", ATOMIC])
@pytest.mark.parametrize("c", CAUSAL80, ids=[_id(c) for c in CAUSAL80])
def test_causal_80_query_tile_matches_reference(c, schedule, monkeypatch):
    from cupy_dash.cuda import kernels
    monkeypatch.setenv("CUPY_DASH_BWD_CAUSAL_BLOCK_M", "80")
    assert kernels.bwd_tile(c[1], True, seqlen_q=c[3]).block_m == 80
    _check_backward(c, schedule)


# Compact schedule tables (long contexts, or CUPY_DASH_COMPACT_TABLES=1 as here): the capped compact builds, which
# keep every pair of 1 - t^2 in shared memory at head dims 64 and 128 (kernels_src/bwd/visit_math.cuh, kDtPairs).
# Compact builds keep the 64-query tile; the per-visit call they are compared with is held to it.
COMPACT = [CASES[i] for i in (0, 1, 2, 3, 4, 5, 6, 9, 10, 11, 14)]


def _compact_and_per_visit(c, schedule, monkeypatch):
    """Case c's backward from compact tables into a poisoned pool, against the reference; and the per-visit call of
    the same schedule on the 64-query tile (the compact build's "auto": compact_device.KERNEL_AUTO), whose bits
    the compact one must give (but at head dim 192)."""
    from cupy_dash.schedule import compact_device
    data = _data(c)
    q, k, v, do = (_dev(data[n]) for n in ("q", "k", "v", "do"))
    out, lse = cupy_dash.attention_forward(q, k, v, **data["kw"])
    monkeypatch.setenv("CUPY_DASH_BWD_CAUSAL_BLOCK_M", "64")
    monkeypatch.setenv("CUPY_DASH_BWD_FULL_BLOCK_M", "64")
    monkeypatch.setenv(compact_device.ENV, "1")
    _poison_pool(_poison_size(do, q, k, v))
    compact = cupy_dash.attention_backward(do, q, k, v, out, lse, **data["kw"], **_schedule_kwargs(schedule))
    cupy_dash.check_errors()
    assert_scaled_grads(data, compact)
    monkeypatch.setenv(compact_device.ENV, "0")
    same = compact_device.KERNEL_AUTO if schedule == "auto" else schedule
    per_visit = cupy_dash.attention_backward(do, q, k, v, out, lse, **data["kw"], **_schedule_kwargs(same))
    cupy_dash.check_errors()
    return compact, per_visit


@pytest.mark.parametrize("schedule", ["auto", "shift", ATOMIC])
@pytest.mark.parametrize("c", COMPACT, ids=[_id(c) for c in COMPACT])
def test_compact_tables_match_reference_and_per_visit_bits(c, schedule, monkeypatch):
    compact, per_visit = _compact_and_per_visit(c, schedule, monkeypatch)
    head_dim = c[1][0] if isinstance(c[1], tuple) else c[1]
    if schedule != ATOMIC and head_dim != 192:   # head dim 192's compact tables have a tile of their own (96 x 64)
        for name, a, e in zip(("dq", "dk", "dv"), compact, per_visit):
            _assert_same_bits(name, a, e)


@pytest.mark.parametrize("c", REPEATS, ids=[_id(c) for c in REPEATS])
def test_deterministic_backward_repeats_its_bits(c):
    data = _data(c)
    q, k, v, do = (_dev(data[n]) for n in ("q", "k", "v", "do"))
    out, lse = cupy_dash.attention_forward(q, k, v, **data["kw"])
    assert_backward_repeats((do, q, k, v, out, lse), data["kw"], 20)


@pytest.mark.parametrize("d", [64, 96, 128])
def test_a_cap_above_every_logit_changes_nothing_but_rounding(d):
    """With c = 1e4 tanh(x / c) * c = x to ~1e-9 relative: the capped builds must agree with the plain ones to
    the rounding of their inputs' precision and the kernels' tanh approximation (relative error at most 2^-11;
    logits of a few units: lse within 5e-3)."""
    rng = np.random.default_rng(d)
    q, k, v, do = (_dev(_randn(rng, (2, 777, 2, d), DTYPES["bf16"])) for _ in range(4))
    plain = cupy_dash.attention_forward(q, k, v, causal=True)
    capped = cupy_dash.attention_forward(q, k, v, causal=True, softcap=1e4)
    np.testing.assert_allclose(_host(capped[0]).astype(np.float32), _host(plain[0]).astype(np.float32), atol=2e-2)
    np.testing.assert_allclose(_host(capped[1]), _host(plain[1]), atol=5e-3)
    g_plain = cupy_dash.attention_backward(do, q, k, v, *plain, causal=True)
    g_capped = cupy_dash.attention_backward(do, q, k, v, *capped, causal=True, softcap=1e4)
    for a, b in zip(g_capped, g_plain):
        a, b = _host(a).astype(np.float32), _host(b).astype(np.float32)
        assert np.abs(a - b).max() <= 2e-2 * max(1.0, float(np.abs(b).max()))


@pytest.mark.parametrize("bad,error", [(-1.0, ValueError), (float("nan"), ValueError), (float("inf"), ValueError),
                                       (True, TypeError), ("50", TypeError)])
def test_bad_caps_raise_naming_softcap(bad, error):
    q = cupy.zeros((1, 16, 1, 64), dtype=cupy.float16)
    with pytest.raises(error, match="softcap"):
        cupy_dash.attention_forward(q, q, q, softcap=bad)
    with pytest.raises(error, match="softcap"):
        cupy_dash.attention_backward(q, q, q, q, q, cupy.zeros((1, 1, 16), cupy.float32), softcap=bad)


@pytest.mark.parametrize("d", [64, 96, 128])
def test_varlen_gives_each_sequence_the_bits_of_its_fixed_length_call(d):
    """Packed sequences with a cap: every sequence's out, lse and (schedule "descending": dQ tiles add in KV-tile
    order) dq, dk, dv are bitwise those of the fixed-length capped call on it alone."""
    rng = np.random.default_rng(100 + d)
    lens = [300, 1, 129, 777]
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    total, h, hkv, cap = int(cu[-1]), 4, 2, 10.0
    q, do = (_dev((MAG * _randn(rng, (total, h, d), np.float32)).astype(DTYPES["bf16"])) for _ in range(2))
    k, v = (_dev((MAG * _randn(rng, (total, hkv, d), np.float32)).astype(DTYPES["bf16"])) for _ in range(2))
    cu_dev = cupy.asarray(cu)
    kw = dict(causal=True, softcap=cap)
    out, lse = cupy_dash.attention_forward_varlen(q, k, v, cu_dev, cu_dev, max(lens), max(lens), **kw)
    grads = cupy_dash.attention_backward_varlen(do, q, k, v, out, lse, cu_dev, cu_dev, max(lens), max(lens),
                                                schedule="descending", **kw)
    for b, (a, z) in enumerate(zip(cu[:-1], cu[1:])):
        one = [x[a:z][None] for x in (q, k, v, do)]
        o1, l1 = cupy_dash.attention_forward(*one[:3], **kw)
        _assert_same_bits(f"out[{b}]", out[a:z], o1[0])
        _assert_same_bits(f"lse[{b}]", lse[:, a:z], l1[0])
        g1 = cupy_dash.attention_backward(one[3], *one[:3], o1, l1, schedule="descending", **kw)
        for name, g, want in zip(("dq", "dk", "dv"), grads, g1):
            _assert_same_bits(f"{name}[{b}]", g[a:z], want[0])
    cupy_dash.check_errors()


@pytest.mark.parametrize("d", [64, 128])
def test_torch_and_jax_give_the_functional_bits(d):
    """The logit cap through cupy_dash.torch.attention (eager autograd) and cupy_dash.jax.attention under jax.jit
    and jax.grad: out and the gradients bitwise those of the functional API on the same inputs."""
    rng = np.random.default_rng(200 + d)
    host = [(MAG * _randn(rng, (2, 333, 4, d), np.float32)).astype(DTYPES["bf16"]) for _ in range(2)]
    host += [_randn(rng, (2, 333, 2, d), DTYPES["bf16"]) for _ in range(2)]
    q_h, do_h, k_h, v_h = host
    kw = dict(causal=True, softcap=7.0)
    q, k, v, do = (_dev(x) for x in (q_h, k_h, v_h, do_h))
    out, lse = cupy_dash.attention_forward(q, k, v, **kw)
    want = (out, *cupy_dash.attention_backward(do, q, k, v, out, lse, **kw))
    cupy_dash.check_errors()
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        import cupy_dash.torch as ct
        tq, tk, tv = (torch.from_dlpack(x).clone().requires_grad_(True) for x in (q, k, v))
        t_out = ct.attention(tq, tk, tv, **kw)
        t_out.backward(torch.from_dlpack(do))
        for name, a, b in zip(("out", "dq", "dk", "dv"), (t_out, tq.grad, tk.grad, tv.grad), want):
            _assert_same_bits(f"torch {name}", a.detach(), b)
    jax = pytest.importorskip("jax")
    try:
        device = jax.devices("gpu")[0]
    except RuntimeError:
        pytest.skip("JAX has no GPU backend")
    import cupy_dash.jax as cj
    jq, jk, jv, jdo = (jax.device_put(x, device) for x in (q_h, k_h, v_h, do_h))
    j_out, vjp = jax.vjp(jax.jit(lambda a, b, c: cj.attention(a, b, c, **kw)), jq, jk, jv)
    j_grads = vjp(jdo)
    for name, a, b in zip(("out", "dq", "dk", "dv"), (j_out, *j_grads), want):
        _assert_same_bits(f"jax {name}", a, b)
