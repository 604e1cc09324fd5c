"""A new varlen packing's host side on the CPU (cupy_dash/cuda/varlen_device.py, cupy_dash/cuda/device_tables.py):
the GPU expansion's launch wiring, the switch to compact records for large tables, the one-pass packing into pinned
memory and its upload without staging, power-of-two device allocations, upload events only for other streams, the
one-pass cu_seqlens check, and new packings from threads. The tables themselves: tests/unit/test_varlen_compact.py.
"""
from __future__ import annotations

import numpy as np
import pytest

from cupy_dash import schedule
from cupy_dash.cuda import device_tables, varlen_device
from varlen_cases import random_problem


def test_gpu_expansion_launch_wiring(monkeypatch):
    """varlen_device._expand_on_device with every GPU call replaced: one copy of the packed records, the CTAs' row
    starts and the lengths to the head of one allocation, the per-visit rows and ranks behind them; the expand
    kernel's block names each uploaded array in its own field, the outputs in visits / rank, the heads, the rank
    rule; its grid is (schedule CTAs, EXPAND_CHUNKS)."""
    import types
    from cupy_dash.cuda import jit, kernels
    sq = np.array([1, 17, 300, 129], np.int64)
    t = varlen_device.plan("symmetric_shift", sq, sq, 64, 128, 8, 2, True, 7, (-1, 0), "expand")
    base, device_bytes = 0x100000, {}

    class Mem:
        def __init__(self, ptr):
            self.ptr = ptr

        def __add__(self, off):
            return Mem(self.ptr + off)

    def alloc(n):
        device_bytes["size"] = n
        return Mem(base)

    def memcpy(dst, src, n, kind, stream):
        device_bytes.update(dst=dst, n=n, blob=np.ctypeslib.as_array(
            (np.ctypeslib.ctypes.c_uint8 * n).from_address(src)).copy())

    monkeypatch.setattr(varlen_device.cupy.cuda, "alloc", alloc)
    monkeypatch.setattr(varlen_device.cupy.cuda.runtime, "memcpyAsync", memcpy)
    monkeypatch.setattr(device_tables.cupyx, "empty_pinned", lambda n, dtype: np.empty(n, dtype))
    from cupy_dash.cuda import executor
    launched, spec = {}, kernels.expand_spec()
    monkeypatch.setattr(executor, "launch", lambda func, gx, gy, gz, threads, smem, stream, params: launched.update(
        func=func, grid=(gx, gy, gz), block=(threads, smem), stream=stream,
        params=np.frombuffer(bytes(params), dtype=kernels.BWD_PARAMS_DTYPE)[0]))
    monkeypatch.setattr(jit, "load", lambda s: types.SimpleNamespace(ptr=0x1 if s == spec else 0x2))
    monkeypatch.setattr(varlen_device, "_expand_launches", {})
    from device_fakes import install
    install(monkeypatch)
    staging = []
    d, cu_q, cu_k = varlen_device._expand_on_device(t, 0, types.SimpleNamespace(ptr=0), staging)
    assert len(staging) == 1 and staging[0].nbytes >= t.blob.nbytes      # held by the caller until the copy ends
    f = launched["params"]
    assert launched["func"] == 0x1 and launched["grid"] == (t.num_ctas, kernels.EXPAND_CHUNKS, 1)
    assert launched["block"] == (spec.threads, spec.smem_bytes) and launched["stream"] == 0
    assert device_bytes["dst"] == base and device_bytes["n"] == t.blob.nbytes
    np.testing.assert_array_equal(device_bytes["blob"], t.blob)
    for name, host in t.arrays.items():
        off = int(f[name]) - base
        np.testing.assert_array_equal(device_bytes["blob"][off:off + host.nbytes].view(host.dtype).reshape(
            host.shape), host, err_msg=name)
    off = d.ptrs["cta_start"] - base
    np.testing.assert_array_equal(device_bytes["blob"][off:off + t.cta_start.nbytes].view(np.int64), t.cta_start)
    for ref, host in ((cu_q, t.cu_q), (cu_k, t.cu_k)):
        off = ref.data.ptr - base
        np.testing.assert_array_equal(device_bytes["blob"][off:off + host.nbytes].view(np.int32), host)
    rows = max(t.num_visits, 1)
    visits, rank = d.ptrs["visits"], d.ptrs["rank"]
    assert t.blob.nbytes <= visits - base and visits + 16 * rows <= rank and visits % 256 == 0
    assert rank + 4 * rows <= base + device_bytes["size"]
    assert (int(f["visits"]), int(f["rank"]), int(f["cta_start"])) == (visits, rank, d.ptrs["cta_start"])
    assert d.params() == d.ptrs and d.num_ctas == t.num_ctas and d.buffer.ptr == base
    assert (int(f["tie_sign"]), int(f["rank_rule"])) == t.compact
    assert (int(f["num_heads"]), int(f["num_heads_kv"])) == (8, 2) and int(f["scan_bounds"]) == 0
    named = set(t.arrays) | {"visits", "rank", "cta_start", "tie_sign", "rank_rule", "num_heads", "num_heads_kv"}
    for name in kernels.BWD_PARAMS_DTYPE.names:                       # the rest of the block is zero
        if name not in named:
            assert not bytes(np.atleast_1d(f[name]).view(np.uint8)).strip(b"\0"), name


