"""Per-device state without a GPU: everything cupy_dash makes on one device (kernels, schedule tables, error
records, events, varlen tables) is made on the device it is keyed by, whatever the current device is, and is
found again only for that device. CuPy's device switching is imitated (tests/device_fakes.py); the GPU side of
the same claims is tests/gpu/test_gpu_multi_device.py."""
from __future__ import annotations

import collections
import types

import numpy as np
import pytest

from cupy_dash.cuda import device_tables, errors, jit, kernels, varlen_device
from device_fakes import fake_uploads, install


def _stream(device_id=None, ptr=0x10):
    s = types.SimpleNamespace(ptr=ptr, synchronize=lambda: None)
    if device_id is not None:
        s.device_id = device_id
    return s


def test_schedule_tables_are_uploaded_to_the_device_they_are_cached_for(monkeypatch):
    """device_tables.per_visit(..., device_id=1) called while device 0 is current uploads to device 1, and the
    tables of device 0 and device 1 are two cache entries."""
    devices = install(monkeypatch, current=0)
    uploads = fake_uploads(monkeypatch, devices)
    args = ("shift", 1000, 1000, 64, 128, 3, True, 7)
    on1 = device_tables.per_visit(*args, 1, _stream(1))
    assert [d for d, _ in uploads] == [1] * 3 and on1.device_id == 1 and devices.current == 0
    on0 = device_tables.per_visit(*args, 0, _stream(0))
    assert [d for d, _ in uploads[3:]] == [0] * 3 and on0 is not on1 and on0.device_id == 0
    assert device_tables.per_visit(*args, 1, _stream(1)) is on1 and len(uploads) == 6
    assert {key[1] for key in device_tables._caches["visits"]} == {0, 1}


def test_compact_tables_are_uploaded_to_the_device_they_are_cached_for(monkeypatch):
    devices = install(monkeypatch, current=1)
    made = fake_uploads(monkeypatch, devices)
    args = ("descending", 1000, 1000, 64, 128, 4, True, 7)
    on0 = device_tables.compact(*args, 0, _stream(0), window=(-1, 0))
    uploads = [d for d, _ in made]
    assert uploads and set(uploads) == {0} and on0.device_id == 0 and devices.current == 1
    on1 = device_tables.compact(*args, 1, _stream(1), window=(-1, 0))
    uploads = [d for d, _ in made]
    assert on1 is not on0 and on1.device_id == 1 and uploads.count(1) == uploads.count(0)
    assert device_tables.compact(*args, 0, _stream(0), window=(-1, 0)) is on0


@pytest.mark.parametrize("stream_device, current, want", [(1, 0, 1), (0, 1, 0), (None, 1, 1), (-1, 0, 0)],
                         ids=["other-device", "device-0", "no-device-id", "unknown-device"])
def test_keep_alive_records_its_event_on_the_streams_device(monkeypatch, stream_device, current, want):
    """An event must be made on the device of the stream it is recorded on (CUDA refuses another one): a varlen
    call on one GPU may release tables that another GPU's streams read."""
    import cupy
    devices = install(monkeypatch, current=current)
    made = []

    class Event:
        def __init__(self, **kw):
            self.device = devices.current

        def record(self, stream):
            made.append((self.device, devices.current, stream))
    monkeypatch.setattr(cupy.cuda, "Event", Event)
    monkeypatch.setattr(errors, "_pending", collections.deque())
    stream = _stream(stream_device)
    errors.keep_alive(["tables"], stream)
    assert made == [(want, want, stream)] and devices.current == current
    assert errors._pending[0].keep == ["tables"]


