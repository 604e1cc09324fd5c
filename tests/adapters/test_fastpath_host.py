"""CPU test of the fixed-length host fast path (cupy_dash.core.fastpath) with torch imitated and every GPU call replaced
(the fakes of fastpath_fakes.py): a repeated backward gets the full path's parameter block but for its new
outputs, scratch and error slot; the scratch of a small problem is the plan's own on the same stream and a new
one on another stream or above the size limit."""
from __future__ import annotations

import types

import pytest

import cupy_dash
from cupy_dash.core import fastpath, interop
from fastpath_fakes import (BF16, F32, Tensor, fixed_tables, no_gpu, outside_capture,  # noqa: F401  (fixtures)
                            served_backwards)


@pytest.fixture
def fixed(fixed_tables, monkeypatch):
    current = {"ptr": 0x77}
    monkeypatch.setattr(fastpath, "_ready_stream", lambda plan: types.SimpleNamespace(ptr=current["ptr"]))
    yield fixed_tables, current


def _inputs(S=128, H=1):
    q, do, out = (Tensor((1, S, H, 128), BF16, p) for p in (0x10000, 0x40000, 0x50000))
    k, v = (Tensor((1, S, H, 128), BF16, p) for p in (0x20000, 0x30000))
    lse = Tensor((1, H, S), F32, 0x60000)
    return do, q, k, v, out, lse


def test_a_repeated_backward_reuses_the_block_and_small_scratch(fixed, monkeypatch):
    enqueued, current = fixed
    args = _inputs()
    works = []
    for e, g in served_backwards(enqueued, args, 3, causal=True, schedule="fa3"):
        fast = e["params"]
        assert (int(fast["dq"]), int(fast["dk"]), int(fast["dv"])) == tuple(t.ptr for t in g)
        works.append(int(fast["lse_log2"]) - e["c"].offsets[0])
    assert works[0] == works[1] == works[2]                  # the plan's scratch, same stream
    current["ptr"] = 0x99
    cupy_dash.attention_backward(*args, causal=True, schedule="fa3")
    other = int(enqueued[-1]["params"]["lse_log2"]) - enqueued[-1]["c"].offsets[0]
    assert other != works[0]                                 # another stream: a fresh buffer
    monkeypatch.setattr(fastpath, "_CACHED_WORK_BYTES", 0)
    fastpath.clear()
    cupy_dash.attention_backward(*args, causal=True, schedule="fa3")
    big = [cupy_dash.attention_backward(*args, causal=True, schedule="fa3") for _ in range(2)]
    a, b = (int(e["params"]["lse_log2"]) for e in enqueued[-2:])
    assert a != b and len(big) == 2                          # above the limit: never kept


@pytest.mark.parametrize("contiguous", [True, False])
def test_gradients_allocated_like_q_and_k_only_when_contiguous(fixed, monkeypatch, contiguous):
    """run_backward allocates dq, dk, dv with empty_like(q / k) when q and k are contiguous with the gradients'
    shapes (decided at the plan's first call), else with empty(shape, dtype, device): contiguous either way."""
    calls = []
    real = fastpath._torch
    monkeypatch.setattr(fastpath, "_torch", types.SimpleNamespace(
        uint8=real.uint8, float32=real.float32,
        empty=lambda shape, dtype=None, device=None: calls.append(("empty", tuple(shape))) or real.empty(shape, dtype),
        empty_like=lambda t: calls.append(("like", t.ptr)) or real.empty(t.shape, t.dtype)))
    monkeypatch.setattr(Tensor, "is_contiguous", lambda self: contiguous)
    args = _inputs()
    cupy_dash.attention_backward(*args, causal=True, schedule="fa3")
    calls.clear()
    cupy_dash.attention_backward(*args, causal=True, schedule="fa3")
    do, q, k, v, out, lse = args
    grads = [c for c in calls if c[0] == "like" or len(c[1]) == 4]          # not the 1-D scratch
    if contiguous:
        assert grads == [("like", q.ptr), ("like", k.ptr), ("like", k.ptr)]
    else:
        assert grads == [("empty", (1, 128, 1, 128))] * 3


