"""CPU test of the varlen backward's wiring (cupy_dash.core.varlen.attention_backward_varlen) with every GPU call
replaced: the parameter block the three kernels get names each operand's address in its own field (q, k, v, out,
dout, lse, the outputs, the uploaded cu_seqlens), the grids cover the longest sequence, dk and dv are zeroed, and
the schedule table is the one built for these lengths. (The first GPU run of the varlen backward failed on out and
dout passed in each other's place: this is the check that would have caught it.)"""
from __future__ import annotations

import contextlib
import types

import ml_dtypes
import numpy as np
import pytest

import cupy_dash
from cupy_dash import gpu
from cupy_dash.core import api, interop, varlen
from cupy_dash.cuda import errors, kernels, launchers, plans, tensormap, varlen_device

BF16 = np.dtype(ml_dtypes.bfloat16)


class Fake:
    """A CUDA array stand-in with a made-up address (framework "other")."""

    def __init__(self, shape, dtype, ptr):
        self.shape, self.dtype, self.ptr = tuple(shape), np.dtype(dtype), ptr
        item = self.dtype.itemsize
        strides = np.cumprod((1,) + self.shape[:0:-1])[::-1] * item
        self.__cuda_array_interface__ = {"shape": self.shape, "typestr": self.dtype.str, "version": 3,
                                         "data": (ptr, False), "strides": tuple(int(s) for s in strides)}

    def __dlpack_device__(self):
        return (2, 0)

    def __getitem__(self, index):                    # x[None]: the (1, ...) view at the same address
        assert index is None
        return Fake((1, *self.shape), self.dtype, self.ptr)


class Stream(contextlib.nullcontext):
    """A CuPy stream stand-in: usable as a context, handle 0."""
    ptr = 0

    def wait_event(self, event):
        pass


D = 128


@pytest.fixture
def no_gpu(monkeypatch):
    """Every GPU-touching step of the varlen API's full path replaced: tensor maps (the address in the first 8
    bytes), operand resolution, allocations (fresh made-up addresses), the caller's stream, the device context, the
    GPU check and the kernels' occupancy query (bf16, d128, causal, deterministic specs)."""
    monkeypatch.setattr(tensormap, "bhsd_map", lambda ptr, *a, **kw: int(ptr).to_bytes(8, "little").ljust(128, b"\0"))
    monkeypatch.setattr(tensormap, "check_encodable", lambda *a, **kw: None)
    monkeypatch.setattr(api, "_resolve", lambda info, x, keep, caller=None: (info.data_ptr, info.strides[:3]))
    addresses = iter(range(0x100000, 0x200000, 0x1000))

    def new(fw, dev, shape, dtype):
        ptr = next(addresses)
        return Fake(shape, {"uint8": np.uint8}.get(dtype, BF16), ptr), ptr
    monkeypatch.setattr(api, "_new", new)
    monkeypatch.setattr(api, "_export", lambda fw, arr, like: arr)
    monkeypatch.setattr(interop, "caller_stream", lambda x, dev: Stream())
    monkeypatch.setattr(varlen.cupy.cuda, "Device", lambda dev: contextlib.nullcontext())
    monkeypatch.setattr(launchers, "l2_bytes", lambda dev: 60 << 20)    # the H200's L2 and SMs
    monkeypatch.setattr(kernels, "sm_count", lambda dev: 132)
    monkeypatch.setattr(gpu, "require", lambda what, device=0: None)
    specs = kernels.bwd_specs("bfloat16", D, True)
    tile = kernels.bwd_tile(D, True)
    monkeypatch.setattr(kernels, "bwd_entry", lambda *a, **kw: (specs, tile.block_m, tile.block_n, 132))
    monkeypatch.setattr(plans.jit, "load", lambda spec: types.SimpleNamespace(ptr=0xF00))
    plans.clear()
    return tile


def _operands(total_q, total_k, H, Hkv):
    """do, q, k, v, out, lse fakes at fixed made-up addresses, and those addresses by name."""
    ptrs = dict(q=0x10000, k=0x20000, v=0x30000, do=0x40000, out=0x50000, lse=0x60000)
    q, do, out = (Fake((total_q, H, D), BF16, ptrs[n]) for n in ("q", "do", "out"))
    k, v = (Fake((total_k, Hkv, D), BF16, ptrs[n]) for n in ("k", "v"))
    lse = Fake((H, total_q), np.float32, ptrs["lse"])
    return (do, q, k, v, out, lse), ptrs


