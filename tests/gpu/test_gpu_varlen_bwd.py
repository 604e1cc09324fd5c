"""GPU tests of the varlen backward (cupy_dash.attention_backward_varlen; need an NVIDIA Hopper GPU): against the
float64 reference per sequence (FA3's tolerance rule) for every schedule; with the `fa3` and `descending`
schedules (dQ tiles add in KV-tile order, KV columns walk a fixed Q-tile order) each sequence's gradients are
those of cupy_dash.attention_backward on that sequence alone, bit for bit up to the sign of exact zeros (the
last tile of a sequence multiplies its masked zeros by the next sequence's rows where the padded batch
multiplies them by zero-filled rows); empty and one-token sequences, GQA, windows, host or device cu_seqlens,
bitwise repeats."""
from __future__ import annotations

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")
import cupy_dash  # noqa: E402
from cupy_dash import reference  # noqa: E402

from gpu_helpers import BF16, LENGTHS, _dev, _host  # noqa: E402

pytestmark = pytest.mark.gpu
POLICIES = ("fa3", "descending", "shift", "symmetric_shift", "auto")


def _zero_signless_bits(a):
    """int16 bits of a bf16 / fp16 host array with -0 mapped to +0."""
    bits = np.ascontiguousarray(a).view(np.int16).copy()
    bits[(bits & 0x7FFF) == 0] = 0
    return bits


def _same_tile_alone(monkeypatch, hdim, causal, window, longest):
    """Holds the fixed-length calls of one sequence alone to the tile of the varlen batch (kernels.bwd_tile: the
    batch takes it by its longest sequence, a call alone by its own length), through the knob that forces it."""
    from cupy_dash.cuda import kernels
    if hdim in (96, 128):
        tile = kernels.bwd_tile(hdim, causal, seqlen_q=kernels.varlen_tile_seqlen(longest), window=window)
        monkeypatch.setenv("CUPY_DASH_BWD_CAUSAL_BLOCK_M" if causal else "CUPY_DASH_BWD_FULL_BLOCK_M",
                           str(tile.block_m))


def _problem(lengths, hdim, causal, window, H=4, Hkv=2, seed=0, dtype=BF16):
    """``hdim``: the head dim, or (q / k's, v's) where they differ."""
    lq, lk = LENGTHS[lengths]
    if causal and window[1] > 0:
        window = (window[0], 0)
    hdim, hdim_v = hdim if isinstance(hdim, tuple) else (hdim, hdim)
    rng = np.random.default_rng(seed + len(lq) * 1000 + hdim)
    q, do = (rng.standard_normal((sum(lq), H, d), dtype=np.float32).astype(dtype) for d in (hdim, hdim_v))
    k, v = (rng.standard_normal((sum(lk), Hkv, d), dtype=np.float32).astype(dtype) for d in (hdim, hdim_v))
    cu_q, cu_k = (np.concatenate([[0], np.cumsum(x)]).astype(np.int32) for x in (lq, lk))
    dq_, dk_, dv_, do_ = _dev(q), _dev(k), _dev(v), _dev(do)
    cq, ck = cupy.asarray(cu_q), cupy.asarray(cu_k)
    out, lse = cupy_dash.attention_forward_varlen(dq_, dk_, dv_, cq, ck, max(lq), max(lk), causal=causal,
                                                  window=window)
    host = dict(q=q, k=k, v=v, do=do, out=_host(out), lse=_host(lse), cu_q=cu_q, cu_k=cu_k, lq=lq, lk=lk)
    dev = (do_, dq_, dk_, dv_, out, lse, cq, ck, max(lq), max(lk))
    return host, dev, window


def _poison():
    buf = cupy.empty(256 << 20, dtype=cupy.uint8)
    buf.fill(0xFF)                                           # unwritten outputs would be NaN
    del buf


def _sequences(h):
    for b, (sq, sk) in enumerate(zip(h["lq"], h["lk"])):
        rq = slice(int(h["cu_q"][b]), int(h["cu_q"][b + 1]))
        rk = slice(int(h["cu_k"][b]), int(h["cu_k"][b + 1]))
        yield b, sq, sk, rq, rk


