"""CPU test of the host fast path for CuPy callers (cupy_dash.core.fastpath): CuPy arrays over made-up device
addresses (no GPU needed to describe them), every GPU call replaced by the fakes of fastpath_fakes.py. A repeated
backward with CuPy arrays is served from the full path's plan, with CuPy outputs and the full path's block but
for its per-call fields; a mix of CuPy and torch operands has no signature (the full path serves it)."""
from __future__ import annotations

import numpy as np
import pytest

import cupy
import ml_dtypes
import cupy_dash
from cupy_dash.core import fastpath
from fastpath_fakes import BF16, Tensor, fixed_tables, no_gpu, served_backwards  # noqa: F401  (fixtures)


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