def test_ready_stream_steps_aside_on_another_device_or_under_capture(monkeypatch):
    """The fast path's one query per call: the stream the full path would take on the plan's device (torch's
    current stream, or CuPy's current stream for a CuPy plan), or None when the current device differs or that
    stream is capturing (cudaStreamIsCapturing, replaced here)."""
    state = {"device": 0, "capturing": 0}
    monkeypatch.setattr(fastpath, "_torch_mod", lambda: None)
    monkeypatch.setattr(fastpath.cupy.cuda.runtime, "getDevice", lambda: state["device"])
    monkeypatch.setattr(fastpath.cupy.cuda.runtime, "streamIsCapturing", lambda ptr: state["capturing"])
    monkeypatch.setattr(interop, "_torch_stream_ptr", lambda dev: 0x500 + dev)
    monkeypatch.setattr(interop, "external_stream", lambda ptr, dev: types.SimpleNamespace(ptr=ptr, dev=dev))
    monkeypatch.setattr(fastpath.cupy.cuda, "get_current_stream", lambda dev: types.SimpleNamespace(ptr=0x900 + dev))
    torch_plan = types.SimpleNamespace(device_index=0, cupy=False)
    cupy_plan = types.SimpleNamespace(device_index=0, cupy=True)
    s = fastpath._ready_stream(torch_plan)
    assert (s.ptr, s.dev) == (0x500, 0)
    assert fastpath._ready_stream(cupy_plan).ptr == 0x900
    state["device"] = 1
    assert fastpath._ready_stream(torch_plan) is None and fastpath._ready_stream(cupy_plan) is None
    state["device"], state["capturing"] = 0, 1          # cudaStreamCaptureStatusActive
    assert fastpath._ready_stream(torch_plan) is None and fastpath._ready_stream(cupy_plan) is None
    state["capturing"] = 2                              # invalidated: still not an eager stream
    assert fastpath._ready_stream(torch_plan) is None




def test_soft_capped_calls_are_served_by_value_of_their_cap(fixed):
    """A soft-capped forward and backward (Gemma 2's logit cap) repeat from their plans like plain ones, the cap in
    the signature by value: the capped build's block again, another cap the full path, a bool no signature (the
    full path raises)."""
    enqueued, _ = fixed
    do, q, k, v, out, lse = _inputs()
    for e, _ in served_backwards(enqueued, (do, q, k, v, out, lse), 2, causal=True, schedule="fa3", softcap=30.0):
        assert ("DASH_SOFTCAP", 1) in e["c"].specs.main.defines and float(e["params"]["softmax_scale"]) > 0
    hits = fastpath.stats()["bwd_hits"]
    cupy_dash.attention_backward(do, q, k, v, out, lse, causal=True, schedule="fa3", softcap=20.0)
    assert fastpath.stats()["bwd_hits"] == hits
    cupy_dash.attention_forward(q, k, v, causal=True, softcap=30)
    fwd = fastpath.stats()["fwd_hits"]
    cupy_dash.attention_forward(q, k, v, causal=True, softcap=30)
    cupy_dash.attention_forward(q, k, v, causal=True, softcap=30.5)
    assert fastpath.stats()["fwd_hits"] == fwd + 1
    with pytest.raises(TypeError, match="softcap"):
        cupy_dash.attention_forward(q, k, v, causal=True, softcap=True)


def test_a_capture_without_an_eager_call_makes_its_kernels_tables_and_record_outside_it(fixed, outside_capture,
                                                                                          monkeypatch):
    """A fixed-length backward whose first call is captured into a CUDA graph: its kernels are loaded, its tables
    made (on the stream of capture.outside, then found as a captured call finds them, which keeps them) and the
    device's graph record taken, each with the thread's capture mode relaxed; the kernels are enqueued on the
    capturing stream with the graph's record and no error slot; the fast path is not used."""
    from cupy_dash.core import api
    from cupy_dash.cuda import errors, kernels, launchers
    from fastpath_fakes import fake_bwd_entry
    enqueued, _ = fixed
    made, asked, log = {}, [], []
    ptr = types.SimpleNamespace

    def tables(schedule, c, max_ctas, dev, stream, capture=False, compact=False):
        asked.append((stream.ptr, capture, outside_capture.inside))
        if not capture:
            made["t"] = ptr(visits=ptr(data=ptr(ptr=0x7000)), rank=ptr(data=ptr(ptr=0x7100)),
                            cta_start=ptr(data=ptr(ptr=0x7200)), num_ctas=33, policy="fa3")
        return made.get("t")
    monkeypatch.setattr(launchers, "bwd_tables", tables)
    monkeypatch.setattr(kernels, "bwd_entry", lambda *a, **kw: log.append(("kernels", outside_capture.inside)) or
                        fake_bwd_entry(*a, **kw))
    monkeypatch.setattr(api, "graph_record", lambda dev, call: log.append(("record", outside_capture.inside)) or
                        0xE000)
    monkeypatch.setattr(api, "record_shared", lambda dev, ptr: False)
    monkeypatch.setattr(errors, "acquire_slot", lambda dev: pytest.fail("a captured call takes no slot"))
    monkeypatch.setattr(interop, "capturing", lambda x: True)
    monkeypatch.setattr(fastpath, "_ready_stream", lambda plan: None)     # as on a capturing stream
    capturing_stream, hits = 0x77, fastpath.stats()["bwd_hits"]
    cupy_dash.attention_backward(*_inputs(), causal=True, schedule="fa3")
    side = outside_capture.SIDE
    assert asked == [(capturing_stream, True, False), (side, False, True), (capturing_stream, True, False)]
    assert log == [("kernels", True), ("record", True)] and not outside_capture.inside
    assert outside_capture.modes == [outside_capture.RELAXED, 0] * 3 and outside_capture.syncs == [side] * 3
    e = enqueued[-1]
    assert e["slot"] is None and int(e["params"]["error"]) == 0xE000 and e["c"].tables is made["t"]
    assert fastpath.stats()["bwd_hits"] == hits