def test_large_varlen_tables_switch_to_compact_records():
    """Without CUPY_DASH_COMPACT_TABLES the varlen backward asks for per-visit tables but compact records above
    compact_device.AUTO_VISITS visits (varlen.py passes it as compact_above), as fixed-length problems do."""
    lens = np.array([3000, 1, 700], np.int64)
    args = ("auto", lens, lens, 64, 128, 4, 2, True, 132, (-1, 0))
    small = varlen_device.plan(*args, False, None)
    assert small.compact is None and small.visits is not None and small.num_visits > 1000
    big = varlen_device.plan(*args, False, 1000)
    assert big.compact is not None and big.visits is None and not big.expand and big.num_visits == small.num_visits
    kept = varlen_device.plan(*args, False, small.num_visits)            # at the threshold: still per-visit
    assert kept.compact is None
    expand = varlen_device.plan(*args, "expand", 1000)                    # nor expanded on the GPU
    assert not expand.expand and expand.compact is not None
    assert varlen_device.plan(*args, "expand", None).expand


def test_a_new_packing_packs_into_pinned_memory_and_uploads_without_staging(monkeypatch):
    """plan(..., pinned=True) packs a compact form's blob into pinned memory (power-of-two blocks from CuPy's
    pinned pool, up to _PINNED_BLOB_MAX bytes) and _upload copies from it directly (no staging buffer, the blob
    held until the copy ends); larger blobs, and machines without a CUDA driver, stay pageable and staged."""
    import types
    import cupy
    pinned_sizes, copies = [], []

    def alloc_pinned(n):
        pinned_sizes.append(n)
        return bytearray(n)
    monkeypatch.setattr(cupy.cuda, "alloc_pinned_memory", alloc_pinned)
    monkeypatch.setattr(device_tables, "_pinned_ok", [True])
    monkeypatch.setattr(varlen_device, "_plans", __import__("collections").OrderedDict())   # no cached packing
    sq = np.array([1, 17, 300, 129], np.int64)
    t = varlen_device.plan("symmetric_shift", sq, sq, 64, 128, 8, 2, True, 7, (-1, 0), "expand", pinned=True)
    assert t.pinned and pinned_sizes == [1 << (t.blob.nbytes - 1).bit_length()]
    plain = varlen_device.plan("symmetric_shift", sq + 1, sq + 1, 64, 128, 8, 2, True, 7, (-1, 0), "expand")
    assert not plain.pinned and len(pinned_sizes) == 1
    monkeypatch.setattr(varlen_device.cupy.cuda, "alloc", lambda n: types.SimpleNamespace(ptr=0x100000))
    monkeypatch.setattr(varlen_device.cupy.cuda.runtime, "memcpyAsync",
                        lambda dst, src, n, kind, stream: copies.append((dst, src, n)))
    monkeypatch.setattr(device_tables.cupyx, "empty_pinned", lambda n, dtype: pytest.fail("staged a pinned blob"))
    staging = []
    device_tables._upload([(t.blob, 0)], t.blob.nbytes, 0, types.SimpleNamespace(ptr=0), staging, t.pinned)
    assert staging == [t.blob] and copies == [(0x100000, t.blob.ctypes.data, t.blob.nbytes)]
    monkeypatch.setattr(device_tables, "_PINNED_BLOB_MAX", 64)
    big = varlen_device.plan("symmetric_shift", sq + 2, sq + 2, 64, 128, 8, 2, True, 7, (-1, 0), "expand",
                             pinned=True)
    assert not big.pinned and len(pinned_sizes) == 1

    def no_driver(n):
        raise cupy.cuda.runtime.CUDARuntimeError(35)
    monkeypatch.setattr(device_tables, "_PINNED_BLOB_MAX", 1 << 20)
    monkeypatch.setattr(cupy.cuda, "alloc_pinned_memory", no_driver)
    none = varlen_device.plan("symmetric_shift", sq + 3, sq + 3, 64, 128, 8, 2, True, 7, (-1, 0), "expand",
                              pinned=True)
    assert not none.pinned and device_tables._pinned_ok == [False]


