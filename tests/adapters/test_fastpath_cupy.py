"""CPU test of the host fast path for CuPy callers (cupy_dash.core.fastpath): CuPy arrays over made-up device
addresses (no GPU needed to describe them), every GPU call replaced by the fakes of fastpath_fakes.py. A repeated
backward with CuPy arrays is served from the full path's plan, with CuPy outputs and the full path's block but
for its per-call fields, and so are repeated varlen calls; a mix of CuPy and torch operands has no signature (the
full path serves it)."""
from __future__ import annotations

import types

import numpy as np
import pytest

import cupy
import ml_dtypes
import cupy_dash
from cupy_dash.core import fastpath, fastpath_varlen
from cupy_dash.cuda import launchers
from fastpath_fakes import (BF16, Tensor, assert_full_paths_block, fixed_tables, forward_recorder,  # noqa: F401
                            no_gpu, served_backwards)


def _array(shape, dtype, ptr):
    """A CuPy array of ``shape`` at device address ``ptr`` (device 0), never read."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    memory = cupy.cuda.UnownedMemory(ptr, max(nbytes, 1), None, device_id=0)
    return cupy.ndarray(shape, dtype=dtype, memptr=cupy.cuda.MemoryPointer(memory, 0))


@pytest.fixture
def cupy_calls(fixed_tables, monkeypatch):
    addresses = iter(range(0x9000000, 0xF000000, 0x100000))

    def empty(shape, dtype=float):
        return _array(tuple(shape) if isinstance(shape, tuple) else (shape,), dtype, next(addresses))
    monkeypatch.setattr(fastpath.cupy, "empty", empty)
    yield fixed_tables


def _inputs(S=128, H=2):
    bf16 = ml_dtypes.bfloat16
    q, do, out, k, v = (_array((1, S, H, 128), bf16, p) for p in (0x10000, 0x40000, 0x50000, 0x20000, 0x30000))
    lse = _array((1, H, S), np.float32, 0x60000)
    return do, q, k, v, out, lse


def test_a_repeated_cupy_backward_is_served_from_the_full_paths_plan(cupy_calls):
    enqueued = cupy_calls
    args = _inputs()
    for e, g in served_backwards(enqueued, args, 2, causal=True, schedule="fa3"):
        fast = e["params"]
        assert all(type(x) is cupy.ndarray for x in g)
        assert (int(fast["dq"]), int(fast["dk"]), int(fast["dv"])) == tuple(x.data.ptr for x in g)
        assert [x.shape for x in g] == [args[1].shape, args[2].shape, args[2].shape]
    q, k = args[1], args[2]
    assert int(enqueued[-1]["params"]["q"]) == q.data.ptr and int(enqueued[-1]["params"]["k"]) == k.data.ptr
    moved = (args[0], _array(q.shape, q.dtype, 0x70000), *args[2:])      # another address: served
    hits = fastpath.stats()["bwd_hits"]
    cupy_dash.attention_backward(*moved, causal=True, schedule="fa3")
    assert fastpath.stats()["bwd_hits"] == hits + 1 and int(enqueued[-1]["params"]["q"]) == 0x70000


def test_mixed_frameworks_have_no_signature():
    do, q, k, v, out, lse = _inputs()
    assert fastpath.bwd_key(Tensor(do.shape, BF16, 0x40000), q, k, v, out, lse, True, None, "fa3", True,
                            (-1, 0)) is None
    assert fastpath.fwd_key(q, k, v, True, None, (-1, 0)) is not None
    assert fastpath.fwd_key(q, k, Tensor(v.shape, BF16, 0x30000), True, None, (-1, 0)) is None
    key = fastpath.bwd_key(do, q, k, v, out, lse, True, None, "fa3", True, (-1, 0))
    torch_like = fastpath.bwd_key(*(Tensor(x.shape, BF16, x.data.ptr) for x in (do, q, k, v, out, lse)), True,
                                  None, "fa3", True, (-1, 0))
    assert key is not None and torch_like is not None and key != torch_like


def test_repeated_cupy_varlen_calls_are_served(no_gpu, monkeypatch):
    """Varlen calls with CuPy arrays: a repeated backward (host lengths) and forward (device lengths) are served from
    the full path's plans, with CuPy outputs and the full path's block but for the per-call fields; device lengths
    in the backward (no host copy for CuPy arrays) take the full path."""
    enqueued = no_gpu
    addresses = iter(range(0x9000000, 0xF000000, 0x100000))
    monkeypatch.setattr(fastpath.cupy, "empty", lambda shape, dtype=float: _array(
        tuple(shape) if isinstance(shape, tuple) else (shape,), dtype, next(addresses)))
    monkeypatch.setattr(cupy.cuda, "get_current_stream", lambda device=None: types.SimpleNamespace(ptr=0x77))
    bf16 = ml_dtypes.bfloat16
    q, do, out = (_array((300, 4, 128), bf16, p) for p in (0x10000, 0x40000, 0x50000))
    k, v = (_array((500, 2, 128), bf16, p) for p in (0x20000, 0x30000))
    lse = _array((4, 300), np.float32, 0x60000)
    cu_q, cu_k = np.array([0, 100, 100, 300], np.int32), np.array([0, 200, 260, 500], np.int32)
    kw = dict(causal=True, schedule="fa3")
    cupy_dash.attention_backward_varlen(do, q, k, v, out, lse, cu_q, cu_k, 200, 240, **kw)
    hits = fastpath_varlen.stats()["hits"]
    grads = cupy_dash.attention_backward_varlen(do, q, k, v, out, lse, cu_q, cu_k, 200, 240, **kw)
    assert fastpath_varlen.stats()["hits"] == hits + 1 and len(enqueued) == 2
    assert all(type(g) is cupy.ndarray for g in grads)
    assert_full_paths_block(enqueued[0]["params"], enqueued[1]["params"])
    assert (int(enqueued[1]["params"]["dq"]), int(enqueued[1]["params"]["q"])) == (grads[0].data.ptr, q.data.ptr)
    launched = []
    monkeypatch.setattr(launchers, "enqueue_forward", forward_recorder(launched))
    dcu_q, dcu_k = _array((4,), np.int32, 0x70000), _array((4,), np.int32, 0x70100)
    cupy_dash.attention_forward_varlen(q, k, v, dcu_q, dcu_k, 200, 240, causal=True)
    fwd = fastpath_varlen.stats()["fwd_hits"]
    out2, _ = cupy_dash.attention_forward_varlen(q, k, v, dcu_q, dcu_k, 200, 240, causal=True)
    assert fastpath_varlen.stats()["fwd_hits"] == fwd + 1 and type(out2) is cupy.ndarray
    (_, full), (_, fast) = launched
    assert (int(fast["cu_seqlens_q"]), int(fast["cu_seqlens_k"])) == (0x70000, 0x70100)
    assert int(fast["out"]) == out2.data.ptr and bytes(full["tma_q"]) == bytes(fast["tma_q"])
    assert fastpath_varlen.key(do, q, k, v, out, lse, dcu_q, dcu_k, 200, 240, True, None, (-1, 0), "fa3",
                               True) is None