def test_varlen_tables_are_made_on_their_device_and_cached_per_device(monkeypatch):
    """varlen_device.device(t, heads, dev, stream) does its allocations, copies and expansion with ``dev``
    current, and keeps one entry per (packing, device)."""
    devices = install(monkeypatch, current=0)
    made = []

    def expand(t, dev, stream, staging):
        made.append((dev, devices.current))
        return types.SimpleNamespace(), f"cq{dev}", f"ck{dev}"
    monkeypatch.setattr(varlen_device, "_expand_on_device", expand)
    monkeypatch.setattr(device_tables, "_defer_release", lambda *args: None)
    monkeypatch.setitem(device_tables._caches, "varlen", collections.OrderedDict())
    t = varlen_device.plan("fa3", np.array([100, 300]), np.array([100, 300]), 64, 128, 4, 2, True, 16, (-1, 0),
                           compact="expand")
    d1 = varlen_device.device(t, 8, 1, _stream(1, 0x11))
    d0 = varlen_device.device(t, 8, 0, _stream(0, 0x10))
    assert made == [(1, 1), (0, 0)] and devices.current == 0
    assert d1[1:3] == ("cq1", "ck1") and d0[1:3] == ("cq0", "ck0") and d1[0] is not d0[0]
    assert varlen_device.device(t, 8, 1, _stream(1, 0x11))[0] is d1[0] and len(made) == 2


def test_varlen_release_waits_for_the_device_of_a_stream_that_is_gone(monkeypatch):
    """_release_after: where an event cannot be recorded on a stream that read an evicted entry, the stream's
    device is synchronized (not the current one), and the other streams still hold the entry."""
    import cupy
    devices = install(monkeypatch, current=0)
    synced, held = [], []

    def keep_alive(keep, stream):
        if stream.ptr == 0x21:
            raise cupy.cuda.runtime.CUDARuntimeError(400)
        held.append((keep, stream.ptr))
    monkeypatch.setattr(device_tables, "keep_alive", keep_alive)
    monkeypatch.setattr(cupy.cuda.runtime, "deviceSynchronize", lambda: synced.append(devices.current))
    deferred = []
    streams = [_stream(1, 0x21), _stream(1, 0x22), _stream(0, 0x10)]
    device_tables._release_after("entry", streams, _stream(0, 0x10), deferred)
    assert synced == [1] and held == [(["entry"], 0x22)] and deferred == ["entry"]


def test_expand_kernel_is_loaded_on_its_device(monkeypatch):
    devices = install(monkeypatch, current=0)
    loaded = []
    monkeypatch.setattr(jit, "load", lambda spec: loaded.append(devices.current) or types.SimpleNamespace(ptr=7))
    monkeypatch.setattr(varlen_device, "_expand_launches", {})
    varlen_device._expand_launch(1)
    assert loaded == [1] and set(varlen_device._expand_launches) == {1} and devices.current == 0


def test_backward_kernels_and_occupancy_are_per_device(monkeypatch):
    """kernels.bwd_entry loads the three kernels and counts co-resident CTAs on the device it is asked for (its
    cache is keyed by device), whatever the current device."""
    devices = install(monkeypatch, current=1)
    seen = []
    monkeypatch.setattr(kernels, "_bwd_cache", {})
    monkeypatch.setattr(kernels, "max_resident_ctas", lambda spec: seen.append(("ctas", devices.current)) or 132)
    monkeypatch.setattr(jit, "load", lambda spec: seen.append(("load", devices.current)))
    kernels.bwd_entry(0, "bfloat16", 64, True)
    assert seen == [("ctas", 0), ("load", 0), ("load", 0)] and devices.current == 1
    kernels.bwd_entry(1, "bfloat16", 64, True)
    assert seen[3:] == [("ctas", 1), ("load", 1), ("load", 1)]
    kernels.bwd_entry(0, "bfloat16", 64, True)
    assert len(seen) == 6