def test_device_allocations_of_new_packings_come_in_powers_of_two():
    """_device_bytes: powers of two up to _POW2_DEVICE_MAX (CuPy's pool then reuses an evicted table's block as
    it is), the exact size above; never below the request."""
    cap = device_tables._POW2_DEVICE_MAX
    for n in (0, 1, 255, 256, 257, 70_000, 640_000, cap - 1, cap):
        got = device_tables._device_bytes(n)
        assert got >= max(n, 1) and got & (got - 1) == 0 and got < 2 * max(n, 1)
    assert device_tables._device_bytes(cap + 1) == cap + 1


def test_uploads_record_events_only_for_other_streams(monkeypatch):
    """varlen_device.device: a new packing's upload is enqueued on the caller's stream, so it returns no event to
    wait for and records none; a hit on the same stream needs none either; the first hit on another stream gets
    an event recorded then on the uploading stream (every later one the same event). The new packings' pinned
    blobs and evicted entries are handed to errors.keep_alive once per _DEFER_MISSES new packings, per stream
    that holds some."""
    import types
    events, kept = [], []

    class Event:
        def __init__(self, **kw):
            events.append(self)

        def record(self, stream=None):
            self.stream = stream
    monkeypatch.setattr(varlen_device.cupy.cuda, "Event", Event)
    monkeypatch.setattr(device_tables, "keep_alive", lambda keep, stream: kept.append((list(keep), stream)))
    from device_fakes import install
    install(monkeypatch)
    d = types.SimpleNamespace()

    def expand(t, dev, stream, staging):
        staging.append(("blob", t.key))
        return d, "cq", "ck"
    monkeypatch.setattr(varlen_device, "_expand_on_device", expand)
    monkeypatch.setitem(device_tables._caches, "varlen", __import__("collections").OrderedDict())
    monkeypatch.setattr(device_tables, "_deferred", {})
    monkeypatch.setattr(device_tables, "_deferred_misses", [0])
    monkeypatch.setitem(device_tables._LIMITS, "varlen", 2)
    sq = np.array([5, 300, 129], np.int64)
    t = varlen_device.plan("fa3", sq, sq, 64, 128, 4, 2, True, 7, (-1, 0), "expand")
    first, second = types.SimpleNamespace(ptr=11), types.SimpleNamespace(ptr=22)
    assert varlen_device.device(t, 12, 0, first) == (d, "cq", "ck", None) and not events
    assert varlen_device.device(t, 12, 0, first) == (d, "cq", "ck", None) and not events
    assert varlen_device.device(t, 12, 0, second) == (d, "cq", "ck", events[0])
    assert len(events) == 1 and events[0].stream is first
    assert varlen_device.device(t, 12, 0, second) == (d, "cq", "ck", events[0]) and len(events) == 1
    others = [varlen_device.plan("fa3", sq + i, sq + i, 64, 128, 4, 2, True, 7, (-1, 0), "expand")
              for i in (1, 2, 3)]
    entry_t = device_tables._caches["varlen"][(t.key, 0)]
    varlen_device.device(others[0], 12, 0, first)
    varlen_device.device(others[1], 12, 0, second)                   # evicts t's entry, read on both streams
    assert kept == [([entry_t], first)]       # the other stream's share at once; the caller's deferred
    entry_0 = device_tables._caches["varlen"][(others[0].key, 0)]
    varlen_device.device(others[2], 12, 0, first)                    # the 4th new packing: every held list
    assert len(kept) == 3 and len(events) == 1
    by_stream = {s.ptr: keep for keep, s in kept[1:]}
    assert by_stream[11] == [("blob", t.key), ("blob", others[0].key), ("blob", others[2].key), entry_0]
    assert by_stream[22] == [("blob", others[1].key), entry_t]
    assert not device_tables._deferred and device_tables._deferred_misses == [0]