@pytest.mark.parametrize("schedule", POLICIES)
@pytest.mark.parametrize("window", [(-1, -1), (100, 50)], ids=["nowindow", "window"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("hdim", [64, 128])
@pytest.mark.parametrize("lengths", list(LENGTHS), ids=str)
def test_varlen_backward_per_sequence(lengths, hdim, causal, window, schedule, monkeypatch):
    h, dev, window = _problem(lengths, hdim, causal, window)
    _same_tile_alone(monkeypatch, hdim, causal, window, max(LENGTHS[lengths][0]))
    _poison()
    dq, dk, dv = cupy_dash.attention_backward_varlen(*dev, causal=causal, window=window, schedule=schedule)
    cupy_dash.check_errors()
    dq_h, dk_h, dv_h = _host(dq), _host(dk), _host(dv)
    assert dq_h.shape == h["q"].shape and dk_h.shape == h["k"].shape and dv_h.shape == h["v"].shape
    for b, sq, sk, rq, rk in _sequences(h):
        if sq == 0 or sk == 0:                               # nothing seen: zero gradients
            for name, a, rows in (("dq", dq_h, rq), ("dk", dk_h, rk), ("dv", dv_h, rk)):
                assert (a[rows].astype(np.float32) == 0).all(), f"sequence {b}: {name} not zero"
            continue
        qb, kb, vb, dob = (h[n][None, r] for n, r in (("q", rq), ("k", rk), ("v", rk), ("do", rq)))
        outb, lseb = h["out"][None, rq], np.ascontiguousarray(h["lse"][None, :, rq])
        if schedule in ("fa3", "descending"):                # bits of the sequence alone
            want = cupy_dash.attention_backward(_dev(dob), _dev(qb), _dev(kb), _dev(vb), _dev(outb),
                                                cupy.asarray(lseb), causal=causal, window=window,
                                                schedule=schedule)
            for name, a, rows, w in zip(("dq", "dk", "dv"), (dq_h, dk_h, dv_h), (rq, rk, rk), want):
                got, exp = _zero_signless_bits(a[rows]), _zero_signless_bits(_host(w)[0])
                assert (got == exp).all(), f"sequence {b}: {name}: {int((got != exp).sum())} elements differ"
        if sq * sk <= 300 * 1000 or b == 0:                  # float64 reference (bounded host time)
            ref = reference.backward(dob, qb, kb, vb, outb, lseb, causal=causal, window=window)
            lowp = reference.backward_lowp(dob, qb, kb, vb, outb, lseb, causal=causal, window=window, dtype=BF16)
            for name, a, rows, r64, rlp in zip(("dq", "dk", "dv"), (dq_h, dk_h, dv_h), (rq, rk, rk), ref, lowp):
                reference.assert_close_fa3(f"sequence {b}: {name}", a[None, rows], r64, rlp)


@pytest.mark.parametrize("schedule", ["fa3", "auto"])
@pytest.mark.parametrize("window", [(-1, -1), (100, 50)], ids=["nowindow", "window"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("lengths", list(LENGTHS), ids=str)
@pytest.mark.parametrize("hdim", [96, 192, 256, (192, 128)], ids=["d96", "d192", "d256", "d192v128"])
def test_varlen_backward_per_sequence_other_head_dims(hdim, lengths, causal, window, schedule, monkeypatch):
    """Head dim 96 (the head-dim-128 kernels padded), 192 and 256 (the warpgroups split the head dim), value head dim
    128 with 192: the checks of test_varlen_backward_per_sequence."""
    test_varlen_backward_per_sequence(lengths, hdim, causal, window, schedule, monkeypatch)


@pytest.mark.parametrize("schedule", ["auto", "fa3"])
def test_varlen_backward_bits_repeat_and_host_cu_seqlens(schedule):
    h, dev, window = _problem("mixed", 128, True, (-1, -1), H=8, Hkv=8, seed=7)
    first = cupy_dash.attention_backward_varlen(*dev, causal=True, schedule=schedule)
    for i in range(10):
        again = cupy_dash.attention_backward_varlen(*dev, causal=True, schedule=schedule)
        for name, a, e in zip(("dq", "dk", "dv"), again, first):
            assert bool((a.view(cupy.int16) == e.view(cupy.int16)).all()), f"repeat {i}: {name} differs"
    host_cu = (*dev[:6], h["cu_q"], list(h["cu_k"]), *dev[8:])  # host cu_seqlens: same table, same bits
    again = cupy_dash.attention_backward_varlen(*host_cu, causal=True, schedule=schedule)
    for name, a, e in zip(("dq", "dk", "dv"), again, first):
        assert bool((a.view(cupy.int16) == e.view(cupy.int16)).all()), f"host cu_seqlens: {name} differs"
    cupy_dash.check_errors()


def test_new_packing_every_step_never_synchronizes(monkeypatch):
    """Training with new lengths at every step: more packings than the device-table cache holds, so every call
    evicts one; evicted tables are freed by events, not by a device synchronization, and each call still gives
    the bits of a call on a fresh cache."""
    from cupy_dash.cuda import device_tables
    rng = np.random.default_rng(5)
    H, D, total = 4, 64, 1536
    q, k, v, do = (_dev(rng.standard_normal((total, H, D), dtype=np.float32).astype(BF16)) for _ in range(4))
    packings = []
    for _ in range(device_tables._LIMITS["varlen"] + 8):
        cuts = np.sort(rng.choice(np.arange(1, total), size=5, replace=False))
        packings.append(np.concatenate([[0], cuts, [total]]).astype(np.int32))
    firsts = []
    syncs = []
    real_sync = cupy.cuda.runtime.deviceSynchronize
    monkeypatch.setattr(cupy.cuda.runtime, "deviceSynchronize", lambda: syncs.append(1) or real_sync())
    for cu in packings:
        lens = np.diff(cu)
        args = (cu, cu, int(lens.max()), int(lens.max()))
        out, lse = cupy_dash.attention_forward_varlen(q, k, v, cupy.asarray(cu), cupy.asarray(cu), *args[2:],
                                                      causal=True)
        firsts.append((out, lse, cupy_dash.attention_backward_varlen(do, q, k, v, out, lse, *args, causal=True)))
    assert not syncs, f"{len(syncs)} device synchronizations in {len(packings)} steps"
    monkeypatch.undo()
    cupy_dash.check_errors()
    for cu, (out, lse, grads) in zip(packings, firsts):
        lens = np.diff(cu)
        again = cupy_dash.attention_backward_varlen(do, q, k, v, out, lse, cu, cu, int(lens.max()),
                                                    int(lens.max()), causal=True)
        for name, a, e in zip(("dq", "dk", "dv"), again, grads):
            assert bool((a.view(cupy.int16) == e.view(cupy.int16)).all()), f"{name} differs after evictions"
    cupy_dash.check_errors()


def test_varlen_backward_many_sequences_several_heads():
    """A batch whose table puts several KV tiles, heads and sequences on each CTA: 64 sequences, GQA 4."""
    rng = np.random.default_rng(11)
    lq = [int(x) for x in rng.integers(1, 700, size=64)]
    H, Hkv, D = 8, 2, 128
    q, do = (rng.standard_normal((sum(lq), H, D), dtype=np.float32).astype(BF16) for _ in range(2))
    k, v = (rng.standard_normal((sum(lq), Hkv, D), dtype=np.float32).astype(BF16) for _ in range(2))
    cu = np.concatenate([[0], np.cumsum(lq)]).astype(np.int32)
    args = (_dev(q), _dev(k), _dev(v), cupy.asarray(cu), cupy.asarray(cu), max(lq), max(lq))
    out, lse = cupy_dash.attention_forward_varlen(*args, causal=True)
    dq, dk, dv = cupy_dash.attention_backward_varlen(_dev(do), *args[:3], out, lse, *args[3:], causal=True)
    cupy_dash.check_errors()
    out_h, lse_h, grads = _host(out), _host(lse), [_host(x) for x in (dq, dk, dv)]
    for b in (0, 17, 63):
        r = slice(int(cu[b]), int(cu[b + 1]))
        args_b = (do[None, r], q[None, r], k[None, r], v[None, r], out_h[None, r],
                  np.ascontiguousarray(lse_h[None, :, r]))
        ref = reference.backward(*args_b, causal=True)
        lowp = reference.backward_lowp(*args_b, causal=True, dtype=BF16)
        for name, a, r64, rlp in zip(("dq", "dk", "dv"), grads, ref, lowp):
            reference.assert_close_fa3(f"sequence {b}: {name}", a[None, r], r64, rlp)


def test_varlen_backward_rejects_bad_cu_seqlens():
    h, dev, _ = _problem("mixed", 64, False, (-1, -1))
    bad = h["cu_q"].copy()
    bad[3] = bad[2] - 1                                      # decreasing
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        cupy_dash.attention_backward_varlen(*dev[:6], cupy.asarray(bad), *dev[7:])
    short = h["cu_k"][:-1]
    with pytest.raises(ValueError, match="cu_seqlens_k"):
        cupy_dash.attention_backward_varlen(*dev[:7], short, *dev[8:])
    with pytest.raises(ValueError, match="max_seqlen_q"):
        cupy_dash.attention_backward_varlen(*dev[:8], 100, dev[9])


def test_torch_varlen_ops_match_the_functional_api():
    """cupy_dash.torch.attention_varlen under autograd gives the bits of the functional varlen forward and
    backward on the same torch tensors (device cu_seqlens)."""
    torch = pytest.importorskip("torch")
    import cupy_dash.torch as dash_torch
    h, _, _ = _problem("empty_and_unequal", 128, True, (-1, -1))

    def dev(a, grad=False):
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16).cuda().requires_grad_(grad)
    q, k, v = (dev(h[n], True) for n in ("q", "k", "v"))
    do = dev(h["do"])
    cu_q, cu_k = (torch.from_numpy(h[n]).cuda() for n in ("cu_q", "cu_k"))
    args = (cu_q, cu_k, max(h["lq"]), max(h["lk"]))
    from cupy_dash.core import varlen_host_cu
    before = varlen_host_cu.stats()
    out = dash_torch.attention_varlen(q, k, v, *args, causal=True, schedule="fa3")
    out.backward(do)
    # the backward took the forward's asynchronous host copy of both cu_seqlens (no synchronizing copy)
    after = varlen_host_cu.stats()
    assert after["hits"] >= before["hits"] + 2 and after["misses"] == before["misses"]
    want_out, lse = cupy_dash.attention_forward_varlen(q.detach(), k.detach(), v.detach(), *args, causal=True)
    want = cupy_dash.attention_backward_varlen(do, q.detach(), k.detach(), v.detach(), want_out, lse, *args,
                                               causal=True, schedule="fa3")
    assert torch.equal(out.detach().view(torch.int16), want_out.view(torch.int16))
    for name, got, w in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad), want):
        assert torch.equal(got.view(torch.int16), w.view(torch.int16)), name
    cupy_dash.check_errors()


@pytest.mark.parametrize("schedule", POLICIES)
@pytest.mark.parametrize("lengths", list(LENGTHS), ids=str)
def test_device_expanded_tables_same_bits_as_host_ones(lengths, schedule, monkeypatch):
    """The default: the host uploads compact records and kernels_src/bwd_expand.cu writes the per-visit table on
    the GPU; the main kernel then gives the bits of the table expanded on the host (CUPY_DASH_VARLEN_EXPAND=host)."""
    from cupy_dash.cuda import varlen_device
    _, dev, window = _problem(lengths, 128, True, (300, 0), seed=4)
    kw = dict(causal=True, window=window, schedule=schedule)
    monkeypatch.setenv("CUPY_DASH_COMPACT_TABLES", "0")
    monkeypatch.setenv(varlen_device.EXPAND_ENV, "host")
    want = cupy_dash.attention_backward_varlen(*dev, **kw)
    monkeypatch.delenv(varlen_device.EXPAND_ENV)
    for _ in range(2):                                       # the second call reads the cached tables
        got = cupy_dash.attention_backward_varlen(*dev, **kw)
        for name, a, e in zip(("dq", "dk", "dv"), got, want):
            assert bool((a.view(cupy.int16) == e.view(cupy.int16)).all()), f"{name} differs"
    cupy_dash.check_errors()


@pytest.mark.parametrize("schedule", POLICIES)
@pytest.mark.parametrize("lengths", list(LENGTHS), ids=str)
def test_compact_varlen_tables_same_bits_as_per_visit(lengths, schedule, monkeypatch):
    """The DASH_COMPACT + DASH_VARLEN build (CUPY_DASH_COMPACT_TABLES=1) reads the same schedule from per-column
    records: same visits in the same order, same ranks, hence the per-visit build's bits."""
    _, dev, window = _problem(lengths, 128, True, (300, 0), seed=3)
    kw = dict(causal=True, window=window, schedule=schedule)
    monkeypatch.setenv("CUPY_DASH_COMPACT_TABLES", "0")
    want = cupy_dash.attention_backward_varlen(*dev, **kw)
    monkeypatch.setenv("CUPY_DASH_COMPACT_TABLES", "1")
    for _ in range(2):                                       # the second call reads the cached tables
        got = cupy_dash.attention_backward_varlen(*dev, **kw)
        for name, a, e in zip(("dq", "dk", "dv"), got, want):
            assert bool((a.view(cupy.int16) == e.view(cupy.int16)).all()), f"{name} differs"
    cupy_dash.check_errors()


@pytest.mark.parametrize("mechanism", ["ffi", "callback"])
def test_jax_varlen_matches_the_functional_api(mechanism, monkeypatch):
    """cupy_dash.jax.attention_varlen under jax.jit(jax.grad) gives the bits of the eager varlen forward and
    backward (same kernels, same schedule table), through the C handler or the Python callbacks."""
    jax = pytest.importorskip("jax")
    import cupy_dash.jax as cj
    monkeypatch.setenv("CUPY_DASH_JAX_FFI", "1" if mechanism == "ffi" else "0")
    jax.clear_caches()
    h, _, _ = _problem("empty_and_unequal", 128, True, (-1, -1))
    q, k, v, do = (jax.device_put(h[n]) for n in ("q", "k", "v", "do"))
    args = (h["cu_q"], h["cu_k"], max(h["lq"]), max(h["lk"]))
    jnp = jax.numpy

    def loss(q, k, v):
        out = cj.attention_varlen(q, k, v, *args, causal=True, schedule="fa3")
        return jnp.sum(out.astype(jnp.float32) * do.astype(jnp.float32))
    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    out, lse = cupy_dash.attention_forward_varlen(q, k, v, cupy.asarray(h["cu_q"]), cupy.asarray(h["cu_k"]),
                                                  *args[2:], causal=True)
    # the loss's cotangent of out is do rounded to bf16 by the astype: the same dout as the eager call's
    want = cupy_dash.attention_backward_varlen(do, q, k, v, out, lse, *args, causal=True, schedule="fa3")
    cupy_dash.check_errors()
    for name, g, w in zip(("dq", "dk", "dv"), grads, want):
        assert (np.asarray(g).view(np.int16) == np.asarray(w).view(np.int16)).all(), name
    # cu_seqlens as JAX arrays (cupy_dash.jax.varlen_dyn): one program, the same bits, and a second packing
    traces = []

    def loss_dyn(q, k, v, cu_q, cu_k):
        traces.append(1)
        out = cj.attention_varlen(q, k, v, cu_q, cu_k, *args[2:], causal=True, schedule="fa3")
        return jnp.sum(out.astype(jnp.float32) * do.astype(jnp.float32))
    step = jax.jit(jax.grad(loss_dyn, argnums=(0, 1, 2)))
    cus = (jnp.asarray(h["cu_q"], jnp.int32), jnp.asarray(h["cu_k"], jnp.int32))
    dyn = step(q, k, v, *cus)
    for name, g, w in zip(("dq", "dk", "dv"), dyn, want):
        assert (np.asarray(g).view(np.int16) == np.asarray(w).view(np.int16)).all(), f"traced lengths: {name}"
    B = len(h["cu_q"]) - 1                               # another packing of the same sizes: no new trace
    other = [np.round(np.linspace(0, int(c[-1]), B + 1)).astype(np.int32) for c in (h["cu_q"], h["cu_k"])]
    dyn2 = step(q, k, v, *(jnp.asarray(c) for c in other))
    out2, lse2 = cupy_dash.attention_forward_varlen(q, k, v, *(cupy.asarray(c) for c in other), *args[2:],
                                                    causal=True)
    want2 = cupy_dash.attention_backward_varlen(do, q, k, v, out2, lse2, *other, *args[2:], causal=True,
                                                schedule="fa3")
    cupy_dash.check_errors()
    assert len(traces) == 1
    for name, g, w in zip(("dq", "dk", "dv"), dyn2, want2):
        assert (np.asarray(g).view(np.int16) == np.asarray(w).view(np.int16)).all(), f"second packing: {name}"


@pytest.mark.parametrize("hdim", [64, 96, 128, 192, 256, (192, 128)], ids=str)
def test_varlen_backward_fp16(hdim):
    """fp16 inputs: the fp16 varlen kernels against the float64 reference and, with fa3, the sequence alone."""
    h, dev, _ = _problem("mixed", hdim, True, (-1, -1), seed=9, dtype=np.float16)
    dq, dk, dv = cupy_dash.attention_backward_varlen(*dev, causal=True, schedule="fa3")
    cupy_dash.check_errors()
    grads = [cupy.asnumpy(x) for x in (dq, dk, dv)]
    for b, sq, sk, rq, rk in _sequences(h):
        qb, kb, vb, dob = (h[n][None, r] for n, r in (("q", rq), ("k", rk), ("v", rk), ("do", rq)))
        outb, lseb = h["out"][None, rq], np.ascontiguousarray(h["lse"][None, :, rq])
        want = cupy_dash.attention_backward(*(cupy.asarray(x) for x in (dob, qb, kb, vb, outb, lseb)), causal=True,
                                            schedule="fa3")
        ref = reference.backward(dob, qb, kb, vb, outb, lseb, causal=True)
        lowp = reference.backward_lowp(dob, qb, kb, vb, outb, lseb, causal=True, dtype=np.float16)
        for name, a, rows, w, r64, rlp in zip(("dq", "dk", "dv"), grads, (rq, rk, rk), want, ref, lowp):
            got, exp = _zero_signless_bits(a[rows]), _zero_signless_bits(cupy.asnumpy(w)[0])
            assert (got == exp).all(), f"sequence {b}: {name}"
            reference.assert_close_fa3(f"sequence {b}: {name}", a[None, rows], r64, rlp)


def test_torch_varlen_fast_path_gives_the_full_paths_bits(monkeypatch):
    """A repeated varlen backward with torch tensors (host or forward-copied device cu_seqlens) is served by
    cupy_dash.core.fastpath_varlen with the bits of the full path; other lengths miss."""
    torch = pytest.importorskip("torch")
    from cupy_dash.core import fastpath_varlen
    h, _, _ = _problem("mixed", 128, True, (-1, -1), H=8, Hkv=2, seed=3)

    def dev(a):
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16).cuda()
    q, k, v, do = (dev(h[n]) for n in ("q", "k", "v", "do"))
    lens = (max(h["lq"]), max(h["lk"]))
    cu_dev = [torch.from_numpy(h[n]).cuda() for n in ("cu_q", "cu_k")]
    fastpath_varlen.clear()
    out, lse = cupy_dash.attention_forward_varlen(q, k, v, *cu_dev, *lens, causal=True)
    fwd_hits = fastpath_varlen.stats()["fwd_hits"]
    for _ in range(3):                                       # the forward's fast path: same bits
        out2, lse2 = cupy_dash.attention_forward_varlen(q, k, v, *cu_dev, *lens, causal=True)
        assert torch.equal(out2.view(torch.int16), out.view(torch.int16)) and torch.equal(lse2, lse)
    assert fastpath_varlen.stats()["fwd_hits"] == fwd_hits + 3
    for cu in ((h["cu_q"], h["cu_k"]), tuple(cu_dev)):
        full = cupy_dash.attention_backward_varlen(do, q, k, v, out, lse, *cu, *lens, causal=True)
        hits = fastpath_varlen.stats()["hits"]
        fast = [cupy_dash.attention_backward_varlen(do, q, k, v, out, lse, *cu, *lens, causal=True)
                for _ in range(3)]
        assert fastpath_varlen.stats()["hits"] == hits + 3
        for again in fast:
            for name, a, e in zip(("dq", "dk", "dv"), again, full):
                assert torch.equal(a.view(torch.int16), e.view(torch.int16)), name
    monkeypatch.setenv("CUPY_DASH_FASTPATH", "0")
    off = cupy_dash.attention_backward_varlen(do, q, k, v, out, lse, h["cu_q"], h["cu_k"], *lens, causal=True)
    for name, a, e in zip(("dq", "dk", "dv"), off, full):
        assert torch.equal(a.view(torch.int16), e.view(torch.int16)), name
    cupy_dash.check_errors()


