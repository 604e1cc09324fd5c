"""CPU tests of cupy_dash.cuda.launchers, the layer the eager API and the JAX custom calls share: the parameter blocks
hold what each argument says (the tensor-map encoder is replaced, since it needs the CUDA driver), the backward
workspace layout, the grids."""
from __future__ import annotations

import math
import types

import numpy as np
import pytest

from cupy_dash.cuda import kernels, launchers, tensormap


def fake_map(ptr, dtype, shape, strides, box_rows, name="tensor", box_panels=None):
    text = repr((hex(ptr), dtype, tuple(shape), tuple(strides), box_rows, box_panels, name)).encode()
    assert len(text) <= 128
    return text.ljust(128, b"\0")


@pytest.fixture(autouse=True)
def no_driver(monkeypatch):
    monkeypatch.setattr(tensormap, "bhsd_map", fake_map)
    monkeypatch.setattr(launchers, "l2_bytes", lambda dev: 60 << 20)    # the H200's L2 and SMs
    monkeypatch.setattr(kernels, "sm_count", lambda dev: 132)


def problem(B=2, Sq=200, Sk=320, H=4, Hkv=2, D=128, scale=0.1, Dv=None):
    return types.SimpleNamespace(B=B, Sq=Sq, Sk=Sk, H=H, Hkv=Hkv, D=D, Dv=D if Dv is None else Dv, dtype="float16",
                                 scale=scale, softcap=0.0, device_id=0)


def unmap(raw) -> tuple:
    import ast
    return ast.literal_eval(bytes(raw).rstrip(b"\0").decode())


def test_forward_params():
    p = problem()
    q_st, kv_st = (1 << 20, 1024, 128), (1 << 19, 512, 128)
    params = launchers.fwd_params(128, 96, p, (16, -1), ((0x1000, q_st), (0x2000, kv_st), (0x3000, kv_st)), 0x4000,
                               0x5000)
    assert params.dtype == kernels.FWD_PARAMS_DTYPE and params.shape == (1,)
    f = params[0]
    assert unmap(f["tma_q"]) == ("0x1000", "float16", (2, 200, 4, 128), q_st, 128, None, "q")
    assert unmap(f["tma_k"]) == ("0x2000", "float16", (2, 320, 2, 128), kv_st, 96, None, "k")
    assert unmap(f["tma_v"])[:1] == ("0x3000",)
    assert unmap(f["tma_o"]) == ("0x4000", "float16", (2, 200, 4, 128), (200 * 4 * 128, 4 * 128, 128), 64, 1,
                                 "out")
    assert int(f["lse"]) == 0x5000
    assert [int(f[n]) for n in ("batch", "seqlen_q", "seqlen_k", "num_heads", "num_heads_kv")] == [2, 200, 320, 4, 2]
    assert (int(f["window_left"]), int(f["window_right"])) == (16, -1)
    assert math.isclose(float(f["softmax_scale"]), 0.1, rel_tol=1e-7)
    assert math.isclose(float(f["softmax_scale_log2"]), 0.1 / math.log(2), rel_tol=1e-6)
    assert launchers.fwd_grid(p, 128) == (2, 4, 2)
    # NOTES: one build serves both: the kernels take a launch as varlen exactly when cu_seqlens_q is set
    # (is_varlen, kernels_src/varlen_span.cuh), so a fixed-length launch must leave both pointers null
    assert int(f["cu_seqlens_q"]) == int(f["cu_seqlens_k"]) == 0
    packed = launchers.fwd_params(128, 128, problem(B=1, Sq=500, Sk=500), (-1, -1),
                                  ((0x1000, (0, 512, 128)), (0x2000, (0, 256, 128)), (0x3000, (0, 256, 128))), 0x4000,
                                  0x5000, varlen=(3, 0x6000, 0x7000))[0]
    assert (int(packed["cu_seqlens_q"]), int(packed["cu_seqlens_k"]), int(packed["batch"])) == (0x6000, 0x7000, 3)
    assert int(f["head_section"]) == launchers.fwd_head_section(p, 128) == 8 and int(packed["head_section"]) == 0


