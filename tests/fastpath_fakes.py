"""torch imitated and every GPU call of the host fast paths replaced (not a test module): torch dtypes and a
contiguous torch CUDA tensor stand-in, the ``no_gpu`` fixture (tensor maps, allocations, streams, kernels, schedule
tables, error slots, the launch and capture.outside replaced; yields the list of enqueued backwards; the
``outside_capture`` fixture: what was made outside a faked capture), a packed varlen batch of such
tensors, and per-packing made-up table addresses. It sits beside conftest.py because more than one layer uses it:
adapters/test_fastpath_varlen.py, adapters/test_fastpath_host.py, unit/test_config.py, and the benchmark scripts
benchmarks/host_python.py and benchmarks/host_varlen_python.py; and a backward launch of made-up tables
(unit/test_launch_plans.py, adapters/test_jax_ffi.py)."""
from __future__ import annotations

import contextlib
import types

import numpy as np
import pytest

from cupy_dash.core import api, fastpath, fastpath_varlen, interop, varlen
from cupy_dash.cuda import capture, device_tables, errors, kernels, launchers, plans, tensormap, varlen_device


class _Dtype:
    def __init__(self, name, size):
        self.name, self.size = name, size

    def __str__(self):
        return f"torch.{self.name}"


BF16, F32, U8, I32 = _Dtype("bfloat16", 2), _Dtype("float32", 4), _Dtype("uint8", 1), _Dtype("int32", 4)


class Tensor:
    """A torch CUDA tensor stand-in (the class name and module are what cupy_dash checks), contiguous."""
    __module__ = "torch"
    is_cuda = True
    device = "cuda:0"

    def __init__(self, shape, dtype, ptr):
        self.shape, self.dtype, self.ptr = tuple(shape), dtype, ptr

    def stride(self):
        out, acc = [], 1
        for n in reversed(self.shape):
            out.append(acc)
            acc *= n
        return tuple(reversed(out))

    def data_ptr(self):
        return self.ptr

    def get_device(self):
        return 0

    def is_inference(self):
        return False

    def is_contiguous(self):
        return True

    def element_size(self):
        return self.dtype.size

    def __getitem__(self, index):
        assert index is None
        return Tensor((1, *self.shape), self.dtype, self.ptr)


def fake_bwd_entry(dev, dtype, head_dim, causal, timeline=False, compact=False, softcap=False, seqlen_q=0,
                   window=(-1, -1), head_dim_v=None):
    """kernels.bwd_entry without a GPU: the variant's specs and tile, 132 co-resident CTAs."""
    tile = kernels.bwd_tile(head_dim, causal, compact, seqlen_q, window)
    specs = kernels.bwd_specs(dtype, head_dim, causal, timeline, compact, softcap=softcap, seqlen_q=seqlen_q,
                              window=window, head_dim_v=head_dim_v)
    return specs, tile.block_m, tile.block_n, 132


class FakeCapture:
    """cupy_dash.cuda.capture.outside without a driver: ``modes`` the thread's capture modes it set, ``inside``
    whether a block runs now, ``syncs`` its stream's synchronizations (the stream's ``ptr`` is SIDE)."""
    SIDE = 0x55
    RELAXED = 2

    def __init__(self, monkeypatch):
        self.modes, self.syncs, self.inside = [], [], False
        fake = self

        class Side(contextlib.nullcontext):
            ptr = FakeCapture.SIDE

            def synchronize(self):
                fake.syncs.append(self.ptr)

            def wait_event(self, event):
                raise AssertionError("a stream made for work outside a capture waits for no event")

        def exchange(mode):
            old = self.RELAXED if self.inside else 0
            self.modes.append(int(mode))
            self.inside = int(mode) == self.RELAXED
            return old
        monkeypatch.setattr(capture, "_exchange", exchange)
        monkeypatch.setattr(capture, "_streams", {0: Side()})
        monkeypatch.setattr(capture, "cuda_driver", lambda: types.SimpleNamespace(
            CUstreamCaptureMode=types.SimpleNamespace(CU_STREAM_CAPTURE_MODE_RELAXED=self.RELAXED)))


