"""CPU tests of cupy_dash.jax under jax.jit / grad / vmap (need JAX, any backend; no GPU).

* shapes and dtypes of every function and transformation (``jax.eval_shape``), GQA and fp16 included;
* the lowered program (for CUDA, lowered on the CPU): one ``buffer_callback`` custom call per kernel call, with
  the backward's scratch workspace as an extra result of exactly the eager workspace size; vmap folds the mapped
  axis into the batch, broadcasting unmapped operands;
* every argument error is raised at trace time and names the argument;
* the plumbing, run on JAX's CPU backend with the callbacks replaced by the float64 reference: forward, grad
  and vmap give the reference's numbers, so argument / result order, the custom_vjp and the vmap fold are right;
* unreplaced callbacks on the CPU backend fail with a clear error;
* the fixed-length callbacks hand the shared launchers their operands in the kernels' order (launches recorded);
* the claim behind "vmap equals a loop" for the portable schedules: folding the batch keeps every addition order.
"""
from __future__ import annotations

import re
import types

import ml_dtypes
import numpy as np
import pytest

import cupy_dash
from cupy_dash import reference, schedule
from cupy_dash.cuda import kernels, launchers, plans

BF16 = np.dtype(ml_dtypes.bfloat16)
TARGET = "xla_buffer_python_gpu_callback_cmd_buffer"


@pytest.fixture
def jx(monkeypatch):
    """(jax, cupy_dash.jax), with JAX's CPU device as the default: these tests exercise the CPU backend, also on a
    machine whose default backend is a GPU (tests/gpu/test_gpu_jax_jit.py runs the real kernels); and the
    buffer_callback mechanism (CUPY_DASH_JAX_FFI=0), whose lowering and plumbing they check (test_jax_ffi.py: the
    C handler)."""
    jax = pytest.importorskip("jax")
    import cupy_dash.jax as cj
    monkeypatch.setenv("CUPY_DASH_JAX_FFI", "0")
    with jax.default_device(jax.devices("cpu")[0]):
        yield jax, cj


def sds(jax, shape, dtype=BF16):
    return jax.ShapeDtypeStruct(shape, dtype)


def lowered(jax, fn, *args) -> str:
    """StableHLO text of ``jax.jit(fn)`` lowered for CUDA (works without a GPU)."""
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def callbacks(text) -> list:
    """(operand types, result types) of each buffer_callback custom call in a lowered module."""
    calls = re.findall(r"custom_call @(\w+)\(.*?: \((.*?)\) -> (.*)", text)
    return [(ops, res) for name, ops, res in calls if name == TARGET]


SHAPES = [((2, 256, 4, 64), (2, 384, 4, 64), "bfloat16"), ((1, 200, 6, 128), (1, 333, 2, 128), "float16")]


@pytest.mark.parametrize("qshape,kshape,dtype", SHAPES)
def test_shapes_and_dtypes(jx, qshape, kshape, dtype):
    jax, cj = jx
    jnp = jax.numpy
    dt = np.dtype(dtype)
    q, k = sds(jax, qshape, dt), sds(jax, kshape, dt)
    B, Sq, H, D = qshape
    out, lse = jax.eval_shape(lambda q, k, v: cj.attention_forward(q, k, v, causal=True), q, k, k)
    assert (out.shape, out.dtype, lse.shape, lse.dtype) == (qshape, dt, (B, H, Sq), np.float32)
    grads = jax.eval_shape(lambda *a: cj.attention_backward(*a, causal=True), q, q, k, k, q, lse)
    assert [(g.shape, g.dtype) for g in grads] == [(qshape, dt), (kshape, dt), (kshape, dt)]

    def loss(q, k, v):
        return jnp.sum(cj.attention(q, k, v, causal=True).astype(jnp.float32))
    grads = jax.eval_shape(jax.grad(loss, argnums=(0, 1, 2)), q, k, k)
    assert [(g.shape, g.dtype) for g in grads] == [(qshape, dt), (kshape, dt), (kshape, dt)]
    n = 3
    qn, kn = sds(jax, (n, *qshape), dt), sds(jax, (n, *kshape), dt)
    grads = jax.eval_shape(jax.vmap(jax.grad(loss, argnums=(0, 1, 2))), qn, kn, kn)
    assert [g.shape for g in grads] == [(n, *qshape), (n, *kshape), (n, *kshape)]
    out = jax.eval_shape(lambda q, k, v: cupy_dash.attention(q, k, v), q, k, k)   # the generic entry point
    assert (out.shape, out.dtype) == (qshape, dt)


