"""CPU tests of the varlen backward under CUDA graph capture (torch.compile's reduce-overhead mode records the
backward into a graph after one eager warm-up step), with every GPU call replaced, torch tensors imitated and the
capture faked (interop.capturing True, torch's current stream another one, the fast path stepping aside as it does
on a capturing stream). The real device-table cache (device_tables.cached through varlen_device.device) holds the
tables, with the upload, the GPU expansion and the deferred release counted instead of run. A captured call
launches from the table its eager warm-up left in the cache, with the graph's error record and no slot, and uploads,
expands and waits for nothing; a packing never run eagerly, or kernels never loaded, are made outside the capture
(capture.outside, faked); device cu_seqlens whose host copy no eager call waited for raise RuntimeError before
anything is enqueued."""
from __future__ import annotations

import collections
import contextlib
import types

import numpy as np
import pytest

import cupy_dash
from cupy_dash.core import api, fastpath, fastpath_varlen, interop, varlen_host_cu
from cupy_dash.cuda import device_tables, kernels, varlen_device
from fastpath_fakes import (Tensor, _Dtype, _inputs, fake_bwd_entry, no_gpu, outside_capture,  # noqa: F401
                            PER_CALL_FIELDS, assert_output_maps)

REAL_DEVICE = varlen_device.device          # taken before no_gpu replaces it
I32 = _Dtype("int32", 4)
EAGER, RECORDING = 0x77, 0x99               # torch's current stream: the warm-up's, the graph's
GRAPH_RECORD = 0xE000
_PER_CALL = PER_CALL_FIELDS
CU_Q, CU_K = [0, 100, 100, 300], [0, 200, 260, 500]                 # longest 200 / 260


class _Buffer:
    """A cupy MemoryPointer stand-in: an address, and the address ``n`` bytes on."""

    def __init__(self, ptr):
        self.ptr = ptr

    def __add__(self, n):
        return _Buffer(self.ptr + n)