@pytest.mark.parametrize("B, Sq, Sk, H, Hkv, D, expected", [
    (16, 1024, 1024, 16, 16, 128, 16),    # 8 tiles per pair: 16 pairs make a wave of 132 SMs
    (8, 2048, 2048, 16, 16, 128, 8),
    (4, 4096, 4096, 16, 16, 128, 4),
    (2, 8192, 8192, 16, 16, 128, 2),
    (1, 16384, 16384, 16, 16, 128, 1),    # 128 tiles: a pair is a wave
    (1, 1024, 1024, 3, 3, 128, 3),        # never more than B * H
    (16, 1024, 8192, 16, 16, 128, 6),     # 6 pairs' K and V (4 MiB each) fill 24 of the 60 MiB of L2
    (16, 1024, 8192, 16, 4, 128, 16),     # four query heads read each KV head
    (4, 200, 200, 16, 16, 128, 64),
], ids=["1k", "2k", "4k", "8k", "16k", "all-pairs", "l2-bound", "gqa4", "short"])
def test_forward_head_section_is_a_wave_of_tiles_within_l2(B, Sq, Sk, H, Hkv, D, expected):
    p = problem(B=B, Sq=Sq, Sk=Sk, H=H, Hkv=Hkv, D=D)
    assert launchers.fwd_head_section(p, 128) == expected


def test_varlen_forward_head_section_follows_its_grid():
    """A varlen launch: tiles per pair from the grid (the longest sequence), K and V rows the average sequence's."""
    p = problem(B=1, Sq=16384, Sk=16384, H=16, Hkv=16)              # 8 packed sequences of 2048
    assert launchers.fwd_head_section(p, 128, (16, 16, 8)) == 8     # as the fixed-length 8 x 2048
    assert launchers.fwd_head_section(p, 128, (64, 16, 8)) == 2     # one sequence of 8192 sets the grid
    p = problem(B=1, Sq=65536, Sk=65536, H=16, Hkv=16)              # 2 sequences of 32k: 16 MiB of K, V each
    assert launchers.fwd_head_section(p, 128, (2, 16, 2)) == 1
    packed = launchers.fwd_params(128, 128, problem(B=1, Sq=16384, Sk=16384, H=16, Hkv=16), (-1, 0),
                                  ((0x1000, (0, 2048, 128)),) * 3, 0x4000, 0x5000, varlen=(8, 0x6000, 0x7000),
                                  grid=(16, 16, 8))[0]
    assert int(packed["head_section"]) == 8


def test_backward_workspace_head_dim_96():
    """Head dim 96: dq_accum rows are the kernels' padded 128 columns; dq, dk, dv and the maps keep 96."""
    p = problem(Sq=200, D=96)
    specs = kernels.bwd_specs("bfloat16", 96, True)
    tile = kernels.bwd_tile(96, True)
    c = launchers.BwdLaunch(specs, tile.block_m, tile.block_n, p, True, 12345, True, (-1, 0))
    rows = 2 * 4 * c.sq_rounded
    assert c.offsets[3] - c.offsets[2] >= rows * 128 * 4
    assert launchers.kv_bytes(p) == (2 * 320 * 2 * 96 * 2,) * 2
    q_st, kv_st = (200 * 4 * 96, 4 * 96, 96), (320 * 2 * 96, 2 * 96, 96)
    ptr = types.SimpleNamespace
    c.tables = ptr(visits=ptr(data=ptr(ptr=0xA000)), rank=ptr(data=ptr(ptr=0xB000)),
                   cta_start=ptr(data=ptr(ptr=0xC000)), num_ctas=33, policy="shift")
    operands = ((0x1000, q_st), (0x2000, kv_st), (0x3000, kv_st), (0x4000, q_st), (0x5000, q_st))
    f = launchers.bwd_params(c, operands, 0x6000, 0x100000, (0x7000, 0x8000, 0x9000), (0xD000, 0xF000), 0)[0]
    assert unmap(f["tma_q"])[2] == (2, 200, 4, 96) and unmap(f["tma_k"])[2] == (2, 320, 2, 96)
    assert tuple(f["dq_stride"].tolist()) == q_st