def test_loaded_kernels_are_memoized_per_current_device(monkeypatch):
    """jit.load gives a function handle of the current device: a module loaded on device 0 is never handed out
    on device 1 (a CUfunction belongs to its device's context)."""
    import cupy
    from cupy_dash import gpu
    devices = install(monkeypatch, current=0)
    modules = []

    class Module:
        def load(self, cubin):
            self.device = devices.current
            modules.append(self)

        def get_function(self, name):
            return types.SimpleNamespace(ptr=0x100 + self.device, device=self.device)
    spec = kernels.fwd_spec("bfloat16", 64, False)
    compiled = types.SimpleNamespace(read_cubin=lambda: b"cubin", cubin_sha256=__import__("hashlib").sha256(
        b"cubin").hexdigest())
    monkeypatch.setattr(jit, "compile_spec", lambda s, force=False: compiled)
    monkeypatch.setattr(gpu, "require", lambda what, device=0: None)
    monkeypatch.setattr(cupy.cuda.function, "Module", Module)
    monkeypatch.setattr(cupy.cuda.driver, "funcSetAttribute", lambda *a: None)
    monkeypatch.setattr(jit, "_loaded", {})
    bound = []
    monkeypatch.setattr(gpu, "bind_context", lambda: bound.append(devices.current))
    f0 = jit.load(spec)
    devices.current = 1
    assert (spec, 1, jit.kernel_dir()) not in jit._loaded
    f1 = jit.load(spec)
    assert (f0.device, f1.device) == (0, 1) and len(modules) == 2 and (spec, 1, jit.kernel_dir()) in jit._loaded
    devices.current = 0
    assert jit.load(spec) is f0 and len(modules) == 2
    assert bound == [0, 1]          # each module load made its device's context current first (a new thread's)


def test_error_records_are_per_device(monkeypatch):
    """errors: each device has its own pool of traced-call records, allocated on that device."""
    import cupy
    devices = install(monkeypatch, current=0)
    blocks = []

    def zeros(shape, dtype):
        blocks.append(devices.current)
        return types.SimpleNamespace(data=types.SimpleNamespace(ptr=0x1000 * (len(blocks))))
    monkeypatch.setattr(cupy, "zeros", zeros)
    synced = []
    monkeypatch.setattr(cupy.cuda, "get_current_stream",
                        lambda: types.SimpleNamespace(synchronize=lambda: synced.append(devices.current)))
    monkeypatch.setattr(errors, "_slot_pools", {})
    a = errors.jit_record(1, ("fa3", 1, 1, 128, 128, 64, False))
    b = errors.jit_record(0, ("fa3", 1, 1, 128, 128, 64, False))
    assert blocks == synced == [1, 0] and devices.current == 0 and a != b
    assert errors._slot_pools[1].graph.block.data.ptr == a and errors._slot_pools[0].graph.block.data.ptr == b


def test_table_cache_bound_counts_each_devices_entries(monkeypatch):
    """The LRU bound is per device: a device that makes more tables than the bound evicts its own oldest entries,
    never another device's (a JAX mesh uploads each packing to every device), and releases them after its own
    streams."""
    devices = install(monkeypatch, current=0)
    released = []
    monkeypatch.setitem(device_tables._caches, "varlen", collections.OrderedDict())
    monkeypatch.setitem(device_tables._LIMITS, "varlen", 2)
    monkeypatch.setattr(device_tables, "_defer_release", lambda objs, stream, dev: released.append((dev, list(objs))))
    monkeypatch.setattr(device_tables, "_release_after",
                        lambda entry, streams, stream, deferred: deferred.append((entry[0], devices.current)))

    def make(name):
        return lambda stream, staging: (name, None)
    for dev, names in ((0, ("a0", "b0")), (1, ("a1", "b1", "c1", "d1"))):
        for name in names:
            device_tables.cached("varlen", name, dev, _stream(dev, 0), make(name))
    assert list(device_tables._caches["varlen"]) == [("a0", 0), ("b0", 0), ("c1", 1), ("d1", 1)]
    assert [objs for dev, objs in released if objs] == [[("a1", 1)], [("b1", 1)]]
    assert all(dev == 1 for dev, objs in released if objs)