_installed: list = []       # the FakeCapture of the running test's no_gpu


@pytest.fixture
def outside_capture(no_gpu):
    """The FakeCapture that ``no_gpu`` installed: what was made outside a faked CUDA graph capture."""
    return _installed[0]


@pytest.fixture
def no_gpu(monkeypatch):
    addresses = iter(range(0x1000000, 0x9000000, 0x10000))

    def empty(shape, dtype=None, device=None):
        return Tensor(shape if isinstance(shape, tuple) else (shape,), dtype, next(addresses))
    fake_torch = types.SimpleNamespace(empty=empty, uint8=U8, float32=F32, int32=I32,
                                       empty_like=lambda t: empty(t.shape, t.dtype))
    monkeypatch.setattr(fastpath, "_torch", fake_torch)
    monkeypatch.setattr(fastpath, "_ready_stream", lambda plan: types.SimpleNamespace(ptr=0x77))
    monkeypatch.setattr(interop, "_torch_stream_ptr", lambda dev: 0x77)
    monkeypatch.setattr(interop, "capturing", lambda x: False)
    monkeypatch.setattr(tensormap, "bhsd_map", lambda ptr, *a, **kw: int(ptr).to_bytes(8, "little").ljust(128, b"\0"))
    monkeypatch.setattr(tensormap, "check_encodable", lambda *a, **kw: None)

    def new(fw, dev, shape, dtype):
        t = empty(tuple(shape), {"uint8": U8, "float32": F32, "int32": I32}.get(dtype, BF16))
        return t, t.ptr
    monkeypatch.setattr(api, "_new", new)
    monkeypatch.setattr(api, "_export", lambda fw, arr, like: arr)

    class Stream(contextlib.nullcontext):
        ptr = 0x77

        def wait_event(self, event):
            pass
    monkeypatch.setattr(interop, "caller_stream", lambda x, dev: Stream())
    monkeypatch.setattr(varlen.cupy.cuda, "Device", lambda dev: contextlib.nullcontext())
    monkeypatch.setattr(launchers, "l2_bytes", lambda dev: 60 << 20)    # the H200's L2 and SMs
    monkeypatch.setattr(kernels, "sm_count", lambda dev: 132)
    monkeypatch.setattr(kernels, "bwd_entry", fake_bwd_entry)
    ptr = types.SimpleNamespace

    def device(t, num_heads, dev, s, capture=False):
        tables = ptr(visits=ptr(data=ptr(ptr=0x7000)), rank=ptr(data=ptr(ptr=0x7100)),
                     cta_start=ptr(data=ptr(ptr=0x7200)), num_ctas=t.num_ctas, policy=t.policy)
        return tables, ptr(data=ptr(ptr=0x8000)), ptr(data=ptr(ptr=0x8100)), None
    monkeypatch.setattr(varlen_device, "device", device)
    slots = iter(range(0xA000, 0xB000, 0x40))

    def acquire(dev):
        d = next(slots)
        return ptr(dptr=d, hdev=d + 0x10000)
    monkeypatch.setattr(api, "acquire_slot", acquire)
    monkeypatch.setattr(errors, "acquire_slot", acquire)
    monkeypatch.setattr(plans.jit, "load", lambda spec: types.SimpleNamespace(ptr=0xF00))
    enqueued = []
    monkeypatch.setattr(launchers, "enqueue_backward", recorder(enqueued))
    monkeypatch.setattr(launchers, "enqueue_forward", lambda plan, stream, buffers: assert_packed(plan, buffers))
    monkeypatch.setattr(errors, "poll_errors", lambda: None)
    monkeypatch.setattr(api, "_poll_errors", lambda: None)
    monkeypatch.setattr(device_tables, "keep_alive", lambda keep, stream, event=None: None)   # no events here
    monkeypatch.setattr(fastpath.cupy.cuda.runtime, "streamIsCapturing", lambda ptr: 0)
    _installed[:] = [FakeCapture(monkeypatch)]
    fastpath_varlen.clear()
    plans.clear()
    yield enqueued
    fastpath_varlen.clear()
    plans.clear()