def test_value_head_dim_128_with_192():
    """v, out, dout and dv are 128 columns wide (their maps, strides and bytes), q, k, dq, dk 192; dq_accum rows
    192 columns."""
    p = problem(Sq=200, D=192, Dv=128)
    q_st, k_st, v_st, o_st = (200 * 4 * 192, 4 * 192, 192), (320 * 2 * 192, 2 * 192, 192), \
        (320 * 2 * 128, 2 * 128, 128), (200 * 4 * 128, 4 * 128, 128)
    f = launchers.fwd_params(128, 64, p, (-1, -1), ((0x1000, q_st), (0x2000, k_st), (0x3000, v_st)), 0x4000,
                             0x5000)[0]
    assert unmap(f["tma_k"])[2:4] == ((2, 320, 2, 192), k_st)
    assert unmap(f["tma_v"])[2:4] == ((2, 320, 2, 128), v_st)
    assert unmap(f["tma_o"])[2:4] == ((2, 200, 4, 128), o_st)
    specs = kernels.bwd_specs("float16", 192, True, head_dim_v=128)
    tile = kernels.bwd_tile(192, True)
    c = launchers.BwdLaunch(specs, tile.block_m, tile.block_n, p, True, 12345, True, (-1, 0))
    assert c.offsets[3] - c.offsets[2] >= 2 * 4 * c.sq_rounded * 192 * 4
    assert launchers.kv_bytes(p) == (2 * 320 * 2 * 192 * 2, 2 * 320 * 2 * 128 * 2)
    ptr = types.SimpleNamespace
    c.tables = ptr(visits=ptr(data=ptr(ptr=0xA000)), rank=ptr(data=ptr(ptr=0xB000)),
                   cta_start=ptr(data=ptr(ptr=0xC000)), num_ctas=33, policy="shift")
    operands = ((0x1000, q_st), (0x2000, k_st), (0x3000, v_st), (0x4000, o_st), (0x5000, o_st))
    f = launchers.bwd_params(c, operands, 0x6000, 0x100000, (0x7000, 0x8000, 0x9000), (0xD000, 0xF000), 0)[0]
    assert [unmap(f[n])[2] for n in ("tma_q", "tma_k", "tma_v", "tma_do")] == [
        (2, 200, 4, 192), (2, 320, 2, 192), (2, 320, 2, 128), (2, 200, 4, 128)]
    # the contiguous outputs' maps, boxes of 64 rows (one MMA warpgroup's keys: kernels_src/bwd/epilogue.cuh)
    assert unmap(f["tma_dk"]) == ("0x8000", "float16", (2, 320, 2, 192), (320 * 2 * 192, 2 * 192, 192), 64, None,
                                  "dk")
    assert unmap(f["tma_dv"]) == ("0x9000", "float16", (2, 320, 2, 128), (320 * 2 * 128, 2 * 128, 128), 64, None,
                                  "dv")
    assert [tuple(f[n].tolist()) for n in ("dq_stride", "dk_stride", "dv_stride")] == [q_st, k_st, v_st]