@pytest.mark.parametrize("schedule", ["auto", "fa3", "symmetric_shift"])
def test_torch_new_packings_from_the_template_give_the_full_paths_bits(schedule, monkeypatch):
    """A new packing of the same torch tensors each call (a training step's): served from the first call's
    template (cupy_dash.core.fastpath_varlen: lengths checked, table built, block rebased), with the bits the full path
    (CUPY_DASH_FASTPATH=0) gives the same packing; a repeated packing then hits its own plan."""
    torch = pytest.importorskip("torch")
    from cupy_dash.core import fastpath_varlen
    total, H, Hkv, D = 4096, 8, 2, 128
    g = torch.Generator(device="cuda").manual_seed(11)
    q, do = (torch.randn(total, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    k, v = (torch.randn(total, Hkv, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    rng = np.random.default_rng(5)
    packings = []
    for b in (3, 1, 7, 16, 5):
        cuts = np.sort(rng.choice(np.arange(1, total), b - 1, replace=False))
        packings.append(np.concatenate([[0], cuts, [total]]).astype(np.int32))
    kw = dict(causal=True, schedule=schedule)
    fastpath_varlen.clear()
    for i, cu in enumerate(packings):
        m = int(np.diff(cu).max())                          # each packing's own max_seqlen, as a data loader's
        cu_dev = torch.from_numpy(cu).cuda()
        out, lse = cupy_dash.attention_forward_varlen(q, k, v, cu_dev, cu_dev, m, m, causal=True)
        new = fastpath_varlen.stats()["new_packing_hits"]
        fast = cupy_dash.attention_backward_varlen(do, q, k, v, out, lse, cu, cu, m, m, **kw)
        assert fastpath_varlen.stats()["new_packing_hits"] == new + (i > 0)
        hits = fastpath_varlen.stats()["hits"]
        again = cupy_dash.attention_backward_varlen(do, q, k, v, out, lse, cu, cu, m, m, **kw)
        assert fastpath_varlen.stats()["hits"] == hits + 1
        with monkeypatch.context() as mp:
            mp.setenv("CUPY_DASH_FASTPATH", "0")
            full = cupy_dash.attention_backward_varlen(do, q, k, v, out, lse, cu, cu, m, m, **kw)
        for name, a, b, e in zip(("dq", "dk", "dv"), fast, again, full):
            assert torch.equal(a.view(torch.int16), e.view(torch.int16)), f"packing {i}: {name}"
            assert torch.equal(b.view(torch.int16), e.view(torch.int16)), f"packing {i}: {name} (repeat)"
    cupy_dash.check_errors()


def test_prepared_table_from_another_thread(monkeypatch):
    """prepare_varlen_backward from a second thread (its own stream) uploads the table; the backward on this
    thread's stream then builds nothing and gives the bits of an unprepared call."""
    import threading
    from cupy_dash.schedule import varlen as varlen_schedule
    h, dev, window = _problem("mixed", 128, True, (-1, -1), H=8, Hkv=2, seed=12)
    do, q, k, v, out, lse, cq, ck, mq, mk = dev
    want = cupy_dash.attention_backward_varlen(*dev, causal=True, schedule="symmetric_shift")
    cupy_dash.check_errors()
    other = [h["cu_q"], h["cu_k"]]
    other = [np.concatenate([c[:1], c[1:] + 0]) for c in other]       # the same lengths, new arrays
    from cupy_dash.cuda import device_tables, varlen_device
    varlen_device._plans.clear()
    device_tables._caches["varlen"].clear()
    errors_seen = []

    def prepare():
        try:
            cupy_dash.prepare_varlen_backward(*other, mq, mk, num_heads=8, num_heads_kv=2, head_dim=128,
                                              dtype="bfloat16", causal=True, schedule="symmetric_shift")
        except Exception as e:                                   # pragma: no cover - reported below
            errors_seen.append(e)
    worker = threading.Thread(target=prepare)
    worker.start()
    worker.join()
    assert not errors_seen, errors_seen
    builds = []
    real = varlen_schedule.build_varlen
    monkeypatch.setattr(varlen_schedule, "build_varlen", lambda *a, **kw: builds.append(1) or real(*a, **kw))
    got = cupy_dash.attention_backward_varlen(do, q, k, v, out, lse, *other, mq, mk, causal=True,
                                              schedule="symmetric_shift")
    cupy_dash.check_errors()
    assert not builds
    for name, a, e in zip(("dq", "dk", "dv"), got, want):
        assert bool((a.view(cupy.int16) == e.view(cupy.int16)).all()), name


def test_torch_packings_of_either_tile_give_the_full_paths_bits(monkeypatch):
    """Full mask, head dim 128: packings whose longest sequence reaches kernels.VARLEN80_MIN_SEQLEN take 80-query
    tiles, the others 64; the torch fast path serves a new packing from the template of its own tile (the first
    packing of a tile takes the full path), and every call gives the full path's bits."""
    torch = pytest.importorskip("torch")
    from cupy_dash.core import fastpath_varlen
    from cupy_dash.cuda import kernels
    long_ = kernels.VARLEN80_MIN_SEQLEN
    total, H, Hkv, D = long_ + 904, 4, 2, 128
    g = torch.Generator(device="cuda").manual_seed(12)
    q, do = (torch.randn(total, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    k, v = (torch.randn(total, Hkv, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    packings = [[0, 100, total], [0, 2500, total], [0, total - long_, total], [0, 1000, 2000, total]]
    fastpath_varlen.clear()
    for i, cu in enumerate(np.array(p, np.int32) for p in packings):
        m = int(np.diff(cu).max())
        cu_dev = torch.from_numpy(cu).cuda()
        out, lse = cupy_dash.attention_forward_varlen(q, k, v, cu_dev, cu_dev, m, m)
        fast = cupy_dash.attention_backward_varlen(do, q, k, v, out, lse, cu, cu, m, m, schedule="fa3")
        with monkeypatch.context() as mp:
            mp.setenv("CUPY_DASH_FASTPATH", "0")
            full = cupy_dash.attention_backward_varlen(do, q, k, v, out, lse, cu, cu, m, m, schedule="fa3")
        for name, a, e in zip(("dq", "dk", "dv"), fast, full):
            assert torch.equal(a.view(torch.int16), e.view(torch.int16)), f"packing {i} (longest {m}): {name}"
    cupy_dash.check_errors()