def recorder(enqueued):
    """A launchers.enqueue_backward that runs nothing: it appends to ``enqueued`` what the executor would launch,
    ``dict(c, params (the block, from the plan in inspect mode), grads (dq, dk, dv addresses), slot, launches
    (the plan's kernels), buffers)``, after checking that block against the launchers' own packing for the same
    addresses (:func:`assert_launchers_block`)."""
    def enqueue(c, stream, buffers, *, slot=None, call=None):
        block = np.frombuffer(c.plan.inspect(tuple(buffers)), dtype=kernels.BWD_PARAMS_DTYPE)[0]
        assert_launchers_block(c, block, buffers)
        assert_packed(c.plan, buffers)
        enqueued.append(dict(c=c, params=block, grads=tuple(buffers[6:9]), slot=slot, launches=launches(c.plan),
                             buffers=tuple(buffers)))
    return enqueue


def assert_launchers_block(c, block, buffers) -> None:
    """``block`` (a backward's, run with ``buffers`` in plans.BWD_BUFFERS' order) is byte for byte the block that
    launchers.bwd_params packs for ``c`` and those addresses (the operands' strides, the varlen lengths and, where
    the plan fixes it, the error record: the block's own)."""
    qs, kvs, vs, os_, dos = (tuple(int(x) for x in block[f"{n}_stride"]) for n in ("q", "k", "v", "o", "do"))
    dout, q, k, v, out, lse, dq, dk, dv, work = buffers[:10]
    error = tuple(buffers[10:12]) if len(buffers) > 10 else (int(block["error"]), int(block["error_host"]))
    want = launchers.bwd_params(c, ((q, qs), (k, kvs), (v, vs), (out, os_), (dout, dos)), lse, work, (dq, dk, dv),
                                error, int(block["timeline"]),
                                (int(block["cu_seqlens_q"]), int(block["cu_seqlens_k"])))[0]
    for name in kernels.BWD_PARAMS_DTYPE.names:
        assert bytes(np.atleast_1d(want[name]).view(np.uint8)) == bytes(np.atleast_1d(block[name]).view(np.uint8)), \
            name


def assert_packed(plan, buffers) -> None:
    """The block a launch plan runs with for ``buffers`` is the one its packer packs for those addresses (a plan
    without one, a rebased backward, is checked by :func:`assert_launchers_block`)."""
    if plan.parts.pack is not None:
        assert plan.inspect(tuple(buffers)) == plan.parts.pack(dict(zip(plan.parts.names, buffers))).tobytes()


def forward_recorder(launched):
    """A launchers.enqueue_forward that runs nothing: it appends ``(grid (x, y, z), block)`` to ``launched``, after
    :func:`assert_packed`."""
    def enqueue(plan, stream, buffers):
        assert_packed(plan, buffers)
        block = np.frombuffer(plan.inspect(tuple(buffers)), dtype=kernels.FWD_PARAMS_DTYPE)[0]
        launched.append((kernels.grid_xyz(plan.parts.kernels[0][1]), block))
    return enqueue


def launches(plan) -> tuple:
    """``(function, grid x, y, z, threads, dynamic smem)`` of every kernel of a launch plan."""
    return tuple((f, *kernels.grid_xyz(g), t, smem) for f, g, t, smem in plan.parts.kernels)


def _inputs():
    total_q, total_k, H, Hkv, D = 300, 500, 4, 2, 128
    q, do, out = (Tensor((total_q, H, D), BF16, p) for p in (0x10000, 0x40000, 0x50000))
    k, v = (Tensor((total_k, Hkv, D), BF16, p) for p in (0x20000, 0x30000))
    lse = Tensor((H, total_q), F32, 0x60000)
    return do, q, k, v, out, lse


def _tables_per_packing(monkeypatch):
    """varlen_device.device replaced by one that gives every packing (table key) its own made-up addresses."""
    ptr, seen = types.SimpleNamespace, {}

    def device(t, num_heads, dev, s, capture=False):
        base = seen.setdefault(t.key, 0x100000 * (len(seen) + 1))
        tables = ptr(visits=ptr(data=ptr(ptr=base)), rank=ptr(data=ptr(ptr=base + 0x100)),
                     cta_start=ptr(data=ptr(ptr=base + 0x200)), num_ctas=t.num_ctas, policy=t.policy)
        return tables, ptr(data=ptr(ptr=base + 0x300)), ptr(data=ptr(ptr=base + 0x400)), None
    monkeypatch.setattr(varlen_device, "device", device)