def test_backward_varlen_parameter_block(no_gpu, monkeypatch):
    total_q, total_k, H, Hkv = 300, 500, 4, 2
    tile = no_gpu
    (do, q, k, v, out, lse), ptrs = _operands(total_q, total_k, H, Hkv)
    cu_q, cu_k = np.array([0, 100, 100, 300], np.int32), np.array([0, 200, 260, 500], np.int32)
    built = {}

    def device(t, num_heads, dev, s, capture=False):
        built["t"], built["num_heads"] = t, num_heads
        tables = types.SimpleNamespace(visits=types.SimpleNamespace(data=types.SimpleNamespace(ptr=0x7000)),
                                       rank=types.SimpleNamespace(data=types.SimpleNamespace(ptr=0x7100)),
                                       cta_start=types.SimpleNamespace(data=types.SimpleNamespace(ptr=0x7200)),
                                       num_ctas=t.num_ctas, policy=t.policy)
        cu = [types.SimpleNamespace(data=types.SimpleNamespace(ptr=p)) for p in (0x8000, 0x8100)]
        return tables, cu[0], cu[1], None
    monkeypatch.setattr(varlen_device, "device", device)
    slot = types.SimpleNamespace(dptr=0x9000, hdev=0x9800)
    monkeypatch.setattr(api, "acquire_slot", lambda dev: slot)
    enqueued = {}

    def enqueue(c, s, buffers, *, slot=None, call=None):     # the block from the plan, in inspect mode
        enqueued.update(c=c, params=np.frombuffer(c.plan.inspect(buffers), kernels.BWD_PARAMS_DTYPE)[0],
                        grads=buffers[6:9], slot=slot, call=call)
    monkeypatch.setattr(launchers, "enqueue_backward", enqueue)
    monkeypatch.setattr(errors, "poll_errors", lambda: None)
    monkeypatch.setattr(api, "_poll_errors", lambda: None)

    dq, dk, dv = cupy_dash.attention_backward_varlen(do, q, k, v, out, lse, cu_q, cu_k, 200, 240, causal=True,
                                                     schedule="fa3")
    f, c = enqueued["params"], enqueued["c"]
    for field, name in (("q", "q"), ("k", "k"), ("v", "v"), ("out", "out"), ("dout", "do"), ("lse", "lse")):
        assert int(f[field]) == ptrs[name], field
    for field, name in (("tma_q", "q"), ("tma_k", "k"), ("tma_v", "v"), ("tma_do", "do")):
        assert int.from_bytes(bytes(f[field])[:8], "little") == ptrs[name], field
    assert (int(f["dq"]), int(f["dk"]), int(f["dv"])) == (dq.ptr, dk.ptr, dv.ptr) == enqueued["grads"]
    assert (int(f["cu_seqlens_q"]), int(f["cu_seqlens_k"])) == (0x8000, 0x8100)
    assert (int(f["visits"]), int(f["rank"]), int(f["cta_start"])) == (0x7000, 0x7100, 0x7200)
    assert (int(f["error"]), int(f["error_host"])) == (slot.dptr, slot.hdev) and enqueued["slot"] is slot
    assert [int(f[n]) for n in ("batch", "seqlen_q", "seqlen_k", "num_heads", "num_heads_kv")] == \
        [3, total_q, total_k, H, Hkv]
    assert (int(f["window_left"]), int(f["window_right"])) == (-1, 0)
    assert c.zero_kv and c.row_grid == (-(-200 // tile.block_m), H, 3)
    assert c.sq_rounded >= total_q + 3 * tile.block_m and int(f["seqlen_q_rounded"]) == c.sq_rounded
    assert not c.fold and int(f["fold"]) == 0      # varlen backwards are never folded
    assert launchers.bwd_kernels(c) == ((c.specs.preprocess, c.row_grid), (c.specs.main, (c.tables.num_ctas,)),
                                        (c.specs.postprocess, c.row_grid))
    t = built["t"]
    np.testing.assert_array_equal(t.cu_q, cu_q)
    np.testing.assert_array_equal(t.cu_k, cu_k)
    assert t.policy == "fa3" and built["num_heads"] == 3 * H and t.expand     # rows written on the GPU (default)
    assert dq.shape == (total_q, H, D) and dk.shape == dv.shape == (total_k, Hkv, D)


def test_prepared_tables_are_the_ones_the_backward_uses(no_gpu, monkeypatch):
    """prepare_varlen_backward builds and uploads the table that a later attention_backward_varlen with the same
    lengths, heads, head dim, dtype and flags asks for (the same host plan object: a cache hit), and checks its
    arguments as the backward does."""
    total_q, H, Hkv = 300, 4, 2
    cu = np.array([0, 100, 100, 300], np.int32)
    (do, q, k, v, out, lse), _ = _operands(total_q, total_q, H, Hkv)
    seen = []
    P = types.SimpleNamespace

    def device(t, num_heads, dev, s, capture=False, done=False):
        seen.append((t, num_heads, done))
        return (P(visits=P(data=P(ptr=1)), rank=P(data=P(ptr=2)), cta_start=P(data=P(ptr=3)), num_ctas=t.num_ctas,
                  policy=t.policy), P(data=P(ptr=4)), P(data=P(ptr=5)), None)
    monkeypatch.setattr(varlen_device, "device", device)
    monkeypatch.setattr(api, "acquire_slot", lambda dev: P(dptr=0x9000, hdev=0x9800))
    monkeypatch.setattr(launchers, "enqueue_backward", lambda *a, **kw: None)
    monkeypatch.setattr(api, "_poll_errors", lambda: None)
    cupy_dash.prepare_varlen_backward(list(cu), cu, 200, 200, num_heads=H, num_heads_kv=Hkv, head_dim=D,
                                      dtype="bf16", causal=True, window=(500, 0), stream=Stream())
    cupy_dash.attention_backward_varlen(do, q, k, v, out, lse, cu, cu, 200, 200, causal=True, window=(500, 0))
    assert len(seen) == 2 and seen[0][0] is seen[1][0] and seen[0][1] == seen[1][1] == 3 * H
    assert [done for *_, done in seen] == [True, False]      # prepared: waited for, so no backward needs an event
    with pytest.raises(ValueError, match="cu_seqlens_q: expected 0 = cu"):
        cupy_dash.prepare_varlen_backward([0, 200, 100, 300], cu, 200, 200, num_heads=H, num_heads_kv=Hkv,
                                          head_dim=D)
    with pytest.raises(ValueError, match="num_heads % num_heads_kv"):
        cupy_dash.prepare_varlen_backward(cu, cu, 200, 200, num_heads=4, num_heads_kv=3, head_dim=D)
    with pytest.raises(ValueError, match="head_dim"):
        cupy_dash.prepare_varlen_backward(cu, cu, 200, 200, num_heads=4, num_heads_kv=2, head_dim=160)