def test_lowering_one_callback_per_kernel_call_with_workspace_result(jx):
    jax, cj = jx
    jnp = jax.numpy
    q, k = sds(jax, (2, 256, 4, 128)), sds(jax, (2, 384, 2, 128))
    assert len(callbacks(lowered(jax, lambda q, k, v: cj.attention_forward(q, k, v), q, k, k))) == 1

    def loss(q, k, v):
        return jnp.sum(cj.attention(q, k, v, causal=True).astype(jnp.float32))
    calls = callbacks(lowered(jax, jax.grad(loss, argnums=(0, 1, 2)), q, k, k))
    assert len(calls) == 2, calls
    fwd, bwd = calls
    # out, lse and the persistent build's tile counter (kernels.FWD_PERSISTENT: the causal forward)
    assert fwd[1].count("tensor<") == 3 and "tensor<2x4x256xf32>" in fwd[1] and "tensor<1xi32>" in fwd[1], fwd[1]
    tile = kernels.bwd_tile(128, True)
    p, cfg = cupy_dash.jax.ops._problem(cupy_dash.jax.ops._config(True, None), q, k, k)
    work = launchers.BwdLaunch(kernels.bwd_specs("bfloat16", 128, True), tile.block_m, tile.block_n, p, True,
                               1, True, cfg.window).work_bytes
    assert bwd[0].count("tensor<") == 6                                              # dout, q, k, v, out, lse
    assert bwd[1].count("tensor<") == 4 and f"tensor<{work}xui8>" in bwd[1], bwd[1]  # dq, dk, dv, workspace