@pytest.fixture
def fixed_tables(no_gpu, monkeypatch):
    """``no_gpu`` with the fixed-length backward's schedule tables and kernels replaced (head dim 128, causal,
    deterministic; 132 CTAs) and the fast path's plans cleared; yields the list of enqueued backwards."""
    ptr = types.SimpleNamespace

    def tables(schedule, c, max_ctas, dev, stream, capture=False, compact=False):
        return ptr(visits=ptr(data=ptr(ptr=0x7000)), rank=ptr(data=ptr(ptr=0x7100)),
                   cta_start=ptr(data=ptr(ptr=0x7200)), num_ctas=33, policy="fa3")
    monkeypatch.setattr(launchers, "bwd_tables", tables)
    monkeypatch.setattr(kernels, "bwd_entry", fake_bwd_entry)
    monkeypatch.setattr(api, "_poll_errors", lambda: None)
    fastpath.clear()
    yield no_gpu
    fastpath.clear()


PER_CALL_FIELDS = ("lse_log2", "dpsum", "dq_accum", "dq_semaphore", "dq", "dk", "dv", "tma_dk", "tma_dv", "error",
                   "error_host")


def assert_output_maps(block) -> None:
    """The dk / dv tensor maps of a patched block describe its dk / dv (the executor's inspect mode writes a map's
    address over its first 8 bytes)."""
    for name in ("dk", "dv"):
        assert int.from_bytes(bytes(np.atleast_1d(block[f"tma_{name}"]).view(np.uint8))[:8], "little") == \
            int(block[name]), name


def assert_full_paths_block(full, fast) -> None:
    """A fast-path backward's parameter block ``fast`` equals the full path's ``full`` but for the per-call fields
    (scratch, outputs and their maps, error record; PER_CALL_FIELDS)."""
    for name in kernels.BWD_PARAMS_DTYPE.names:
        if name not in PER_CALL_FIELDS:
            assert bytes(np.atleast_1d(full[name]).view(np.uint8)) == \
                bytes(np.atleast_1d(fast[name]).view(np.uint8)), name
    assert_output_maps(fast)


def served_backwards(enqueued, args, calls, **kwargs) -> list:
    """The backward of ``args`` (keyword arguments ``kwargs``) once by the full path, then ``calls`` times more,
    which the fast path must serve (one launch each, ``enqueued``: the fake launcher's records) with the full path's
    parameter block but for the per-call fields: ``[(record, (dq, dk, dv))]`` of those calls."""
    import cupy_dash
    cupy_dash.attention_backward(*args, **kwargs)
    hits = fastpath.stats()["bwd_hits"]
    grads = [cupy_dash.attention_backward(*args, **kwargs) for _ in range(calls)]
    assert fastpath.stats()["bwd_hits"] == hits + calls and len(enqueued) == calls + 1
    for e in enqueued[1:]:
        assert_full_paths_block(enqueued[0]["params"], e["params"])
    return list(zip(enqueued[1:], grads))


def backward_launch(p, deterministic=True, window=(-1, 0)):
    """A causal bf16 launchers.BwdLaunch of the problem ``p`` with made-up per-visit tables (17 CTAs)."""
    specs = kernels.bwd_specs("bfloat16", p.D, True)
    tile = kernels.bwd_tile(p.D, True)
    c = launchers.BwdLaunch(specs, tile.block_m, tile.block_n, p, deterministic, 10**9, True, window)
    ptr = types.SimpleNamespace
    c.tables = types.SimpleNamespace(visits=ptr(data=ptr(ptr=0x5000)), rank=ptr(data=ptr(ptr=0x6000)),
                                     cta_start=ptr(data=ptr(ptr=0x7000)), num_ctas=17, policy="fa3")
    return c
