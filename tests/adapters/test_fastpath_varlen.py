"""CPU test of the varlen backward's host fast path (cupy_dash.core.fastpath_varlen) with every GPU call replaced and
torch tensors imitated: the first call takes the full path and stores a plan; a repeated call with the same
signature and lengths is served from it with a parameter block equal to the full path's except for the new
outputs, scratch and error slot; other lengths, flags or argument types miss and take the full path."""
from __future__ import annotations

import types

import numpy as np
import pytest

import cupy_dash
from cupy_dash.core import fastpath, fastpath_varlen
from cupy_dash.cuda import kernels, launchers
from fastpath_fakes import (BF16, F32, I32, PER_CALL_FIELDS, Tensor, _inputs,  # noqa: F401  (fixtures)
                            _tables_per_packing, assert_output_maps, forward_recorder, no_gpu, outside_capture)

_PER_CALL = PER_CALL_FIELDS


def test_a_repeated_call_is_served_with_the_full_paths_block(no_gpu):
    enqueued = no_gpu
    args = _inputs()
    cu_q, cu_k = np.array([0, 100, 100, 300], np.int32), [0, 200, 260, 500]
    kw = dict(causal=True, schedule="fa3")
    first = cupy_dash.attention_backward_varlen(*args, cu_q, cu_k, 200, 240, **kw)
    hits = fastpath_varlen.stats()["hits"]
    second = cupy_dash.attention_backward_varlen(*args, cu_q.copy(), list(cu_k), 200, 240, **kw)
    assert fastpath_varlen.stats()["hits"] == hits + 1 and len(enqueued) == 2
    full, fast = enqueued[0]["params"], enqueued[1]["params"]
    for name in kernels.BWD_PARAMS_DTYPE.names:
        if name not in _PER_CALL:
            same = bytes(np.atleast_1d(full[name]).view(np.uint8)) == bytes(np.atleast_1d(fast[name]).view(np.uint8))
            assert same, name
    assert_output_maps(fast)
    assert (int(fast["dq"]), int(fast["dk"]), int(fast["dv"])) == tuple(t.ptr for t in second) == enqueued[1]["grads"]
    assert (int(fast["error"]), int(fast["error_host"])) == (enqueued[1]["slot"].dptr, enqueued[1]["slot"].hdev)
    c = enqueued[1]["c"]
    work = int(fast["lse_log2"]) - c.offsets[0]
    assert [int(fast[n]) - work for n in ("lse_log2", "dpsum", "dq_accum", "dq_semaphore")] == list(c.offsets[:4])
    assert enqueued[1]["c"] is enqueued[0]["c"] and enqueued[1]["launches"][1][1:4] == (c.tables.num_ctas, 1, 1)
    assert [t.shape for t in second] == [t.shape for t in first]


@pytest.mark.parametrize("change", ["float lengths", "causal", "max_seqlen", "schedule", "int causal", "window"])
def test_a_different_call_takes_the_full_path(no_gpu, change):
    enqueued = no_gpu
    args = _inputs()
    cu_q, cu_k = np.array([0, 100, 100, 300], np.int32), np.array([0, 200, 260, 500], np.int32)
    kw = dict(causal=True, schedule="fa3")
    cupy_dash.attention_backward_varlen(*args, cu_q, cu_k, 200, 240, **kw)
    hits, new = fastpath_varlen.stats()["hits"], fastpath_varlen.stats()["new_packing_hits"]
    call = dict(cu_q=cu_q, cu_k=cu_k, max_q=200, kw=dict(kw))
    if change == "float lengths":
        call["cu_k"] = [0.0, 200.0, 260.0, 500.0]
    elif change == "causal":
        call["kw"]["causal"] = False
    elif change == "max_seqlen":
        call["max_q"] = 250
    elif change == "schedule":
        call["kw"]["schedule"] = "descending"
    elif change == "int causal":
        call["kw"]["causal"] = 1
    elif change == "window":
        call["kw"]["window"] = (64, 0)
    run = lambda: cupy_dash.attention_backward_varlen(*args, call["cu_q"], call["cu_k"], call["max_q"],  # noqa: E731
                                                       240, **call["kw"])
    if change in ("float lengths", "int causal"):
        with pytest.raises((TypeError, ValueError)):           # the full path's checks still raise
            run()
    else:
        run()
    if change == "max_seqlen":          # a new max with the same tensors: the template serves it as a new packing
        assert fastpath_varlen.stats()["new_packing_hits"] == new + 1
        assert enqueued[-1]["c"].varlen == (2 + 1, 250)
    else:
        assert fastpath_varlen.stats()["hits"] == hits