def test_cu_seqlens_check_in_one_pass_agrees_with_numpy():
    """varlen_pack.checked_cu_seqlens (varlen.cu_seqlens_values' check) against the numpy statements it
    replaced, on random valid and broken host cu_seqlens."""
    from cupy_dash.schedule import varlen_pack
    rng = np.random.default_rng(8)
    for _ in range(2000):
        lens = rng.integers(0, 50, int(rng.integers(1, 9)))
        cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        if rng.random() < 0.3:
            cu[int(rng.integers(0, len(cu)))] += int(rng.integers(-3, 4))
        total = int(cu[-1]) if rng.random() < 0.8 else int(cu[-1]) + 1
        max_len = int(rng.integers(0, 60))
        d = np.diff(cu)
        ok_seq = cu[0] == 0 and (d >= 0).all() and cu[-1] == total
        code, longest, out = varlen_pack.checked_cu_seqlens(cu, total, max_len)
        want = 1 if not ok_seq else (2 if d.max() > max_len else 0)
        assert code == want, (cu, total, max_len)
        if code:
            assert out is None and (code == 1 or longest == d.max())
        else:
            assert out.dtype == np.int32 and (out == cu).all() and longest == d.max()


def test_kv_tiles_is_the_sum_of_ceilings():
    from cupy_dash.schedule import varlen_pack
    rng = np.random.default_rng(3)
    for _ in range(200):
        lens = rng.integers(0, 5000, int(rng.integers(0, 70))).astype(np.int64)
        bn = int(rng.choice([64, 128, 176]))
        assert varlen_pack.kv_tiles(lens, bn) == int((-(-lens // bn)).sum())


def test_new_packing_from_threads_whose_scratch_is_taken():
    """new_packing's shared scratch: a call that finds it taken (another thread suspended in its ``alloc``
    callback, the one place the GIL changes hands inside) runs on scratch of its own; every thread's blob equals
    the blob of the same packing built alone."""
    import threading
    from cupy_dash.schedule import varlen_pack
    rng = np.random.default_rng(31)
    c, r = schedule.AUTO_COSTS
    cands = tuple(_schedule_codes()[p] for p in schedule.AUTO_CANDIDATES)

    def args(sq, sk, kw):
        return (-1, np.asarray(sq, np.int64), np.asarray(sk, np.int64),
                *schedule.check_window(kw["window"], kw["causal"]), kw["block_m"], kw["block_n"], kw["heads"],
                kw["group_size"], kw["causal"], kw["num_sms"], cands, c, r, schedule.AUTO_TOLERANCE,
                schedule.AUTO_FEW_GROUPED, True)
    problems = [random_problem(rng) for _ in range(12)]
    alone = [bytes(varlen_pack.new_packing(*args(*p))[1]) for p in problems]
    inside, others_done = threading.Event(), threading.Event()

    def slow_alloc(n):
        inside.set()
        others_done.wait(10)                         # holds the shared scratch while this thread builds others
        return np.empty(n, np.uint8)
    got = {}

    def first():
        got["first"] = bytes(varlen_pack.new_packing(*args(*problems[0]), slow_alloc)[1])

    t = threading.Thread(target=first)
    t.start()
    assert inside.wait(10)
    got["others"] = [bytes(varlen_pack.new_packing(*args(*p))[1]) for p in problems[1:]]
    others_done.set()
    t.join()
    assert got["first"] == alone[0] and got["others"] == alone[1:]


def _schedule_codes():
    from cupy_dash.schedule import _schedule
    return _schedule.POLICY_CODES