def test_deferred_releases_are_kept_apart_per_device(monkeypatch):
    """Two devices' default streams share the handle 0: what each holds is released after its own device's
    stream, with that device current (CuPy's null stream has no device of its own)."""
    devices = install(monkeypatch, current=0)
    held = []
    monkeypatch.setattr(device_tables, "_deferred", {})
    monkeypatch.setattr(device_tables, "_deferred_misses", [0])
    monkeypatch.setattr(device_tables, "_capturing", lambda s: False)
    monkeypatch.setattr(device_tables, "keep_alive", lambda keep, s: held.append((devices.current, list(keep))))
    for i in range(device_tables._DEFER_MISSES):
        dev = i % 2
        device_tables._defer_release([f"staging{i} of device {dev}"], _stream(-1, 0), dev)
    assert sorted(held) == [(0, ["staging0 of device 0", "staging2 of device 0"]),
                            (1, ["staging1 of device 1", "staging3 of device 1"])]
    assert devices.current == 0


def test_an_entry_made_meanwhile_by_another_thread_is_the_one_kept(monkeypatch):
    """Two threads miss the same table at once: the entry the first one cached stays (a capture may already hold
    it), the second gets it (with its upload event, if on another stream) and its own copy is released after its
    stream's work."""
    install(monkeypatch, current=0)
    monkeypatch.setitem(device_tables._caches, "varlen", collections.OrderedDict())
    released = []
    monkeypatch.setattr(device_tables, "_defer_release", lambda objs, stream, dev: released.extend(objs))
    monkeypatch.setattr(device_tables, "_upload_event", lambda entry, stream: f"event of {entry[0]}")
    first = _stream(0, 0x10)

    def make_second(stream, staging):          # the other thread's miss completes while this one uploads
        device_tables.cached("varlen", "packing", 0, first, lambda s, st: ("first tables", "cu"))
        return "second tables", "cu2"
    got = device_tables.cached("varlen", "packing", 0, _stream(0, 0x20), make_second)
    assert got == ("first tables", "cu", "event of first tables")
    entry = device_tables._caches["varlen"][("packing", 0)]
    assert entry[0] == "first tables" and set(entry[4]) == {0x10, 0x20}
    assert [e[0] for e in released if isinstance(e, list)] == ["second tables"]


def test_collecting_graph_records_clears_the_failed_ones_only(monkeypatch):
    """check_errors reads the graph records and zeroes the failed ones only: another record may belong to a folded
    replay still counting at its grid barriers."""
    import cupy
    install(monkeypatch, current=0)
    block = np.zeros((errors.GRAPH_RECORDS, errors.RECORD_WORDS), np.int32)
    block[1, :4] = (1, 7, 3, 2)                 # a failed call
    block[2, 4] = 5                             # a folded replay's barrier counter, mid-flight
    rec = object.__new__(errors._GraphRecords)
    rec.device_id, rec.block, rec.infos, rec.wheres = 0, block, [[("fa3", 1, 1, 64, 64, 64, True)]] * 3, ["r"] * 3
    monkeypatch.setattr(cupy.cuda.runtime, "deviceSynchronize", lambda: None)
    monkeypatch.setattr(cupy, "asnumpy", np.array)                  # a copy, as from the device
    monkeypatch.setattr(cupy, "asarray", np.asarray)
    msgs = rec.collect()
    assert len(msgs) == 1 and "visit 7" in msgs[0]
    assert not block[1].any() and block[2, 4] == 5


def test_an_interrupted_check_errors_loses_no_record(monkeypatch):
    """check_errors waits outside the lock: a wait that raises (Ctrl-C, a CUDA error) puts the records not read back
    in the queue, and a failure already read is warned about, not lost behind the exception."""
    monkeypatch.setattr(errors, "_pending", collections.deque())
    monkeypatch.setattr(errors, "_slot_pools", {})

    class Interrupted(errors._Pending):
        __slots__ = ()

        def wait(self):
            raise KeyboardInterrupt

    def record(host, cls=errors._Pending):
        rec = cls()
        slot = types.SimpleNamespace(host=np.array(host, np.int32), done=lambda: bool(host[0]), device_id=0)
        rec.event, rec.slot, rec.keep, rec.info = None, slot, None, ("fa3", 1, 1, 64, 64, 64, True)
        return rec
    failed, stuck, later = record([1, 1, 7, 3, 2, 0, 0, 0]), record([0] * 8, Interrupted), record([1] + [0] * 7)
    errors._pending.extend([failed, stuck, later])
    with pytest.warns(RuntimeWarning, match="visit 7"), pytest.raises(KeyboardInterrupt):
        errors.check_errors()
    assert list(errors._pending) == [stuck, later]