@pytest.mark.parametrize("deterministic", [True, False])
def test_backward_workspace_and_params(deterministic, monkeypatch):
    p = problem(Sq=200)
    specs = kernels.bwd_specs("float16", 128, True)
    tile = kernels.bwd_tile(128, True)
    c = launchers.BwdLaunch(specs, tile.block_m, tile.block_n, p, deterministic, 12345, True, (150, 0))
    m_blocks = -(-200 // tile.block_m)
    rows = 2 * 4 * m_blocks * tile.block_m
    assert (c.num_m_blocks, c.sq_rounded) == (m_blocks, m_blocks * tile.block_m)
    sizes = (rows * 4, rows * 4, rows * 128 * 4, 2 * 4 * m_blocks * 4)
    for start, end, size in zip(c.offsets, [*c.offsets[1:], c.work_bytes], sizes):
        assert start % 256 == 0 and size <= end - start < size + 256
    ptr = types.SimpleNamespace
    c.tables = ptr(visits=ptr(data=ptr(ptr=0xA000)), rank=ptr(data=ptr(ptr=0xB000)),
                   cta_start=ptr(data=ptr(ptr=0xC000)), num_ctas=33, policy="shift")
    q_st, kv_st = (200 * 4 * 128, 4 * 128, 128), (320 * 2 * 128, 2 * 128, 128)
    operands = ((0x1000, q_st), (0x2000, kv_st), (0x3000, kv_st), (0x4000, q_st), (0x5000, q_st))
    params = launchers.bwd_params(c, operands, 0x6000, 0x100000, (0x7000, 0x8000, 0x9000), (0xD000, 0xF000),
                                  0xE000)
    f = params[0]
    assert params.dtype == kernels.BWD_PARAMS_DTYPE
    assert {n: int(f[n]) for n in ("q", "k", "v", "out", "dout", "lse", "dq", "dk", "dv")} == dict(
        q=0x1000, k=0x2000, v=0x3000, out=0x4000, dout=0x5000, lse=0x6000, dq=0x7000, dk=0x8000, dv=0x9000)
    assert [int(f[n]) for n in ("lse_log2", "dpsum", "dq_accum")] == [0x100000 + o for o in c.offsets[:3]]
    assert int(f["dq_semaphore"]) == (0x100000 + c.offsets[3] if deterministic else 0)
    assert int(f["cu_seqlens_q"]) == int(f["cu_seqlens_k"]) == 0   # a fixed-length launch (is_varlen false)
    assert [int(f[n]) for n in ("visits", "rank", "cta_start", "error", "error_host", "timeline")] == [
        0xA000, 0xB000, 0xC000, 0xD000, 0xF000, 0xE000]
    assert unmap(f["tma_do"])[:1] == ("0x5000",) and unmap(f["tma_q"])[4] == tile.block_m
    assert unmap(f["tma_k"])[4] == tile.block_n
    assert tuple(f["dk_stride"].tolist()) == kv_st and tuple(f["dq_stride"].tolist()) == q_st
    assert (int(f["num_m_blocks"]), int(f["seqlen_q_rounded"]), int(f["spin_timeout_ns"])) == (
        m_blocks, m_blocks * tile.block_m, 12345)
    assert c.fold and int(f["fold"]) == 1          # 2 * 4 * 4 * 3 tile pairs: one launch
    assert launchers.bwd_kernels(c) == ((specs.main, (33,)),)
    c.fold = False
    assert launchers.bwd_kernels(c) == ((specs.preprocess, (m_blocks, 4, 2)), (specs.main, (33,)),
                                        (specs.postprocess, (m_blocks, 4, 2)))
    assert int(launchers.bwd_params(c, operands, 0x6000, 0x100000, (0x7000, 0x8000, 0x9000), (0xD000, 0xF000),
                                    0xE000)[0]["fold"]) == 0
    c.fold = True
    assert (int(f["window_left"]), int(f["window_right"])) == (150, 0)
    assert not c.zero_kv                 # every key is seen by some query
    assert np.isclose(float(f["softmax_scale_log2"]), 0.1 / math.log(2))
    # per-visit rows expanded on the GPU (varlen_device.NamedTables) name their fields: the same block
    from cupy_dash.cuda import varlen_device
    expanded = varlen_device.NamedTables()
    expanded.ptrs, expanded.num_ctas, expanded.policy = dict(visits=0xA000, rank=0xB000, cta_start=0xC000), 33, "shift"
    c.tables = expanded
    again = launchers.bwd_params(c, operands, 0x6000, 0x100000, (0x7000, 0x8000, 0x9000), (0xD000, 0xF000), 0xE000)
    assert bytes(again.view(np.uint8)) == bytes(params.view(np.uint8))


@pytest.mark.parametrize("window,zero", [((-1, 0), False), ((0, 0), True), ((200, 0), False), ((127, 0), True)])
def test_backward_zeroes_dk_dv_when_a_whole_kv_tile_is_unseen(window, zero):
    p = problem(Sq=64, Sk=320)                  # keys 0 .. Sk - Sq - left - 1 are seen by no query
    tile = kernels.bwd_tile(128, True)
    c = launchers.BwdLaunch(kernels.bwd_specs("float16", 128, True), tile.block_m, tile.block_n, p, True, 1,
                            True, window)
    assert c.zero_kv == zero, (window, 320 - 64 - window[0], tile.block_n)
    assert launchers.kv_bytes(p) == (2 * 320 * 2 * 128 * 2,) * 2


def _backward_launch(window=(-1, 0)):
    p = problem(Sq=64, Sk=320)
    tile = kernels.bwd_tile(128, True)
    c = launchers.BwdLaunch(kernels.bwd_specs("float16", 128, True), tile.block_m, tile.block_n, p, True, 1,
                            True, window)
    c.tables = types.SimpleNamespace(num_ctas=7, policy="fa3")
    return c


def test_enqueue_backward_runs_the_plan_then_tracks_the_slot(monkeypatch):
    """The launch plan run on the stream with the call's addresses, then the slot tracked as the call (no memset,
    copy or event for the error record: the kernels zero and publish it). The plan's kernels, grids and zeroing:
    tests/unit/test_launch_plans.py."""
    c = _backward_launch()
    calls = []
    c.plan = types.SimpleNamespace(run=lambda stream, buffers: calls.append(("run", stream, buffers)))
    monkeypatch.setattr(launchers, "_track", lambda slot, call: calls.append(("track", slot, call)))
    slot = types.SimpleNamespace(dptr=0x9000, hdev=0x9800)
    launchers.enqueue_backward(c, types.SimpleNamespace(ptr=0x55), (1, 2, 3), slot=slot, call="x")
    assert calls == [("run", 0x55, (1, 2, 3)), ("track", slot, "x")]


def test_enqueue_backward_retires_the_slot_when_a_launch_fails(monkeypatch):
    """A failed launch may have enqueued kernels before the one that failed, which still write the slot's record:
    the slot is neither tracked nor handed out again."""
    from cupy_dash.cuda import errors
    c = _backward_launch()
    released = []
    monkeypatch.setattr(errors, "release_slot", released.append)
    monkeypatch.setattr(launchers, "_track", lambda *a: pytest.fail("a failed call must not be tracked"))

    def fail(stream, buffers):
        raise RuntimeError("cupy_dash launch: cuLaunchKernel failed (CUresult 700) for kernel 1 of 3")
    c.plan = types.SimpleNamespace(run=fail)
    slot = types.SimpleNamespace(dptr=0x9000, hdev=0x9800)
    with pytest.raises(RuntimeError, match="kernel 1 of 3"):
        launchers.enqueue_backward(c, types.SimpleNamespace(ptr=0), (1, 2, 3), slot=slot)
    assert released == []


def test_int_fields_patched_by_offset_write_8_byte_integer_fields_only():
    """params.int_field_offsets + executor.patched_block (how the varlen expansion writes a block's integers)."""
    from cupy_dash.cuda import executor, params
    dt = kernels.BWD_PARAMS_DTYPE
    offsets = params.int_field_offsets(dt, ("batch", "tie_sign", "visits"))
    buf = executor.patched_block(bytes(dt.itemsize), offsets, (7, -1, 0xDEAD0000))
    f = np.frombuffer(bytes(buf), dtype=dt)[0]
    assert (int(f["batch"]), int(f["tie_sign"]), int(f["visits"])) == (7, -1, 0xDEAD0000)
    assert sum(bytes(buf)) == sum((7).to_bytes(8, "little")) + 8 * 255 + sum((0xDEAD0000).to_bytes(8, "little"))
    with pytest.raises(TypeError, match="softmax_scale"):
        params.int_field_offsets(dt, ("softmax_scale",))


@pytest.mark.parametrize("env,small,large", [("", True, False), ("0", False, False), ("1", True, True)],
                         ids=["auto", "never", "always"])
def test_fold_decision(env, small, large, monkeypatch):
    """A backward is folded into one launch when its batch has fixed lengths, its dk, dv need no zeroing and it
    has at most FOLD_MAX_TILES (Q tile, KV tile) pairs; CUPY_DASH_FOLD = 0 / 1 overrides the size rule only."""
    monkeypatch.setenv(launchers.FOLD_ENV, env)
    tile = kernels.bwd_tile(128, True)
    specs = kernels.bwd_specs("float16", 128, True)

    def fold(window=(-1, 0), **shape):
        p = problem(**shape)
        return launchers.BwdLaunch(specs, tile.block_m, tile.block_n, p, True, 1, True, window).fold

    pairs = lambda B, H, Sq, Sk: B * H * -(-Sq // tile.block_m) * -(-Sk // tile.block_n)   # noqa: E731
    edge = dict(B=1, H=4, Sq=64 * 8, Sk=128 * 8, Hkv=4)                   # exactly FOLD_MAX_TILES pairs
    assert pairs(**{n: edge[n] for n in ("B", "H", "Sq", "Sk")}) == launchers.FOLD_MAX_TILES
    assert fold(**edge) == small and fold(**dict(edge, Sq=64 * 8 + 1)) == large
    assert fold(B=1, H=1, Sq=128, Sk=128, Hkv=1) == small
    assert not fold(window=(0, 0), Sq=64, Sk=320)              # unseen keys: dk, dv zeroed first, never folded
    varlen = launchers.BwdLaunch(specs, tile.block_m, tile.block_n, problem(B=1, Sq=300, Sk=300), True, 1, True,
                                 (-1, 0), varlen=(3, 200))
    assert not varlen.fold


def test_failed_error_slots_are_retired_not_reused(monkeypatch):
    """A folded backward relies on a zero record: a slot whose call failed, or never reported, is not freed."""
    from cupy_dash.cuda import errors
    released = []
    monkeypatch.setattr(errors, "release_slot", released.append)

    def pending(host):
        slot = types.SimpleNamespace(host=np.array(host, dtype=np.int32))
        rec = errors._Pending()
        rec.event, rec.slot, rec.keep, rec.info = None, slot, None, ("fa3", 1, 1, 128, 128, 64, True)
        return rec, slot

    ok, ok_slot = pending([1, 0, 0, 0, 0, 0, 0, 0])
    assert errors._consume(ok) is None and released == [ok_slot]
    for host, words in (([1, 3, 5, 4, 17, 0, 0, 0], "grid barrier of the folded"), ([0] * 8, "without its")):
        rec, slot = pending(host)
        assert words in errors._consume(rec)
        assert released == [ok_slot]


def test_shared_graph_record_is_reported(monkeypatch):
    from cupy_dash.cuda import errors
    records = errors._GraphRecords.__new__(errors._GraphRecords)
    records.block = types.SimpleNamespace(data=types.SimpleNamespace(ptr=0x10000))
    records.infos, records.wheres = [], []
    monkeypatch.setattr(errors, "GRAPH_RECORDS", 2)
    a, b, c = (records.take(i) for i in range(3))
    assert (a, b, c) == (0x10000, 0x10000 + errors.RECORD_BYTES, 0x10000 + errors.RECORD_BYTES)
    assert not records.shared(a) and records.shared(b) and records.shared(c)


def test_first_backward_of_a_variant_loads_all_three_kernels(monkeypatch):
    """A small eager backward runs folded (the main kernel alone), but the same call captured into a CUDA graph
    runs unfolded and cannot load kernels under capture: torch.compile's reduce-overhead mode warms up eagerly
    once, then captures. So the first use of a variant loads preprocess and postprocess as well."""
    import cupy

    from cupy_dash.cuda import jit
    loaded = []
    monkeypatch.setattr(kernels, "_bwd_cache", {})
    monkeypatch.setattr(kernels, "max_resident_ctas", lambda spec: loaded.append(spec.label) or 132)
    monkeypatch.setattr(jit, "load", lambda spec: loaded.append(spec.label))
    monkeypatch.setattr(cupy.cuda, "Device", _NoDevice)
    specs, _, _, max_ctas = kernels.bwd_entry(0, "bfloat16", 64, True)
    assert max_ctas == 132
    assert sorted(loaded) == sorted(s.label for s in (specs.preprocess, specs.main, specs.postprocess))
    kernels.bwd_entry(0, "bfloat16", 64, True)                              # cached: nothing loaded again
    assert len(loaded) == 3


class _NoDevice:
    """cupy.cuda.Device's context manager, without a GPU."""

    def __init__(self, device_id):
        self.id = device_id

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_logit_factors_with_and_without_a_cap():
    """kernels_src/params.cuh: with a cap c the kernels work in t = tanh(s * scale / c); the forward's lse factor
    is c, the softmax's c log2(e); the backward keeps the caller's scale for dK, dQ."""
    log2e = 1.4426950408889634
    p = problem(scale=0.125)
    for backward in (False, True):
        assert launchers.logit_factors(p, backward) == dict(softmax_scale=0.125, softmax_scale_log2=0.125 * log2e,
                                                            softcap_prescale=0.0)
    p.softcap = 50.0
    assert launchers.logit_factors(p, False) == dict(softmax_scale=50.0, softmax_scale_log2=50.0 * log2e,
                                                     softcap_prescale=0.125 / 50.0)
    assert launchers.logit_factors(p, True) == dict(softmax_scale=0.125, softmax_scale_log2=50.0 * log2e,
                                                    softcap_prescale=0.125 / 50.0)


def test_a_backward_launch_needs_the_build_of_its_cap():
    """The backward main kernel has a soft-capping build (the cap's derivative needs registers); the forward has
    one build for both, its cap a launch parameter (softcap_prescale)."""
    p = problem()
    plain, capped = (kernels.bwd_specs("float16", 64, True, softcap=c).main for c in (False, True))
    assert not any(name == "DASH_SOFTCAP" for name, _ in kernels.fwd_spec("float16", 64, True).defines)
    launchers.check_softcap_build(plain, p)
    with pytest.raises(RuntimeError, match="softcap=0.0 needs the plain build"):
        launchers.check_softcap_build(capped, p)
    p.softcap = 30.0
    launchers.check_softcap_build(capped, p)
    with pytest.raises(RuntimeError, match="soft-capping build"):
        launchers.check_softcap_build(plain, p)
    both = kernels.bwd_specs("float16", 64, True, compact=True, softcap=True).main      # long capped calls
    assert {"DASH_SOFTCAP", "DASH_COMPACT"} <= {name for name, _ in both.defines}
    launchers.check_softcap_build(both, p)


def test_varlen_workspace_covers_the_tile_the_packing_may_take(monkeypatch):
    """A traced varlen backward reserves its workspace before the lengths are known, and the packing's table may
    move it from the 80-query tile (CUPY_DASH_BWD_FULL_BLOCK_M=80) to 64 queries (compact tables have no 80-query
    build), whose per-sequence padding needs more rows: the reservation covers both."""
    monkeypatch.setenv("CUPY_DASH_BWD_FULL_BLOCK_M", "80")
    p = problem(B=1, Sq=160, Sk=160, H=1, Hkv=1)
    specs = kernels.bwd_specs("float16", 128, False)
    assert kernels.bwd_tile(128, False).block_m == 80 and kernels.bwd_tile(128, False, True).block_m == 64
    by_tile = {bm: launchers.BwdLaunch(specs, bm, 128, p, True, 1, False, (-1, -1), varlen=(1, 160)).work_bytes
               for bm in (64, 80)}
    assert by_tile[64] > by_tile[80]          # 256 padded rows against 240
    assert launchers.varlen_work_bytes(specs, p, True, 1, False, (-1, -1), (1, 160)) == by_tile[64]
    monkeypatch.setenv("CUPY_DASH_BWD_FULL_BLOCK_M", "64")
    assert launchers.varlen_work_bytes(specs, p, True, 1, False, (-1, -1), (1, 160)) == by_tile[64]