@pytest.mark.parametrize("causal", [True, False], ids=["causal-persistent", "full"])
def test_every_forward_buffer_is_alive_when_its_launch_is_enqueued(no_gpu, monkeypatch, causal):
    """The full path and the fast path keep every buffer they allocate for a forward (out, lse and the persistent
    build's tile counter) until its launch is enqueued: a buffer freed before could go to another thread's
    allocation on the same stream, and two calls would share it."""
    import weakref
    from cupy_dash.core import api
    from cupy_dash.cuda import launchers
    import fastpath_fakes
    live, checked = {}, []

    def empty(shape, dtype=None, device=None):
        t = Tensor(shape if isinstance(shape, tuple) else (shape,), dtype, 0x2000000 + 0x1000 * len(live))
        live[t.ptr] = weakref.ref(t)
        return t

    def new(fw, dev, shape, dtype):
        t = empty(tuple(shape), {"uint8": fastpath_fakes.U8, "float32": F32, "int32": fastpath_fakes.I32}.get(
            dtype, BF16))
        return t, t.ptr

    def enqueue(plan, stream, buffers):
        checked.append([ptr for ptr in buffers if ptr in live])
        assert all(live[ptr]() is not None for ptr in buffers if ptr in live), "a buffer was freed before its launch"
    monkeypatch.setattr(api, "_new", new)
    monkeypatch.setattr(fastpath._torch, "empty", empty)
    monkeypatch.setattr(fastpath._torch, "empty_like", lambda t: empty(t.shape, t.dtype))
    monkeypatch.setattr(launchers, "enqueue_forward", enqueue)
    _, q, k, v, _, _ = _inputs(S=1024, H=2)
    for _ in range(2):                                    # the full path, then the fast path
        cupy_dash.attention_forward(q, k, v, causal=causal)
    assert fastpath.stats()["fwd_hits"] >= 1
    assert [len(c) for c in checked] == [3 if causal else 2] * 2     # out, lse (and the counter)


def test_an_evicted_backward_plan_is_released_after_every_stream_it_ran_on(fixed, monkeypatch):
    """A backward plan may hold the last reference to its schedule tables: dropped from the fast path (its LRU, or
    clear()), it is kept alive until the work of every stream it ran on has finished (an event per stream)."""
    from cupy_dash.core import fastpath as fp
    from cupy_dash.cuda import device_tables
    enqueued, current = fixed
    kept = []
    monkeypatch.setattr(device_tables, "keep_alive", lambda keep, stream, event=None: kept.append((keep[0],
                                                                                                    stream.ptr)))
    args = _inputs()
    for ptr in (0x77, 0x88, 0x77):
        current["ptr"] = ptr
        cupy_dash.attention_backward(*args, causal=True, schedule="fa3")
    plan, = fp._bwd_plans.values()
    assert set(plan.streams) == {0x77, 0x88} and not kept
    monkeypatch.setattr(fp, "_MAX_PLANS", 1)
    fp.store(fp._bwd_plans, "another signature", fp.backward_plan(plan.c, plan.call, args[1], plan.shapes), 1)
    assert sorted(kept, key=lambda k: k[1]) == [(plan, 0x77), (plan, 0x88)]
    # a stream that another thread is capturing takes no event: the plan is kept instead
    other, = fp._bwd_plans.values()
    other.streams = dict(plan.streams)
    monkeypatch.setattr(fp.cupy.cuda.runtime, "streamIsCapturing", lambda ptr: int(ptr == 0x88))
    monkeypatch.setattr(device_tables, "_captured", {})
    fp.clear()
    assert kept[2:] == [(other, 0x77)] and list(device_tables._captured.values()) == [other]


def test_the_per_thread_default_stream_never_shares_a_scratch(fixed):
    """cudaStreamPerThread has one handle (2) in every thread and is another stream in each: a repeated backward on
    it gets a scratch of its own every time (two threads could otherwise share one)."""
    enqueued, current = fixed
    args = _inputs()
    current["ptr"] = 2
    works = [int(e["params"]["lse_log2"]) - e["c"].offsets[0]
             for e, _ in served_backwards(enqueued, args, 2, causal=True, schedule="fa3")]
    assert works[0] != works[1]


def test_a_plan_stored_again_under_its_key_releases_the_one_it_replaces(monkeypatch):
    """fastpath.store: a plan replacing another under the same key releases the old one (after its streams) and
    evicts nothing else; a full table drops its oldest."""
    from cupy_dash.core import fastpath as fp
    released = []
    monkeypatch.setattr(fp, "_release", released.append)
    table = {}
    fp.store(table, "a", "plan a", 2)
    fp.store(table, "b", "plan b", 2)
    fp.store(table, "a", "plan a2", 2)
    assert table == {"b": "plan b", "a": "plan a2"} and released == ["plan a"]
    fp.store(table, "c", "plan c", 2)
    assert list(table) == ["a", "c"] and released == ["plan a", "plan b"]