PACKINGS = [([0, 100, 100, 300], [0, 200, 260, 500]), ([0, 150, 300], [0, 240, 500]),
            ([0, 1, 2, 100, 300], [0, 7, 200, 240, 500]), ([0, 200, 300], [0, 250, 500])]   # max 200 / 260


def _longest(cu):
    return int(np.diff(cu).max())


@pytest.mark.parametrize("schedule", ["fa3", "symmetric_shift", "auto"])
def test_a_new_packing_is_served_with_the_full_paths_block(no_gpu, monkeypatch, schedule):
    """Other lengths of the same tensors, flags and stream: served from the first call's template (no validation
    of the tensors, no TMA encode) with the block, grids and scratch layout the full path gives those lengths:
    compared field by field with a full-path call of the same packing made after forgetting every plan."""
    enqueued = no_gpu
    _tables_per_packing(monkeypatch)
    args = _inputs()
    kw = dict(causal=True, schedule=schedule)
    run = lambda cu_q, cu_k: cupy_dash.attention_backward_varlen(  # noqa: E731
        *args, np.array(cu_q, np.int32), cu_k, _longest(cu_q), _longest(cu_k), **kw)
    run(*PACKINGS[0])
    for cu_q, cu_k in PACKINGS[1:]:
        new = fastpath_varlen.stats()["new_packing_hits"]
        run(cu_q, cu_k)
        assert fastpath_varlen.stats()["new_packing_hits"] == new + 1
        fast = enqueued[-1]
        work = int(fast["params"]["lse_log2"]) - fast["c"].offsets[0]     # the scratch laid out for this packing
        assert [int(fast["params"][n]) - work for n in ("dpsum", "dq_accum", "dq_semaphore")] == list(
            fast["c"].offsets[1:4])
        hits = fastpath_varlen.stats()["hits"]
        run(cu_q, cu_k)
        assert fastpath_varlen.stats()["hits"] == hits + 1                      # the packing's own plan now
        assert enqueued[-1]["c"] is fast["c"]
        fastpath_varlen.clear()
        run(cu_q, cu_k)
        full = enqueued[-1]
        assert fastpath_varlen.stats()["new_packing_hits"] == new + 1          # the full path this time
        for name in kernels.BWD_PARAMS_DTYPE.names:
            if name not in _PER_CALL:
                same = bytes(np.atleast_1d(full["params"][name]).view(np.uint8)) == bytes(
                    np.atleast_1d(fast["params"][name]).view(np.uint8))
                assert same, (name, cu_q, cu_k)
        cf, cs = full["c"], fast["c"]
        assert (cs.row_grid, cs.num_m_blocks, cs.sq_rounded, cs.work_bytes, cs.offsets) == (
            cf.row_grid, cf.num_m_blocks, cf.sq_rounded, cf.work_bytes, cf.offsets)
        assert fast["launches"] == full["launches"]


def test_a_new_packing_whose_window_becomes_vacuous_takes_the_full_path(no_gpu, monkeypatch):
    """A window that bounds the template's sequences (longest 200 / 260) but not a new packing's (150 / 240): the
    canonical window differs (a side becomes -1), so the block of the template cannot serve it; the full path does,
    and that packing's later calls are served from its own plan."""
    enqueued = no_gpu
    _tables_per_packing(monkeypatch)
    args = _inputs()
    run = lambda cu_q, cu_k: cupy_dash.attention_backward_varlen(  # noqa: E731
        *args, np.array(cu_q, np.int32), cu_k, _longest(cu_q), _longest(cu_k), window=(150, 150))
    run(*PACKINGS[0])
    new, hits = fastpath_varlen.stats()["new_packing_hits"], fastpath_varlen.stats()["hits"]
    run(*PACKINGS[1])
    assert fastpath_varlen.stats()["new_packing_hits"] == new
    assert enqueued[-1]["c"].window == (150, -1)
    run(*PACKINGS[1])
    assert fastpath_varlen.stats()["hits"] == hits + 1


