"""cupy_dash.jax.attention_varlen on the CPU (skipped without JAX): lowering (one custom call per pass under
jax.grad), argument checks at trace time, and the custom_vjp plumbing on JAX's CPU backend with the kernels
replaced by the float64 reference per sequence. The real kernels: tests/gpu/test_gpu_varlen_bwd.py."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from cupy_dash import reference

BF16 = np.dtype(ml_dtypes.bfloat16)
CU_Q, CU_K = np.array([0, 100, 100, 300]), np.array([0, 200, 260, 500])   # the middle sequence has no queries


@pytest.fixture
def jx(monkeypatch):
    jax = pytest.importorskip("jax")
    import cupy_dash.jax as cj
    monkeypatch.setenv("CUPY_DASH_JAX_FFI", "0")
    jax.clear_caches()                  # no executable traced by an earlier test (with other callbacks) is reused
    with jax.default_device(jax.devices("cpu")[0]):
        yield jax, cj


def test_lowering_has_one_custom_call_per_pass(jx):
    jax, cj = jx
    jnp = jax.numpy
    q, k = jax.ShapeDtypeStruct((300, 4, 64), jnp.bfloat16), jax.ShapeDtypeStruct((500, 2, 64), jnp.bfloat16)

    def loss(q, k, v):
        return jnp.sum(cj.attention_varlen(q, k, v, CU_Q, CU_K, 200, 240, causal=True).astype(jnp.float32))
    text = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(q, k, k).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("stablehlo.custom_call") == 2


@pytest.mark.parametrize("over,exc,match", [
    (dict(cu_seqlens_q="jax"), TypeError, "both as JAX arrays or both on the host"),
    (dict(cu_seqlens_q=np.array([0, 200, 100, 300])), ValueError, "cu_seqlens_q: expected 0 = cu"),
    (dict(cu_seqlens_k=np.array([0, 500]), max_seqlen_k=500), ValueError, "cu_seqlens_k: expected 4 entries"),
    (dict(max_seqlen_q=150), ValueError, "exceeds max_seqlen_q"),
    (dict(max_seqlen_k=0), ValueError, "max_seqlen_k"),
    (dict(schedule="fastest"), ValueError, "schedule"),
    (dict(causal="yes"), TypeError, "causal"),
])
def test_argument_errors_at_trace_time(jx, over, exc, match):
    jax, cj = jx
    jnp = jax.numpy
    q, k = jnp.zeros((300, 4, 64), jnp.bfloat16), jnp.zeros((500, 2, 64), jnp.bfloat16)
    a = dict(cu_seqlens_q=CU_Q, cu_seqlens_k=CU_K, max_seqlen_q=200, max_seqlen_k=240)
    a.update(over)
    if isinstance(a["cu_seqlens_q"], str):
        a["cu_seqlens_q"] = jnp.asarray(CU_Q)
    kw = {n: a.pop(n) for n in ("schedule", "causal") if n in a}
    with pytest.raises(exc, match=match):
        cj.attention_varlen(q, k, k, a["cu_seqlens_q"], a["cu_seqlens_k"], a["max_seqlen_q"], a["max_seqlen_k"],
                            **kw)


def _sequences(cu_q, cu_k):
    for b in range(len(cu_q) - 1):
        yield slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))


def _reference_forward(outs, q, k, v, cu_q, cu_k):
    """What the forward callback writes, by the float64 reference per sequence (CPU buffers)."""
    q, k, v = (np.asarray(x) for x in (q, k, v))
    out, lse = (np.asarray(x) for x in outs)
    out[...], lse[...] = 0, -np.inf
    for rq, rk in _sequences(cu_q, cu_k):
        if rq.stop > rq.start and rk.stop > rk.start:
            o, l_ = reference.forward(q[None, rq], k[None, rk], v[None, rk], causal=True)
            out[rq], lse[:, rq] = o[0].astype(out.dtype), l_[0]


def _reference_backward(outs, dout, q, k, v, out, lse, cu_q, cu_k):
    """What the backward callback writes, by the float64 reference per sequence (CPU buffers)."""
    dout, q, k, v, out, lse = (np.asarray(x) for x in (dout, q, k, v, out, lse))
    dq, dk, dv = (np.asarray(x) for x in outs[:3])
    dq[...], dk[...], dv[...] = 0, 0, 0
    for rq, rk in _sequences(cu_q, cu_k):
        if rq.stop > rq.start and rk.stop > rk.start:
            g = reference.backward(dout[None, rq], q[None, rq], k[None, rk], v[None, rk], out[None, rq],
                                   np.ascontiguousarray(lse[None, :, rq]), causal=True)
            dq[rq], dk[rk], dv[rk] = (x[0].astype(dq.dtype) for x in g)


def _check_grads(grads, q, k, v, dout, cu_q, cu_k):
    """The gradients against the float64 reference per sequence; keys no query sees get zero gradients."""
    for rq, rk in _sequences(cu_q, cu_k):
        if rq.stop == rq.start or rk.stop == rk.start:
            assert not np.asarray(grads[1][rk], np.float32).any()
            continue
        o, l_ = reference.forward(q[None, rq], k[None, rk], v[None, rk], causal=True)
        want = reference.backward(dout[None, rq], q[None, rq], k[None, rk], v[None, rk], o.astype(BF16),
                                  l_.astype(np.float32), causal=True)
        for got, w in zip((grads[0][rq], grads[1][rk], grads[2][rk]), want):
            got = np.asarray(got, np.float64)
            assert np.max(np.abs(got - w[0]) / (1 + np.abs(w[0]))) < 2e-2


def test_plumbing_with_reference_callbacks(jx, monkeypatch):
    """jit(grad) of a varlen loss runs one forward and one backward call and gives the per-sequence float64
    reference's gradients (the kernels replaced by the reference on JAX's CPU backend)."""
    jax, cj = jx
    from cupy_dash.jax import varlen as jax_varlen
    calls = []

    def forward(self, ctx, outs, q, k, v):
        calls.append("forward")
        _reference_forward(outs, q, k, v, CU_Q, CU_K)

    def backward(self, ctx, outs, dout, q, k, v, out, lse):
        calls.append("backward")
        _reference_backward(outs, dout, q, k, v, out, lse, CU_Q, CU_K)
    monkeypatch.setattr(jax_varlen._VarlenForward, "__call__", forward)
    monkeypatch.setattr(jax_varlen._VarlenBackward, "__call__", backward)
    jnp = jax.numpy
    rng = np.random.default_rng(0)
    q, dout = (rng.standard_normal((300, 4, 64), dtype=np.float32).astype(BF16) for _ in range(2))
    k, v = (rng.standard_normal((500, 2, 64), dtype=np.float32).astype(BF16) for _ in range(2))

    def loss(q, k, v):
        out = cj.attention_varlen(q, k, v, CU_Q, CU_K, 200, 240, causal=True)
        return jnp.sum(out.astype(jnp.float32) * dout.astype(jnp.float32))
    # NOTES: the callbacks run when the computation does, after an asynchronous dispatch: wait before looking
    grads = jax.block_until_ready(jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v))
    assert calls == ["forward", "backward"]
    _check_grads(grads, q, k, v, dout, CU_Q, CU_K)


def test_traced_lengths_one_program_for_every_packing(jx, monkeypatch):
    """cu_seqlens as JAX arrays: jit(grad) is traced once for two packings of the same sizes, each execution
    runs one forward and one backward callback that see that packing's lengths, and the gradients are the
    per-sequence float64 reference's (kernels replaced by the reference on JAX's CPU backend)."""
    jax, cj = jx
    from cupy_dash.jax import varlen as jax_varlen, varlen_dyn as jax_varlen_dyn
    calls = []

    def forward(self, ctx, outs, q, k, v, cu_q, cu_k):
        cu_q, cu_k = np.asarray(cu_q).copy(), np.asarray(cu_k).copy()
        calls.append(("forward", cu_q.tolist()))
        _reference_forward(outs, q, k, v, cu_q, cu_k)

    def backward(self, ctx, outs, dout, q, k, v, out, lse, cu_q, cu_k):
        cu_q, cu_k = np.asarray(cu_q).copy(), np.asarray(cu_k).copy()
        calls.append(("backward", cu_q.tolist()))
        _reference_backward(outs, dout, q, k, v, out, lse, cu_q, cu_k)
    monkeypatch.setattr(jax_varlen._VarlenForward, "__call__", forward)   # shared with the static path
    monkeypatch.setattr(jax_varlen_dyn._Backward, "__call__", backward)
    jnp = jax.numpy
    rng = np.random.default_rng(1)
    q, dout = (rng.standard_normal((300, 4, 64), dtype=np.float32).astype(BF16) for _ in range(2))
    k, v = (rng.standard_normal((500, 2, 64), dtype=np.float32).astype(BF16) for _ in range(2))
    traces = []

    def loss(q, k, v, cu_q, cu_k):
        traces.append(1)
        out = cj.attention_varlen(q, k, v, cu_q, cu_k, 250, 300, causal=True)
        return jnp.sum(out.astype(jnp.float32) * dout.astype(jnp.float32))
    step = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    packings = [(CU_Q, CU_K), (np.array([0, 50, 250, 300]), np.array([0, 100, 300, 500]))]
    for cu_q, cu_k in packings:
        grads = jax.block_until_ready(step(q, k, v, jnp.asarray(cu_q, jnp.int32), jnp.asarray(cu_k, jnp.int32)))
        _check_grads(grads, q, k, v, dout, cu_q, cu_k)
    assert len(traces) == 1
    assert calls == [("forward", CU_Q.tolist()), ("backward", CU_Q.tolist()),
                     ("forward", packings[1][0].tolist()), ("backward", packings[1][0].tolist())]


def test_traced_lengths_lowering_and_checks(jx):
    jax, cj = jx
    jnp = jax.numpy
    q, k = jax.ShapeDtypeStruct((300, 4, 64), jnp.bfloat16), jax.ShapeDtypeStruct((500, 2, 64), jnp.bfloat16)
    cu = jax.ShapeDtypeStruct((4,), jnp.int32)

    def loss(q, k, v, cu_q, cu_k):
        return jnp.sum(cj.attention_varlen(q, k, v, cu_q, cu_k, 200, 240, causal=True).astype(jnp.float32))
    text = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(q, k, k, cu, cu).lower(
        lowering_platforms=("cuda",)).as_text()
    assert text.count("stablehlo.custom_call") == 2
    qa, ka = jnp.zeros((300, 4, 64), jnp.bfloat16), jnp.zeros((500, 2, 64), jnp.bfloat16)
    with pytest.raises(ValueError, match="cu_seqlens_q: expected an int32"):
        cj.attention_varlen(qa, ka, ka, jnp.asarray(CU_Q, jnp.float32), jnp.asarray(CU_K, jnp.int32), 200, 240)
    with pytest.raises(ValueError, match="cu_seqlens_k: expected 4 entries"):
        cj.attention_varlen(qa, ka, ka, jnp.asarray(CU_Q, jnp.int32), jnp.asarray([0, 500], jnp.int32), 200, 500)
    with pytest.raises(ValueError, match="exceed the packed lengths"):
        cj.attention_varlen(qa, ka, ka, jnp.asarray(CU_Q, jnp.int32), jnp.asarray(CU_K, jnp.int32), 400, 240)


def test_traced_lengths_are_checked_when_the_backward_runs(monkeypatch):
    """The traced-lengths backward reads cu_seqlens back when it runs and checks them as the eager API does (a
    ValueError naming the argument), device copies replaced by host ones."""
    pytest.importorskip("jax")
    import types
    from cupy_dash.jax import varlen as jax_varlen, varlen_dyn as jax_varlen_dyn
    device = {}

    def memcpy(dst, src, nbytes, kind, stream):
        np.ctypeslib.as_array((np.ctypeslib.ctypes.c_int32 * (nbytes // 4)).from_address(dst))[:] = device[src]
    import cupy
    monkeypatch.setattr(cupy.cuda.runtime, "memcpyAsync", memcpy)
    monkeypatch.setattr(jax_varlen_dyn.callbacks, "_ptr", lambda buffer: buffer)
    bwd = object.__new__(jax_varlen_dyn._Backward)
    bwd.p = types.SimpleNamespace(Sq=300, Sk=500)
    bwd.vcfg = jax_varlen._VarlenConfig(None, 3, 250, 300, None, jax_varlen_dyn._Backward)
    stream = types.SimpleNamespace(ptr=0, synchronize=lambda: None)
    device[1], device[2] = CU_Q.astype(np.int32), CU_K.astype(np.int32)
    q, k = bwd.lengths(1, 2, stream)
    assert q.tolist() == CU_Q.tolist() and k.tolist() == CU_K.tolist()
    device[1] = np.array([0, 200, 100, 300], np.int32)
    with pytest.raises(ValueError, match="cu_seqlens_q: expected 0 = cu"):
        bwd.lengths(1, 2, stream)
    device[1], device[2] = CU_Q.astype(np.int32), np.array([0, 400, 450, 500], np.int32)
    with pytest.raises(ValueError, match="cu_seqlens_k: a sequence of 400 rows exceeds max_seqlen_k"):
        bwd.lengths(1, 2, stream)


@pytest.mark.parametrize("softcap", [0.0, 30.0], ids=["plain", "capped"])
def test_the_forward_callback_launches_as_the_eager_varlen_forward(monkeypatch, softcap):
    """The varlen forward's call (traced lengths: the call's own cu_seqlens buffers) plans the launch every entry
    point shares, with the grid sized by max_seqlen_q, the sequences' count and the cu_seqlens operands as buffers
    (capped or not, the same build, the cap in the parameters, p), and its callback runs the device's plan with the
    call's buffers, arguments then results. Buffers are addresses, the device is 0, the plan is recorded."""
    pytest.importorskip("jax")
    import types
    from cupy_dash.cuda import plans
    from cupy_dash.jax import callbacks, varlen as jax_varlen
    import contextlib
    import cupy
    fwd = object.__new__(jax_varlen._VarlenForward)
    from cupy_dash.core.problem import Problem
    fwd.p = Problem(1, 300, 500, 2, 2, 64, 64, "bf16", 0.125, softcap, 0)
    fwd.block_m, fwd.block_n, fwd.window, fwd.num_seqs, fwd.grid = 128, 128, (-1, -1), 3, (2, 2, 3)
    fwd.strides = ((256, 128, 2),) * 4
    fwd.devices, fwd.cu = (0,), {}
    fwd.names = ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "out", "lse")      # traced lengths: operands
    fwd.spec = types.SimpleNamespace(label="fwd[bf16,d64,full,varlen]", defines=())
    planned = []
    monkeypatch.setattr(plans, "forward", lambda *a: planned.append(a) or "parts")
    assert fwd.parts(0) == "parts"
    assert planned == [(fwd.spec, (2, 2, 3), 128, 128, fwd.p, (-1, -1), fwd.strides[:3], fwd.names, 3, (0, 0))]
    assert planned[0][4].softcap == softcap                 # one build, the cap in the parameters
    ran = []
    fwd.plans = {0: types.SimpleNamespace(run=lambda stream, buffers: ran.append((stream, buffers)))}
    monkeypatch.setattr(cupy.cuda, "Device", lambda dev: contextlib.nullcontext())
    monkeypatch.setattr(callbacks, "_ptr", lambda buffer: buffer)
    monkeypatch.setattr(callbacks, "_device", lambda buffer, prepared: 0)
    monkeypatch.setattr(callbacks.interop, "external_stream", lambda ptr, dev: types.SimpleNamespace(ptr=ptr))
    fwd(types.SimpleNamespace(stream=7), (0x5000, 0x6000), 0x1000, 0x2000, 0x3000, 0x7000, 0x8000)
    assert ran == [(7, (0x1000, 0x2000, 0x3000, 0x7000, 0x8000, 0x5000, 0x6000))]     # arguments, then results