@pytest.mark.parametrize("causal", [True, False], ids=["causal-persistent", "full"])
def test_a_fixed_length_forward_takes_the_functional_apis_build(jx, monkeypatch, causal):
    """A traced fixed-length forward launches the build the functional API's does (kernels.FWD_PERSISTENT: causal
    masks persistent): one CTA per SM and a tile counter that is the custom call's third result (XLA allocates it
    per call; the plan zeroes it before the kernel and the parameter block names it); a full mask launches the grid
    build with out and lse only."""
    from cupy_dash.cuda import tensormap
    from cupy_dash.jax import callbacks as jcb, ops
    monkeypatch.setattr(kernels, "sm_count", lambda dev: 132)                # the H200's SMs and L2, no GPU
    monkeypatch.setattr(launchers, "l2_bytes", lambda dev: 60 << 20)
    monkeypatch.setattr(plans.jit, "load", lambda spec: types.SimpleNamespace(ptr=0xF00))
    monkeypatch.setattr(tensormap, "bhsd_map", lambda ptr, *a, **kw: int(ptr).to_bytes(8, "little").ljust(128, b"\0"))
    monkeypatch.setattr(tensormap, "check_encodable", lambda *a, **kw: None)
    q, k = sds(jx[0], (2, 1000, 4, 128)), sds(jx[0], (2, 1000, 2, 128))
    p, cfg = ops._problem(ops._config(causal, None), q, k, k)
    fwd = jcb._Forward(p, cfg)
    assert fwd.persistent is causal and (("DASH_PERSISTENT", 1) in fwd.spec.defines) is causal
    results = [(r.shape, np.dtype(r.dtype)) for r in fwd.types()]
    assert results[:2] == [((2, 1000, 4, 128), np.dtype(BF16)), ((2, 4, 1000), np.dtype(np.float32))]
    assert results[2:] == ([((1,), np.dtype(np.int32))] if causal else [])
    parts = fwd.parts(0)
    buffers = tuple(range(0x10000000, 0x10000000 * (len(fwd.names) + 1), 0x10000000))   # arguments, then results
    block = np.frombuffer(parts.plan().inspect(buffers), dtype=kernels.FWD_PARAMS_DTYPE)[0]
    (_, grid, _, _), = parts.kernels
    if causal:
        assert fwd.names == plans.FWD_PERSISTENT_BUFFERS and parts.zeros == ((5, 4),)    # the counter, zeroed
        tiles = 2 * 4 * -(-1000 // fwd.block_m)
        assert int(block["tile_counter"]) == buffers[5] and int(block["num_tiles"]) == tiles
        assert kernels.grid_xyz(grid) == (min(tiles, 132), 1, 1)                       # one CTA per SM at most
    else:
        assert fwd.names == plans.FWD_BUFFERS[:5] and parts.zeros == () and int(block["tile_counter"]) == 0
        assert kernels.grid_xyz(grid) == (-(-1000 // fwd.block_m), 4, 2)


def test_vmap_folds_the_mapped_axis_into_the_batch(jx):
    jax, cj = jx
    q, k = sds(jax, (3, 2, 256, 4, 64)), sds(jax, (2, 384, 4, 64))
    text = lowered(jax, jax.vmap(lambda q, k, v: cj.attention_forward(q, k, v), in_axes=(0, None, None)), q, k, k)
    (ops, res), = callbacks(text)
    assert ops.count("tensor<6x256x4x64xbf16>") == 1 and ops.count("tensor<6x384x4x64xbf16>") == 2, ops
    assert "tensor<6x4x256xf32>" in res, res


BAD = [
    (dict(q=(2, 128, 4, 64, "float32")), ValueError, "q: expected dtype bfloat16 or float16"),
    (dict(k=(2, 128, 4, 64, "float16")), ValueError, "k: expected dtype bfloat16"),
    (dict(q=(2, 128, 4, 160), k=(2, 128, 4, 160), v=(2, 128, 4, 160)), NotImplementedError, "q: head dim D=160"),
    (dict(q=(128, 4, 64)), ValueError, "q: expected a 4-D tensor"),
    (dict(k=(2, 128, 3, 64), v=(2, 128, 3, 64)), ValueError, "k: the number of kv heads Hkv=3"),
    (dict(k=(1, 128, 4, 64), v=(1, 128, 4, 64)), ValueError, "k: expected shape"),
    (dict(v=(2, 96, 4, 64)), ValueError, "v: expected the shape of k"),
]


@pytest.mark.parametrize("shapes,exc,message", BAD, ids=[m.split(":")[0] + str(i) for i, (_, _, m) in enumerate(BAD)])
def test_shape_and_dtype_errors_at_trace_time(jx, shapes, exc, message):
    jax, cj = jx
    args = {name: (2, 128, 4, 64) for name in ("q", "k", "v")}
    args.update(shapes)
    avals = [sds(jax, s[:-1], np.dtype(s[-1])) if isinstance(s[-1], str) else sds(jax, s) for s in args.values()]
    for fn in (cj.attention, lambda q, k, v: cj.attention_forward(q, k, v)):
        with pytest.raises(exc, match=re.escape(message)):
            jax.eval_shape(fn, *avals)


def test_backward_argument_errors_at_trace_time(jx):
    jax, cj = jx
    q, lse = sds(jax, (2, 128, 4, 64)), sds(jax, (2, 4, 128), np.float32)
    with pytest.raises(ValueError, match=re.escape("lse: expected shape (B, H, Sq)")):
        jax.eval_shape(cj.attention_backward, q, q, q, q, q, sds(jax, (2, 128, 4), np.float32))
    with pytest.raises(ValueError, match="lse: expected dtype float32"):
        jax.eval_shape(cj.attention_backward, q, q, q, q, q, sds(jax, (2, 4, 128)))
    with pytest.raises(ValueError, match="dout: expected the shape of q"):
        jax.eval_shape(cj.attention_backward, sds(jax, (2, 64, 4, 64)), q, q, q, q, lse)


@pytest.mark.parametrize("kwargs,exc,message", [
    (dict(causal="yes"), TypeError, "causal: expected a bool"),
    (dict(deterministic=1), TypeError, "deterministic: expected a bool"),
    (dict(schedule="fastest"), ValueError, "schedule: expected one of"),
    (dict(softmax_scale=-1.0), ValueError, "softmax_scale: expected a finite number > 0"),
])
def test_static_argument_errors(jx, kwargs, exc, message):
    jax, cj = jx
    x = jax.numpy.zeros((1, 128, 1, 64), jax.numpy.bfloat16)
    with pytest.raises(exc, match=message):
        cj.attention(x, x, x, **kwargs)
    with pytest.raises(ValueError, match="window: right=4 contradicts causal=True"):
        cj.attention_forward(x, x, x, causal=True, window=(8, 4))


def test_lse_is_not_differentiable(jx):
    jax, cj = jx
    jnp = jax.numpy
    q = sds(jax, (1, 128, 2, 64))
    with pytest.raises(ValueError, match="lse: the output lse .* is not differentiable"):
        jax.eval_shape(jax.grad(lambda q: jnp.sum(cj.attention_forward(q, q, q)[1])), q)


def test_windows_are_canonical_per_shape(jx):
    jax, cj = jx
    q, k = sds(jax, (1, 128, 2, 64)), sds(jax, (1, 256, 2, 64))
    before = set(cupy_dash.jax.callbacks._prepared)
    for window in ((-1, 0), (255, 0), (5000, 200)):          # plain causal, plain causal, full (Sq=128, Sk=256)
        jax.eval_shape(lambda q, k: cj.attention_forward(q, k, k, causal=window[1] == 0, window=window), q, k)
    new = [key for key in set(cupy_dash.jax.callbacks._prepared) - before]
    assert len(new) == 2, new                               # (-1, 0) == (255, 0); (5000, 200) is (-1, -1)
    assert sorted(key[-1] for key in new) == [(-1, -1), (-1, 0)]


def test_functional_api_rejects_tracers_and_names_the_jax_module(jx):
    jax, _ = jx
    q = sds(jax, (1, 128, 2, 64))
    with pytest.raises(TypeError, match="q: got a JAX tracer .* cupy_dash.jax.attention"):
        jax.eval_shape(lambda q: cupy_dash.attention_forward(q, q, q), q)


def test_running_on_the_cpu_backend_fails_clearly(jx):
    jax, cj = jx
    x = jax.numpy.zeros((1, 128, 1, 64), jax.numpy.bfloat16)
    with pytest.raises(Exception, match="runs on CUDA GPUs only, but XLA runs this call on cpu"):
        jax.block_until_ready(cj.attention_forward(x, x, x))


# ------------------------------------------------------------------------------------------------------------
# the plumbing on JAX's CPU backend, the kernels replaced by the float64 reference
# ------------------------------------------------------------------------------------------------------------
@pytest.fixture
def reference_callbacks(jx, monkeypatch):
    """Replace the two callbacks by the reference (same arguments, results written in place)."""
    _, cj = jx
    calls = []

    def forward(self, ctx, outs, q, k, v):
        calls.append("forward")
        ref_out, ref_lse = reference.forward(*(np.asarray(x) for x in (q, k, v)), causal=self.causal,
                                             softmax_scale=self.p.scale, window=self.window)
        out, lse = (np.asarray(x) for x in outs[:2])              # (a causal forward's tile counter is outs[2])
        out[...], lse[...] = ref_out.astype(out.dtype), ref_lse.astype(lse.dtype)

    def backward(self, ctx, outs, dout, q, k, v, out, lse):
        calls.append("backward")
        grads = reference.backward(*(np.asarray(x) for x in (dout, q, k, v, out, lse)), causal=self.causal,
                                   softmax_scale=self.p.scale, window=self.window)
        for dst, g in zip(outs[:3], grads):
            dst = np.asarray(dst)
            dst[...] = g.astype(dst.dtype)
    monkeypatch.setattr(cupy_dash.jax.callbacks._Forward, "__call__", forward)
    monkeypatch.setattr(cupy_dash.jax.callbacks._Backward, "__call__", backward)
    return calls


def host(shape, seed, dtype=BF16):
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32).astype(dtype)


def close(name, got, want, tol=2e-2):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, (name, got.shape, want.shape)
    err = float(np.max(np.abs(got - want) / (1 + np.abs(want))))
    assert err < tol, f"{name}: relative error {err:.3g}"


def test_plumbing_of_jit_grad_and_vmap_with_reference_callbacks(jx, reference_callbacks):
    jax, cj = jx
    jnp = jax.numpy
    n, B, Sq, Sk, H, Hkv, D = 2, 2, 64, 96, 4, 2, 64
    q, dout = host((n, B, Sq, H, D), 1), host((n, B, Sq, H, D), 2)
    k, v = host((B, Sk, Hkv, D), 3), host((n, B, Sk, Hkv, D), 4)

    def loss(q, k, v, dout):
        return jnp.sum(cj.attention(q, k, v, causal=True).astype(jnp.float32) * dout.astype(jnp.float32))
    step = jax.jit(jax.vmap(jax.value_and_grad(loss, argnums=(0, 1, 2)), in_axes=(0, None, 0, 0)))
    _, (dq, dk, dv) = jax.block_until_ready(step(q, k, v, dout))
    assert reference_callbacks == ["forward", "backward"], reference_callbacks   # one folded call each
    assert dk.shape == (n, B, Sk, Hkv, D)
    for i in range(n):
        out, lse = reference.forward(q[i], k, v[i], causal=True)
        want = reference.backward(dout[i], q[i], k, v[i], out.astype(BF16), lse.astype(np.float32), causal=True)
        for name, got, w in zip(("dq", "dk", "dv"), (dq[i], dk[i], dv[i]), want):
            close(f"{name}[{i}]", got, w)
    out, lse = jax.jit(lambda q, k, v: cj.attention_forward(q, k, v, softmax_scale=0.5))(q[0], k, v[0])
    ref_out, ref_lse = reference.forward(q[0], k, v[0], softmax_scale=0.5)
    close("out", out, ref_out)
    close("lse", lse, ref_lse, tol=1e-5)
    grads = jax.jit(lambda *a: cj.attention_backward(*a, softmax_scale=0.5))(dout[0], q[0], k, v[0], out, lse)
    want = reference.backward(dout[0], q[0], k, v[0], np.asarray(out), np.asarray(lse), softmax_scale=0.5)
    for name, got, w in zip(("dq", "dk", "dv"), grads, want):
        close(name, got, w)


def test_plumbing_window_reaches_both_passes(jx, reference_callbacks):
    jax, cj = jx
    jnp = jax.numpy
    B, Sq, Sk, H, Hkv, D, window = 1, 96, 160, 2, 1, 64, (24, 8)
    q, dout = host((B, Sq, H, D), 5), host((B, Sq, H, D), 6)
    k, v = host((B, Sk, Hkv, D), 7), host((B, Sk, Hkv, D), 8)

    def loss(q, k, v):
        return jnp.sum(cj.attention(q, k, v, window=window).astype(jnp.float32) * dout.astype(jnp.float32))
    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v)
    out, lse = reference.forward(q, k, v, window=window)
    want = reference.backward(dout, q, k, v, out.astype(BF16), lse.astype(np.float32), window=window)
    for name, got, w in zip(("dq", "dk", "dv"), grads, want):
        close(name, got, w)
    plain = reference.backward(dout, q, k, v, *reference.forward(q, k, v))
    assert not np.allclose(np.asarray(grads[0], np.float64), plain[0], atol=1e-2), "the window changed nothing"


# ------------------------------------------------------------------------------------------------------------
# why vmap equals a loop for the portable schedules (no JAX needed)
# ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("policy", schedule.PORTABLE_POLICIES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("group", [1, 2])
def test_folding_the_batch_keeps_the_portable_addition_orders(policy, causal, group):
    bh, n, S, bm, bn = 8, 3, 2048, 64, 128        # 8 heads x 16 KV tiles: more than 132 CTAs once folded

    def orders(num_heads):
        kv_tiles = num_heads // group * (S // bn)
        plan = schedule.build(policy, seqlen_q=S, seqlen_k=S, block_m=bm, block_n=bn, num_heads=num_heads,
                              causal=causal, num_sms=min(132, kv_tiles), group_size=group)
        return schedule.reduction_order(plan)
    columns, dq = orders(bh)
    all_columns, all_dq = orders(n * bh)
    for i in range(n):
        c = all_columns[(all_columns[:, 2] >= i * bh) & (all_columns[:, 2] < (i + 1) * bh)].copy()
        c[:, 0] -= i * bh // group
        c[:, 2] -= i * bh
        d = all_dq[(all_dq[:, 0] >= i * bh) & (all_dq[:, 0] < (i + 1) * bh)].copy()
        d[:, 0] -= i * bh
        assert np.array_equal(c, columns) and np.array_equal(d, dq), f"batch slice {i} adds in another order"


def test_fixed_length_calls_plan_what_the_launchers_pack_and_run_it(monkeypatch):
    """The fixed-length forward and backward calls: each device's plan is plans.forward / plans.backward of the
    traced problem (kernels, grid, strides in the kernels' order; the backward's BwdLaunch and error record, no
    cu_seqlens), and the callback runs the device's plan on XLA's stream with the call's buffers, arguments then
    results (the C handler numbers them the same way). Buffers are addresses and the device is 0; the plans are
    recorded, not run."""
    pytest.importorskip("jax")
    import contextlib
    import types
    import cupy
    from cupy_dash.jax import callbacks
    monkeypatch.setattr(cupy.cuda, "Device", lambda dev: contextlib.nullcontext())
    monkeypatch.setattr(callbacks, "_ptr", lambda buffer: buffer)
    monkeypatch.setattr(callbacks, "_device", lambda buffer, prepared: 0)
    monkeypatch.setattr(callbacks.interop, "external_stream", lambda ptr, dev: types.SimpleNamespace(ptr=ptr + dev))
    calls = []
    monkeypatch.setattr(plans, "forward", lambda *a: calls.append(("forward", a)) or "fwd parts")
    monkeypatch.setattr(plans, "backward", lambda *a, **kw: calls.append(("backward", a, kw)) or "bwd parts")
    monkeypatch.setattr(launchers, "fwd_grid", lambda p, block_m: (9, 8, 7))
    qs, kvs, vs, os_ = (11, 12, 13), (21, 22, 23), (31, 32, 33), (41, 42, 43)
    ctx = types.SimpleNamespace(stream=7)
    ran = types.SimpleNamespace(run=lambda stream, buffers: calls.append(("run", stream, buffers)))

    fwd = object.__new__(callbacks._Forward)
    from cupy_dash.core.problem import Problem
    p = Problem(2, 256, 256, 4, 4, 64, 64, "bfloat16", 0.125, 0.0, 0)
    fwd.spec, fwd.block_m, fwd.block_n, fwd.p, fwd.window = "spec", 128, 64, p, (-1, 5)
    fwd.strides, fwd.devices, fwd.plans = (qs, kvs, vs, os_), (0,), {0: ran}
    assert fwd.parts(0) == "fwd parts"
    fwd(ctx, (0x50, 0x60), 0x10, 0x20, 0x30)                         # (out, lse), q, k, v
    assert calls == [("forward", ("spec", (9, 8, 7), 128, 64, p, (-1, 5), (qs, kvs, vs), plans.FWD_BUFFERS[:5],
                                  None, (0, 0))),
                     ("run", 7, (0x10, 0x20, 0x30, 0x50, 0x60))]
    calls.clear()

    bwd = object.__new__(callbacks._Backward)
    c = types.SimpleNamespace(work_bytes=4096)
    bwd.launches, bwd.records, bwd.work_bytes = {0: c}, {0: 0x99}, 4096
    bwd.strides, bwd.devices, bwd.plans = (qs, kvs, vs, os_), (0,), {0: ran}
    assert bwd.parts(0) == "bwd parts"
    # results dq, dk, dv, workspace; arguments dout, q, k, v, out, lse
    bwd(ctx, (0x1, 0x2, 0x3, 0x4), 0x15, 0x10, 0x20, 0x30, 0x40, 0x45)
    assert calls == [("backward", (c, (qs, kvs, vs, os_, os_), plans.BWD_BUFFERS[:10]), {"error": (0x99, 0)}),
                     ("run", 7, (0x15, 0x10, 0x20, 0x30, 0x40, 0x45, 0x1, 0x2, 0x3, 0x4))]


def test_forward_plans_follow_each_devices_sms_and_l2(jx, monkeypatch):
    """A traced forward prepares a plan per GPU: each plan's launch order is built from that GPU's SM count and L2
    size (the validated problem of a trace names device 0 only as a placeholder)."""
    from cupy_dash.core.problem import Problem
    from cupy_dash.jax import callbacks as jcb
    asked = []
    monkeypatch.setattr(kernels, "sm_count", lambda dev: asked.append(("sms", dev)) or 132 * (dev + 1))
    monkeypatch.setattr(launchers, "l2_bytes", lambda dev: asked.append(("l2", dev)) or (60 << 20))
    monkeypatch.setattr(plans, "forward", lambda spec, grid, bm, bn, p, *rest: (
        p.device_id, launchers.fwd_head_section(p, bm)))        # what the plan's parameter block asks
    call = object.__new__(jcb._Forward)
    call.p = Problem(2, 4096, 4096, 16, 16, 128, 128, "bfloat16", 0.088, 0.0, 0)
    call.spec, call.block_m, call.block_n, call.window = None, 128, 128, (-1, 0)
    call.strides, call.names = ((0, 0, 0),) * 4, plans.FWD_BUFFERS[:5]
    sections = {dev: call.parts(dev) for dev in (1, 0)}
    assert sections == {1: (1, 8), 0: (0, 4)} and [d for _, d in asked] == [1, 1, 0, 0]


def test_a_plan_knob_change_retraces_and_prepares_anew(jx, monkeypatch):
    """The knobs that decide what a traced call launches (config.PLAN_KNOBS: table form, tile, writers, fold, ...)
    are part of the static configuration and of the prepared call's key: a change retraces and prepares anew
    rather than reuse a call prepared under the old value."""
    from cupy_dash import config
    from cupy_dash.jax import callbacks as jcb, ops
    made = []
    monkeypatch.setattr(jcb, "_get", lambda key, make: made.append(key) or key)
    monkeypatch.delenv("CUPY_DASH_BWD_FULL_BLOCK_M", raising=False)
    before = ops._config(False, None)
    p = types.SimpleNamespace(dtype="bfloat16", B=1, Sq=1024, Sk=1024, H=2, Hkv=2, D=128, Dv=128, scale=0.1,
                              softcap=0.0)
    for knob, value in ((config.BWD_FULL_BLOCK_M, "64"), (config.COMPACT_TABLES, "1")):
        monkeypatch.setenv(knob.name, value)
        after = ops._config(False, None)
        assert after != before and after.knobs == config.fingerprint()
        assert ops.prepare("bwd", None, p, after, backward=True) != ops.prepare("bwd", None, p, before, backward=True)
        before = after