def test_finished_keep_alives_are_retired_without_a_poll(monkeypatch):
    """A program that makes no eager backward never polls (JAX): keep_alive retires the finished records at the
    head of the queue, so what they hold (DLPack imports, evicted tables) is freed."""
    monkeypatch.setattr(errors, "_pending", collections.deque())
    done = []

    class Event:
        def __init__(self, finished):
            self.done = finished
    for finished in (True, True, False, True):
        errors.keep_alive([f"held {len(done)}"], types.SimpleNamespace(ptr=0), event=Event(finished))
        done.append(finished)
    assert [rec.keep for rec in errors._pending] == [["held 2"], ["held 3"]]


def test_an_operand_of_another_framework_than_q_is_imported(monkeypatch):
    """The kernels run on q's framework's stream: a torch or CuPy operand of another framework than q's is imported
    through DLPack (ordered after its producer's work) and kept until the launched work finishes, not read raw."""
    from cupy_dash.core import api, interop
    imported = []
    info = types.SimpleNamespace(framework="torch", data_ptr=0x1000, strides=(1, 2, 3, 4), name="k",
                                 shape=(1, 2, 3, 4), dtype="bfloat16")
    got = types.SimpleNamespace(shape=info.shape, dtype=info.dtype, data_ptr=0x2000, strides=(5, 6, 7, 8))
    monkeypatch.setattr(interop, "to_cupy", lambda x: imported.append(x) or "imported k")
    monkeypatch.setattr(interop, "describe", lambda arr, name: got)
    monkeypatch.setattr(interop, "check_layout", lambda i: None)
    keep = []
    assert api._resolve(info, "k", keep, "torch") == (0x1000, (1, 2, 3)) and keep == []   # q's framework: in place
    assert api._resolve(info, "k", keep, "cupy") == (0x2000, (5, 6, 7))                   # another: imported
    assert imported == ["k"] and keep == ["imported k"]


def test_a_value_head_dim_equal_to_the_head_dim_is_one_backward_entry(monkeypatch):
    """kernels.bwd_entry with head_dim_v None and with head_dim_v == head_dim is one build and one cache entry:
    prepare_varlen_backward (None) finds what the backward (Problem.Dv) loaded, and counts no occupancy again,
    which on a loader thread would be its first CUDA call."""
    install(monkeypatch, current=0)
    counted = []
    monkeypatch.setattr(kernels, "_bwd_cache", {})
    monkeypatch.setattr(kernels, "max_resident_ctas", lambda spec: counted.append(spec) or 132)
    monkeypatch.setattr(jit, "load", lambda spec: None)
    first = kernels.bwd_entry(0, "bfloat16", 128, True, head_dim_v=128)
    assert kernels.bwd_entry(0, "bfloat16", 128, True) is first and len(counted) == 1
    assert kernels.fwd_entry("bfloat16", 128, True, 128) is kernels.fwd_entry("bfloat16", 128, True)


@pytest.mark.parametrize("current_context, binds", [(0, True), (0x5A5A, False)], ids=["none-current", "current"])
def test_bind_context_makes_the_primary_context_current_only_where_none_is(monkeypatch, current_context, binds):
    """gpu.bind_context: a thread with no current context (a new loader thread whose needs are all cached) gets the
    current device's primary context through a runtime call (cudaFree(0)) and says so (the executor then launches
    again); one with a context pays nothing more."""
    import cupy

    from cupy_dash import gpu
    freed = []
    monkeypatch.setattr(cupy.cuda.driver, "ctxGetCurrent", lambda: current_context)
    monkeypatch.setattr(cupy.cuda.runtime, "free", lambda ptr: freed.append(ptr))
    assert gpu.bind_context() is binds
    assert freed == ([0] if binds else [])