@pytest.mark.parametrize("max_q,block_ms", [(4000, {64}), (5000, {64, 80})], ids=["short", "long"])
def test_traced_lengths_load_every_tile_a_packing_may_take(monkeypatch, max_q, block_ms):
    """Head dim 128, full mask, lengths read when the backward runs: the kernels of every tile a packing of at most
    max_seqlen_q may take (kernels.varlen_tile_seqlen: 80 queries from VARLEN80_MIN_SEQLEN) are loaded at trace
    time, and the workspace covers the largest."""
    pytest.importorskip("jax")
    import contextlib
    import types
    import cupy
    from cupy_dash.cuda import kernels, launchers
    from cupy_dash.jax import callbacks, varlen as jax_varlen, varlen_dyn as jax_varlen_dyn
    from fastpath_fakes import fake_bwd_entry
    loaded = set()
    monkeypatch.setattr(callbacks, "_gpus", lambda: (0,))
    monkeypatch.setattr(callbacks, "_load", lambda specs: loaded.add(dict(specs.main.defines)["DASH_BLOCK_M"]))
    monkeypatch.setattr(jax_varlen_dyn, "jit_record", lambda dev, call: 0)
    monkeypatch.setattr(cupy.cuda, "Device", lambda dev: contextlib.nullcontext())
    monkeypatch.setattr(kernels, "bwd_entry", fake_bwd_entry)
    total, H, D = 6000, 2, 128
    p = types.SimpleNamespace(B=1, Sq=total, Sk=total, H=H, Hkv=H, D=D, Dv=D, dtype="bfloat16", softcap=0.0)
    cfg = types.SimpleNamespace(causal=False, window=(-1, -1), deterministic=True, schedule="fa3", ffi=True)
    vcfg = jax_varlen._VarlenConfig(None, 2, max_q, max_q, None, jax_varlen_dyn._Backward)
    bwd = jax_varlen_dyn._Backward(p, cfg, vcfg, 10 ** 9)
    assert loaded == block_ms and not bwd.ffi                  # a callback whatever the mechanism asked
    specs = kernels.bwd_specs("bfloat16", D, False)
    assert bwd.work_bytes == max(launchers.BwdLaunch(specs, m, 128, p, True, 10 ** 9, False, (-1, -1),
                                                     varlen=(2, max_q)).work_bytes for m in block_ms)