@pytest.mark.parametrize("bad", ["last entry", "decreasing", "too long", "counts", "max above total"])
def test_a_new_packing_with_bad_lengths_raises_before_anything_is_enqueued(no_gpu, bad):
    enqueued = no_gpu
    args = _inputs()
    cupy_dash.attention_backward_varlen(*args, np.array([0, 100, 100, 300], np.int32), [0, 200, 260, 500], 200,
                                        240, causal=True)
    cu_q, cu_k = [0, 150, 300], [0, 240, 500]
    if bad == "last entry":
        cu_q = [0, 150, 299]
    elif bad == "decreasing":
        cu_k = [0, 260, 250, 500][:3]
    elif bad == "too long":
        cu_q = [0, 50, 300]                      # a sequence of 250 > max_seqlen_q = 200
    elif bad == "counts":
        cu_k = [0, 100, 240, 500]
    max_q = 301 if bad == "max above total" else 200     # the template's max was 200: a new max, same template
    n = len(enqueued)
    with pytest.raises(ValueError, match="cu_seqlens|max_seqlen"):
        cupy_dash.attention_backward_varlen(*args, np.array(cu_q, np.int32), cu_k, max_q, 240, causal=True)
    assert len(enqueued) == n



def test_a_repeated_forward_is_served_with_the_full_paths_block(no_gpu, monkeypatch):
    from cupy_dash.core import varlen_host_cu
    launched, remembered = [], []
    monkeypatch.setattr(launchers, "enqueue_forward", forward_recorder(launched))
    monkeypatch.setattr(fastpath, "_ready_stream", lambda plan: types.SimpleNamespace(ptr=0x77))
    monkeypatch.setattr(varlen_host_cu, "remember", lambda cu, info, ptr, stream: remembered.append(ptr))
    _, q, k, v, _, _ = _inputs()
    cu_q, cu_k = Tensor((4,), I32, 0x70000), Tensor((4,), I32, 0x70100)
    first = cupy_dash.attention_forward_varlen(q, k, v, cu_q, cu_k, 200, 240, causal=True)
    hits = fastpath_varlen.stats()["fwd_hits"]
    second = cupy_dash.attention_forward_varlen(q, k, v, cu_q, cu_k, 200, 240, causal=True)
    assert fastpath_varlen.stats()["fwd_hits"] == hits + 1 and len(launched) == 2
    assert remembered == [0x70000, 0x70100] * 2                 # the backward's host copies, on both paths
    (grid0, full), (grid1, fast) = launched
    assert grid0 == grid1 == (-(-200 // kernels.fwd_tile(128).block_m), 4, 3)
    for name in kernels.FWD_PARAMS_DTYPE.names:
        if name not in ("tma_o", "out", "lse"):
            same = bytes(np.atleast_1d(full[name]).view(np.uint8)) == bytes(np.atleast_1d(fast[name]).view(np.uint8))
            assert same, name
    out, lse = second
    assert (int(fast["out"]), int(fast["lse"])) == (out.ptr, lse.ptr) and out.shape == first[0].shape
    assert int.from_bytes(bytes(fast["tma_o"])[:8], "little") == out.ptr
    # another cu_seqlens layout or max length: the full path
    cupy_dash.attention_forward_varlen(q, k, v, cu_q, cu_k, 250, 240, causal=True)
    cupy_dash.attention_forward_varlen(q, k, v, Tensor((5,), I32, 0x70200), Tensor((5,), I32, 0x70300), 200, 240,
                                       causal=True)
    assert fastpath_varlen.stats()["fwd_hits"] == hits + 1


def test_a_captured_forward_whose_kernel_is_not_loaded_loads_it_outside_the_capture(no_gpu, outside_capture,
                                                                                     monkeypatch):
    """The varlen forward under CUDA graph capture with its kernel never loaded (no eager call of the variant): the
    kernel is loaded with the thread's capture mode relaxed (capture.outside), the mode restored, then the forward
    enqueued on the capturing stream; nothing remembered for a backward (no host copy during capture)."""
    from cupy_dash.core import interop, varlen_host_cu
    from cupy_dash.cuda import jit
    launched, loads = [], []
    monkeypatch.setattr(launchers, "enqueue_forward", lambda plan, stream, buffers: launched.append(stream.ptr))
    monkeypatch.setattr(varlen_host_cu, "remember", lambda *a: launched.append(a))
    monkeypatch.setattr(interop, "capturing", lambda q: True)
    monkeypatch.setattr(jit, "load", lambda spec: loads.append((spec.label, outside_capture.inside)) or
                        types.SimpleNamespace(ptr=0xF00))
    _, q, k, v, _, _ = _inputs()
    cu_q, cu_k = Tensor((4,), I32, 0x70000), Tensor((4,), I32, 0x70100)
    cupy_dash.attention_forward_varlen(q, k, v, cu_q, cu_k, 200, 240, causal=True)
    assert loads[0] == (kernels.fwd_spec("bfloat16", 128, True).label, True)   # then the plan's (memoized)
    assert outside_capture.modes == [outside_capture.RELAXED, 0] and not outside_capture.inside
    assert outside_capture.syncs == [outside_capture.SIDE] and launched == [0x77]


def test_a_new_packing_of_another_tile_takes_the_full_path(no_gpu, monkeypatch):
    """Head dim 128, full mask: a packing whose longest sequence reaches kernels.VARLEN80_MIN_SEQLEN takes 80-query
    tiles, whose Q / dO tensor-map boxes a 64-query plan does not have: the first packing of a tile takes the full
    path, and its plan then serves its repeats and, as that tile's template, the tile's new packings."""
    from fastpath_fakes import BF16, F32
    enqueued = no_gpu
    _tables_per_packing(monkeypatch)
    long_ = kernels.VARLEN80_MIN_SEQLEN
    total, H, D = long_ + 64, 2, 128
    base = iter(range(0x1000000, 0x10000000, 0x1000000))
    do, q, k, v, out = (Tensor((total, H, D), BF16, next(base)) for _ in range(5))
    lse = Tensor((H, total), F32, next(base))
    run = lambda cu: cupy_dash.attention_backward_varlen(  # noqa: E731
        do, q, k, v, out, lse, np.array(cu, np.int32), cu, long_, long_, schedule="fa3")
    run([0, 64, total])                                    # longest long_: 80-query tiles
    assert enqueued[-1]["c"].block_m == 80
    new, hits = fastpath_varlen.stats()["new_packing_hits"], fastpath_varlen.stats()["hits"]
    run([0, total - 100, total])                           # longest below the threshold: 64, a new template
    assert enqueued[-1]["c"].block_m == 64 and fastpath_varlen.stats()["new_packing_hits"] == new
    run([0, total - 100, total])
    assert fastpath_varlen.stats()["hits"] == hits + 1 and enqueued[-1]["c"].block_m == 64
    run([0, 32, 64, total])                                # a new packing of the 80-query tile: its template
    assert fastpath_varlen.stats()["new_packing_hits"] == new + 1 and enqueued[-1]["c"].block_m == 80


def test_a_repeated_soft_capped_call_is_served(no_gpu):
    """A soft-capped varlen backward and forward repeat from their plans (the cap in the signature by value);
    another cap takes the full path."""
    enqueued = no_gpu
    args = _inputs()
    cu_q, cu_k = np.array([0, 100, 100, 300], np.int32), [0, 200, 260, 500]
    kw = dict(causal=True, schedule="fa3", softcap=30.0)
    cupy_dash.attention_backward_varlen(*args, cu_q, cu_k, 200, 240, **kw)
    hits = fastpath_varlen.stats()["hits"]
    cupy_dash.attention_backward_varlen(*args, cu_q, cu_k, 200, 240, **kw)
    assert fastpath_varlen.stats()["hits"] == hits + 1 and len(enqueued) == 2
    assert ("DASH_SOFTCAP", 1) in enqueued[1]["c"].specs.main.defines
    cupy_dash.attention_backward_varlen(*args, cu_q, cu_k, 200, 240, **dict(kw, softcap=25.0))
    assert fastpath_varlen.stats()["hits"] == hits + 1 and len(enqueued) == 3


def test_a_repeated_fixed_length_forward_is_served_persistent_with_a_fresh_zeroed_counter(no_gpu, monkeypatch):
    """The functional API's fixed-length forward takes the persistent build (kernels.FWD_PERSISTENT): one CTA per
    SM, a tile counter per call that the launch plan zeroes before the kernel, on the full path and the fast path."""
    launched = []
    monkeypatch.setattr(kernels, "FWD_PERSISTENT", frozenset({True}))
    monkeypatch.setattr(launchers, "enqueue_forward", lambda plan, stream, buffers: launched.append(
        (plan, np.frombuffer(plan.inspect(tuple(buffers)), dtype=kernels.FWD_PARAMS_DTYPE)[0], buffers)))
    monkeypatch.setattr(fastpath, "_ready_stream", lambda plan: types.SimpleNamespace(ptr=0x77))
    fastpath.clear()
    q = Tensor((2, 1000, 4, 128), BF16, 0x10000000)
    k, v = (Tensor((2, 1000, 2, 128), BF16, p) for p in (0x20000000, 0x30000000))
    hits = fastpath.stats()["fwd_hits"]
    cupy_dash.attention_forward(q, k, v, causal=True)
    cupy_dash.attention_forward(q, k, v, causal=True)
    assert fastpath.stats()["fwd_hits"] == hits + 1 and len(launched) == 2
    (plan, full, b0), (plan1, fast, b1) = launched
    (_, grid, _, _), = plan.parts.kernels
    assert plan1 is plan and kernels.grid_xyz(grid) == (min(2 * 4 * 8, 132), 1, 1)
    assert plan.parts.zeros == ((5, 4),)                       # the counter (buffer 5) zeroed before the kernel
    assert (int(full["num_tiles"]), int(full["num_m_blocks"])) == (64, 8) == (int(fast["num_tiles"]),
                                                                             int(fast["num_m_blocks"]))
    counters = [int(full["tile_counter"]), int(fast["tile_counter"])]
    assert counters == [b0[5], b1[5]] and counters[0] != counters[1] and 0 not in counters


def test_the_forward_build_follows_the_mask(no_gpu, monkeypatch):
    """With today's choice (kernels.FWD_PERSISTENT: causal masks only) a causal forward runs the persistent build
    (one CTA per SM, a counter) and a full-mask one the grid build (one CTA per tile, nothing zeroed)."""
    launched = []
    monkeypatch.setattr(launchers, "enqueue_forward", lambda plan, stream, buffers: launched.append(plan))
    fastpath.clear()
    q = Tensor((2, 1000, 4, 128), BF16, 0x10000000)
    k, v = (Tensor((2, 1000, 2, 128), BF16, p) for p in (0x20000000, 0x30000000))
    for causal in (True, False):
        cupy_dash.attention_forward(q, k, v, causal=causal)
    (causal_plan, full_plan) = launched
    ((_, grid_c, _, _),), ((_, grid_f, _, _),) = causal_plan.parts.kernels, full_plan.parts.kernels
    assert causal_plan.parts.names[-1] == "tile_counter" and causal_plan.parts.zeros == ((5, 4),)
    assert kernels.grid_xyz(grid_c) == (min(2 * 4 * 8, 132), 1, 1)
    assert "tile_counter" not in full_plan.parts.names and full_plan.parts.zeros == ()
    assert kernels.grid_xyz(grid_f) == (8, 4, 2)


def test_a_new_packing_takes_a_template_of_its_own_window_only(no_gpu, monkeypatch):
    """The templates of one signature may carry other canonical windows (a window vacuous for one packing's longest
    sequence bounds another's): a new packing is rebased only from a template of its tile and its window, else the
    full path runs; its block is then the full path's (assert_launchers_block, in the recorder)."""
    enqueued = no_gpu
    _tables_per_packing(monkeypatch)
    total, H, D = 10000, 2, 128
    base = iter(range(0x1000000, 0x10000000, 0x1000000))
    do, q, k, v, out = (Tensor((total, H, D), BF16, next(base)) for _ in range(5))
    lse = Tensor((H, total), F32, next(base))

    def run(cu, longest):
        cu = np.array(cu, np.int32)
        cupy_dash.attention_backward_varlen(do, q, k, v, out, lse, cu, cu, longest, longest, window=(5000, -1),
                                            schedule="fa3")
        return enqueued[-1]
    assert run([0, 4200, 8400, 10000], 4200)["c"].window == (-1, -1)         # vacuous: 80-query tile
    assert run([0, 3000, 6000, 10000], 6000)["c"].window == (5000, -1)       # bounding: 64-query tile
    e = run([0, 2000, 4000, 6000, 8000, 10000], 2000)                        # vacuous, 64-query tile
    assert e["c"].window == (-1, -1) and int(e["params"]["window_left"]) == -1