@pytest.fixture
def graphs(no_gpu, monkeypatch):
    """no_gpu with the real varlen table cache (an empty one), kernels by their flags, and ``state.capturing`` to
    switch the faked capture on. ``state`` counts uploads, expansions, event waits, stream synchronizations,
    device-to-host copies, graph records taken, error polls and checks, slots; ``state.enqueued``: no_gpu's list
    of enqueued backwards."""
    state = types.SimpleNamespace(capturing=False, uploads=[], expansions=[], waits=[], syncs=[], copies=[],
                                  records=[], polls=0, checks=0, slots=0, enqueued=no_gpu, device={})
    monkeypatch.setattr(varlen_device, "device", REAL_DEVICE)
    monkeypatch.setattr(device_tables, "_caches", {form: collections.OrderedDict() for form in device_tables._LIMITS})
    monkeypatch.setattr(device_tables, "_captured", {})
    addresses = iter(range(0x4000000, 0x8000000, 0x100000))

    def upload(pieces, nbytes, extra_bytes, stream, staging_out, pinned=False, wait=False):
        state.uploads.append(stream.ptr)
        return _Buffer(next(addresses)), -(-nbytes // 256) * 256
    monkeypatch.setattr(device_tables, "_upload", upload)
    monkeypatch.setattr(device_tables, "_defer_release", lambda *args: None)
    monkeypatch.setattr(varlen_device, "_expand_launches",
                        {0: lambda num_ctas, stream, values: state.expansions.append(stream.ptr)})

    monkeypatch.setattr(kernels, "bwd_entry", fake_bwd_entry)

    class Stream(contextlib.nullcontext):
        def __init__(self, ptr):
            super().__init__()
            self.ptr = ptr

        def wait_event(self, event):
            state.waits.append(event)

        def synchronize(self):
            state.syncs.append(self.ptr)
    current = lambda: RECORDING if state.capturing else EAGER  # noqa: E731
    monkeypatch.setattr(interop, "capturing", lambda x: state.capturing)
    monkeypatch.setattr(interop, "caller_stream", lambda x, dev: Stream(current()))
    monkeypatch.setattr(interop, "_torch_stream_ptr", lambda dev: current())
    monkeypatch.setattr(fastpath, "_ready_stream", lambda plan: None if state.capturing else Stream(EAGER))

    def record(dev, info):
        state.records.append(info)
        return GRAPH_RECORD
    monkeypatch.setattr(api, "graph_record", record)
    monkeypatch.setattr(api, "record_shared", lambda dev, ptr: False)
    acquire = api.acquire_slot

    def slot(dev):
        state.slots += 1
        return acquire(dev)
    monkeypatch.setattr(api, "acquire_slot", slot)

    def poll():
        state.polls += 1

    def check():
        state.checks += 1
    monkeypatch.setattr(api, "_poll_errors", poll)
    monkeypatch.setattr(api, "check_errors", check)
    monkeypatch.setenv("CUPY_DASH_SYNC_ERRORS", "1")          # eager calls check; captured ones must not

    # device memory and the forward's host copies (varlen_host_cu) of device cu_seqlens
    def memcpy(dst, src, nbytes, kind, stream):
        state.copies.append(src)
        np.ctypeslib.as_array((np.ctypeslib.ctypes.c_int32 * (nbytes // 4)).from_address(dst))[:] = state.device[src]

    class Event:
        def __init__(self, **kw):
            self.synced = 0

        def record(self, stream):
            pass

        def synchronize(self):
            assert not state.capturing, "a wait during capture"
            self.synced += 1
    monkeypatch.setattr(varlen_host_cu.cupyx, "empty_pinned", lambda n, dtype: np.zeros(n, dtype))
    monkeypatch.setattr(varlen_host_cu.cupy.cuda.runtime, "memcpyAsync", memcpy)
    monkeypatch.setattr(varlen_host_cu.cupy.cuda, "Event", Event)
    varlen_host_cu.clear()
    yield state
    varlen_host_cu.clear()


def _device_cu(values, ptr, state):
    """A device int32 cu_seqlens (torch stand-in) at ``ptr`` holding ``values``, with what varlen_host_cu holds of
    a tensor (its storage, its version)."""
    cu = Tensor((len(values),), I32, ptr)
    cu._version = 0
    cu.untyped_storage = lambda: types.SimpleNamespace(nbytes=lambda: 4 * len(values))
    state.device[ptr] = np.asarray(values, np.int32)
    return cu


def _forward_copies(state, *cus):
    """What the varlen forward does for its backward: the asynchronous host copies of its device cu_seqlens."""
    for cu in cus:
        varlen_host_cu.remember(cu, interop.describe(cu, "cu_seqlens"), cu.ptr, types.SimpleNamespace(ptr=EAGER))


def _counts(state):
    return (len(state.enqueued), len(state.uploads), len(state.expansions), len(state.waits), len(state.syncs),
            len(state.copies), len(state.records), state.slots, len(device_tables._captured))


@pytest.mark.parametrize("softcap", [0.0, 30.0], ids=["plain", "softcap"])
def test_a_captured_call_launches_from_the_warm_up_table_with_the_graph_record(graphs, softcap):
    """Host cu_seqlens: the eager warm-up builds, uploads and expands the packing's table on its stream; the
    captured call (another stream) finds it in the cache and launches with the same block but for the per-call
    fields, its error record the graph's (no host mirror, no slot): nothing uploaded, expanded or waited for, no
    error poll or check, no fast-path plan; the table is kept for the graph."""
    state = graphs
    args = _inputs()
    kw = dict(causal=True, schedule="fa3", softcap=softcap)
    cupy_dash.attention_backward_varlen(*args, np.array(CU_Q, np.int32), CU_K, 200, 240, **kw)
    assert (len(state.uploads), len(state.expansions), state.slots, state.polls, state.checks) == (1, 1, 1, 1, 1)
    eager = state.enqueued[-1]
    plans = dict(fastpath_varlen._plans)
    state.capturing = True
    dq, dk, dv = cupy_dash.attention_backward_varlen(*args, np.array(CU_Q, np.int32), list(CU_K), 200, 240, **kw)
    assert (len(state.uploads), len(state.expansions), state.waits, state.syncs) == (1, 1, [], [])
    assert (state.slots, state.polls, state.checks) == (1, 1, 1)
    assert len(state.enqueued) == 2 and fastpath_varlen._plans == plans
    captured = state.enqueued[-1]
    block = captured["params"]
    assert captured["slot"] is None and (int(block["error"]), int(block["error_host"])) == (GRAPH_RECORD, 0)
    assert (int(block["dq"]), int(block["dk"]), int(block["dv"])) == (dq.ptr, dk.ptr, dv.ptr) == captured["grads"]
    for name in kernels.BWD_PARAMS_DTYPE.names:
        if name not in _PER_CALL:
            same = bytes(np.atleast_1d(eager["params"][name]).view(np.uint8)) == bytes(
                np.atleast_1d(block[name]).view(np.uint8))
            assert same, name
    assert_output_maps(block)
    c = captured["c"]
    assert c.tables is eager["c"].tables and not c.fold
    assert state.records == [(c.tables.policy, 3, 4, 300, 500, 128, True, (-1, 0))]
    assert [entry[0] for entry in device_tables._captured.values()] == [c.tables]


def test_a_packing_not_run_eagerly_is_made_outside_the_capture(graphs, outside_capture):
    """A packing's first call is the captured one: its table is built, uploaded and expanded on the stream of
    capture.outside (the thread's capture mode relaxed, then restored), which is synchronized; the captured stream
    waits for no event; the launch reads that table, which the cache keeps for the graph; a second capture of the
    packing finds it (nothing made again)."""
    state = graphs
    args = _inputs()
    cupy_dash.attention_backward_varlen(*args, np.array(CU_Q, np.int32), CU_K, 200, 240, causal=True)
    side, relaxed = outside_capture.SIDE, outside_capture.RELAXED
    state.capturing = True
    new = (np.array([0, 150, 300], np.int32), [0, 240, 500], 150, 260)
    outside_capture.modes.clear()
    cupy_dash.attention_backward_varlen(*args, *new, causal=True)
    assert state.uploads[-1] == state.expansions[-1] == side and len(state.uploads) == 2
    assert state.waits == [] and state.syncs == [] and outside_capture.syncs.count(side) >= 1
    assert outside_capture.modes[:2] == [relaxed, 0] and not outside_capture.inside
    captured = state.enqueued[-1]
    assert captured["slot"] is None and captured["c"].tables in [e[0] for e in device_tables._captured.values()]
    cupy_dash.attention_backward_varlen(*args, *new, causal=True)
    assert len(state.uploads) == 2 and state.enqueued[-1]["c"].tables is captured["c"].tables
    state.capturing = False                  # an eager call of that packing now finds the same table
    cupy_dash.attention_backward_varlen(*args, *new, causal=True)
    assert len(state.uploads) == 2 and state.enqueued[-1]["c"].tables is captured["c"].tables


def test_kernels_not_loaded_are_loaded_outside_the_capture(graphs, outside_capture, monkeypatch):
    state = graphs
    args = _inputs()
    loads = []

    def entry(*a, **kw):
        loads.append(outside_capture.inside)
        return fake_bwd_entry(*a, **kw)
    monkeypatch.setattr(kernels, "bwd_entry", entry)
    state.capturing = True
    cupy_dash.attention_backward_varlen(*args, np.array(CU_Q, np.int32), CU_K, 200, 240, causal=True)
    assert loads and all(loads) and not outside_capture.inside
    assert state.enqueued[-1]["slot"] is None and state.uploads == [outside_capture.SIDE]


@pytest.mark.parametrize("copy", ["none", "not waited for"])
def test_device_cu_seqlens_without_a_waited_host_copy_raise_before_anything_is_enqueued(graphs, copy):
    """No forward copy of these tensors (a tensor the graph copies in), or one that no eager call waited for: the
    lengths cannot be had without a wait, which capture forbids (no copy, no synchronization either)."""
    state = graphs
    args = _inputs()
    cupy_dash.attention_backward_varlen(*args, np.array(CU_Q, np.int32), CU_K, 200, 240, causal=True)
    cu_q, cu_k = _device_cu(CU_Q, 0x70000, state), _device_cu(CU_K, 0x70100, state)
    if copy == "not waited for":
        _forward_copies(state, cu_q, cu_k)
    before = _counts(state)
    state.capturing = True
    with pytest.raises(RuntimeError, match="cu_seqlens_q has none.*run one eager step first"):
        cupy_dash.attention_backward_varlen(*args, cu_q, cu_k, 200, 240, causal=True)
    assert _counts(state) == before


def test_device_cu_seqlens_whose_copy_an_eager_call_waited_for_are_captured(graphs):
    """A module buffer's cu_seqlens: the forward copied it, the eager backward waited for the copy once; the
    captured backward reads that copy (no wait, no copy) and launches from the warm-up's table."""
    state = graphs
    args = _inputs()
    cu_q, cu_k = _device_cu(CU_Q, 0x70000, state), _device_cu(CU_K, 0x70100, state)
    _forward_copies(state, cu_q, cu_k)
    cupy_dash.attention_backward_varlen(*args, cu_q, cu_k, 200, 240, causal=True)
    eager = state.enqueued[-1]
    copies, syncs = len(state.copies), len(state.syncs)
    assert copies == 2 and syncs == 0                    # the forward's copies; no synchronizing copy
    state.capturing = True
    _forward_copies(state, cu_q, cu_k)                   # a captured forward enqueues none
    cupy_dash.attention_backward_varlen(*args, cu_q, cu_k, 200, 240, causal=True)
    captured = state.enqueued[-1]
    assert (len(state.copies), len(state.syncs), len(state.uploads), state.waits) == (copies, syncs, 1, [])
    assert captured["slot"] is None and int(captured["params"]["error"]) == GRAPH_RECORD
    assert captured["c"].tables is eager["c"].tables
    assert (int(captured["params"]["cu_seqlens_q"]), int(captured["params"]["cu_seqlens_k"])) == (
        int(eager["params"]["cu_seqlens_q"]), int(eager["params"]["cu_seqlens_k"]))


@pytest.mark.parametrize("lengths,window,block_m", [
    ([3, kernels.VARLEN80_MIN_SEQLEN], (-1, -1), 80),
    ([3, kernels.VARLEN80_MIN_SEQLEN - 1], (-1, -1), 64),
    ([3, kernels.VARLEN80_MIN_SEQLEN], (100, 100), 64),
], ids=["longest-at-threshold", "longest-below", "window"])
def test_the_packings_longest_sequence_picks_the_tile(graphs, lengths, window, block_m, monkeypatch):
    """Head dim 128: a packing whose longest sequence reaches kernels.VARLEN80_MIN_SEQLEN launches with 80-query
    tiles (without a window), any other with 64, and its table is built for that tile."""
    from fastpath_fakes import BF16, F32, Tensor
    state, planned, plan = graphs, [], varlen_device.plan
    monkeypatch.setattr(varlen_device, "plan", lambda *a, **kw: planned.append(a[3]) or plan(*a, **kw))
    total, H, D = sum(lengths), 2, 128
    base = iter(range(0x1000000, 0x10000000, 0x1000000))
    do, q, k, v, out = (Tensor((total, H, D), BF16, next(base)) for _ in range(5))
    lse = Tensor((H, total), F32, next(base))
    cu = np.cumsum([0] + lengths).astype(np.int32)
    cupy_dash.attention_backward_varlen(do, q, k, v, out, lse, cu, cu, max(lengths), max(lengths), window=window)
    c = state.enqueued[-1]["c"]
    assert c.block_m == block_m and planned == [block_m]
