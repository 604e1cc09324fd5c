"""Host fast path: a repeated call with torch tensors or CuPy arrays (all operands of one framework), fixed length
or varlen (:mod:`cupy_dash.core.fastpath_varlen`), whose *signature* matches a call the full path validated and
launched, allocates its outputs with the caller's framework and runs that call's launch plan
(:mod:`cupy_dash.cuda.plans`) with its own addresses, on the stream the full path would take. Fixed-length and
varlen plans share the plan classes and :func:`run_forward` / :func:`run_backward`; varlen plans add the stream
their table was uploaded for. Host time: docs/architecture.md.

NOTES: the signature holds everything the full path's checks depend on: each tensor's shape, strides, dtype and
device, whether all base addresses are 16-byte aligned, the arguments by type and value (``causal`` a ``bool``,
``window`` a tuple, ``softmax_scale`` None or a float, ``softcap`` a float or an int, ``schedule`` a str) and the
environment variables that change the launch (:func:`cupy_dash.config.fingerprint`). Plans are made only by calls
that passed the checks, so a call that would fail one never matches and bad input still raises before any launch.
The fast path steps aside (returns None) when the current stream captures a CUDA graph, when the current device is
not the tensors', or with ``CUPY_DASH_FASTPATH=0``. The same launch plan, run by the same
:mod:`cupy_dash.cuda.launchers` functions, gives the same bits.
"""
from __future__ import annotations

import operator
import threading

import cupy

from .. import config
from ..cuda import device_tables, errors, launchers, plans
from . import interop

_MAX_PLANS = 256
_fwd_plans: dict = {}
_bwd_plans: dict = {}
_lock = threading.Lock()
_torch = None
_stats = {"fwd_hits": 0, "bwd_hits": 0}


# NOTES: knobs read on every call cost a dict lookup and a comparison each (docs/configuration.md)
enabled = config.FASTPATH.get      # enabled() -> bool: unless CUPY_DASH_FASTPATH is "0" or ""


def clear() -> None:
    """Forget every plan (tests; also frees the schedule tables only plans still held, after their work)."""
    with _lock:
        dropped = list(_bwd_plans.values())
        _fwd_plans.clear()
        _bwd_plans.clear()
    for plan in dropped:
        _release(plan)


def stats() -> dict:
    """Fast-path hits since import: ``{"fwd_hits": n, "bwd_hits": n}``."""
    return dict(_stats)


def _torch_mod():
    global _torch
    if _torch is None:
        import torch
        _torch = torch
    return _torch


def is_torch(x) -> bool:
    t = type(x)
    return t.__name__ == "Tensor" and t.__module__ == "torch"


def is_cupy(x) -> bool:
    return type(x) is cupy.ndarray


def wanted(q) -> bool:
    """Whether a call on ``q`` may be served here: torch or CuPy, the fast path on."""
    return (is_torch(q) or is_cupy(q)) and enabled()


def _sig(t) -> tuple:
    return t.shape, t.stride(), t.dtype, t.device


def _cupy_sig(a) -> tuple:
    # NOTES: never equal to a torch signature (a numpy dtype and an int device against torch's dtype and device)
    return a.shape, a.strides, a.dtype, a.device.id


_torch_ptr = operator.methodcaller("data_ptr")
_cupy_ptr = operator.attrgetter("data.ptr")


# NOTES: the signatures are spelled out per call kind (no loop, map or reduce): they run on every call, and a
# generic form cost ~3 µs more per forward in benchmarks/host_python.py.
def fwd_key(q, k, v, causal, softmax_scale, window, softcap=0.0):
    """The forward's signature (module docstring), or None when an argument's type rules the fast path out."""
    if type(causal) is not bool or not int_pair(window) or (
            softmax_scale is not None and type(softmax_scale) is not float) or type(softcap) not in NUMBERS:
        return None
    if is_torch(q) and is_torch(k) and is_torch(v):
        aligned = not ((q.data_ptr() | k.data_ptr() | v.data_ptr()) & 15)
        return _sig(q), _sig(k), _sig(v), causal, softmax_scale, window, softcap, aligned
    if is_cupy(q) and is_cupy(k) and is_cupy(v):
        aligned = not ((q.data.ptr | k.data.ptr | v.data.ptr) & 15)
        return _cupy_sig(q), _cupy_sig(k), _cupy_sig(v), causal, softmax_scale, window, softcap, aligned
    return None


NUMBERS = (float, int)     # a logit cap's types that the signature holds by value (a bool is neither)


def int_pair(window) -> bool:
    """Whether ``window`` is a tuple of two ints, the form a signature holds by value (``(-1.0, -1)`` or ``(True,
    0)`` would equal a checked window and skip the check that rejects them)."""
    return type(window) is tuple and len(window) == 2 and type(window[0]) is int and type(window[1]) is int


def bwd_key(do, q, k, v, out, lse, causal, softmax_scale, schedule, deterministic, window, softcap=0.0):
    """The backward's signature (module docstring), or None."""
    if type(causal) is not bool or type(deterministic) is not bool or not int_pair(window) or \
            type(schedule) is not str or (softmax_scale is not None and type(softmax_scale) is not float) or \
            type(softcap) not in NUMBERS:
        return None
    if is_torch(do) and is_torch(q) and is_torch(k) and is_torch(v) and is_torch(out) and is_torch(lse):
        sig, ptrs = _sig, do.data_ptr() | q.data_ptr() | k.data_ptr() | v.data_ptr() | out.data_ptr() | lse.data_ptr()
    elif is_cupy(do) and is_cupy(q) and is_cupy(k) and is_cupy(v) and is_cupy(out) and is_cupy(lse):
        sig, ptrs = _cupy_sig, do.data.ptr | q.data.ptr | k.data.ptr | v.data.ptr | out.data.ptr | lse.data.ptr
    else:
        return None
    return (sig(do), sig(q), sig(k), sig(v), sig(out), sig(lse), causal, softmax_scale, schedule, deterministic,
            window, softcap, not (ptrs & 15), config.fingerprint())


def store(table: dict, key, plan, limit=_MAX_PLANS) -> None:
    """Keep ``plan`` under ``key`` in ``table`` (the plan it replaces released, :func:`_release`), dropping the
    oldest plan beyond ``limit``."""
    with _lock:
        dropped = [table.pop(key)] if key in table else []
        if len(table) >= limit:
            dropped.append(table.pop(next(iter(table))))
        table[key] = plan
    for old in dropped:
        if old is not plan:
            _release(old)


def _release(plan) -> None:
    """Drop a backward plan once the work of every stream it ran on has finished: it may hold the last reference to
    its schedule tables (the device-table cache may have let them go, after the streams of the calls it served,
    not the fast path's), whose memory the pool must not hand out while a kernel still reads it."""
    streams = getattr(plan, "streams", None)
    if streams:
        device_tables.release_after(plan, list(streams.values()), plan.device_index)


def serve(table, key, counts, name, run, *tensors):
    """``run(plan, stream, *tensors)`` for the plan stored in ``table`` under ``key`` on the stream the full path
    would take (:func:`_ready_stream`), counted in ``counts[name]``; None when there is none (the caller then takes
    the full path)."""
    plan = table.get(key) if key is not None else None
    stream = _ready_stream(plan) if plan is not None else None
    if stream is None:
        return None
    result = run(plan, stream, *tensors)
    counts[name] += 1
    return result


def _ready_stream(plan):
    """The stream the full path would take for the plan's tensors (torch's current stream as the (cached) CuPy
    view the launchers take, or CuPy's current stream); None (the fast path steps aside) when the current device
    is not the plan's or the stream is capturing a CUDA graph."""
    rt = cupy.cuda.runtime
    device_index = plan.device_index
    if rt.getDevice() != device_index:
        return None
    if plan.cupy:
        stream = cupy.cuda.get_current_stream(device_index)
        return None if rt.streamIsCapturing(stream.ptr) else stream
    _torch_mod()
    ptr = interop._torch_stream_ptr(device_index)
    if rt.streamIsCapturing(ptr):
        return None
    return interop.external_stream(ptr, device_index)


def _framework_of(plan, like) -> None:
    """The plan's allocation target, from ``like`` (q of the full path's call): ``cupy``, ``dtype``, ``device``
    (torch's device, or the CuPy device id), ``device_index`` and ``ptr`` (a tensor's address)."""
    plan.cupy = is_cupy(like)
    if plan.cupy:
        plan.dtype, plan.device, plan.device_index, plan.ptr = like.dtype, like.device.id, like.device.id, _cupy_ptr
    else:
        plan.dtype, plan.device, plan.device_index, plan.ptr = like.dtype, like.device, like.get_device(), _torch_ptr


def _empty(plan, shape, dtype=None):
    """An uninitialised contiguous buffer in the plan's framework (``dtype``: the framework's; default the plan's)."""
    dtype = plan.dtype if dtype is None else dtype
    return cupy.empty(shape, dtype) if plan.cupy else _torch.empty(shape, dtype=dtype, device=plan.device)


# ------------------------------------------------------------------------------------------------------------
# forward
# ------------------------------------------------------------------------------------------------------------
class _FwdPlan:
    __slots__ = ("launch", "out_shape", "lse_shape", "dtype", "device", "device_index", "cupy", "ptr", "cu_infos",
                 "out_like_q", "counter")


def register_forward(key, launch, shapes, like, cu_infos=None, table=_fwd_plans, limit=_MAX_PLANS) -> None:
    """Keep in ``table`` the plan of a forward the full path has just launched: its launch plan ``launch``
    (plans.forward_plan), ``shapes`` those of out and lse, ``like`` its q; ``cu_infos``: the varlen build's
    TensorInfo of cu_seqlens_q and cu_seqlens_k (their addresses are then buffers of the launch)."""
    plan = _FwdPlan()
    plan.launch = launch
    plan.out_shape, plan.lse_shape = shapes
    plan.cu_infos = cu_infos
    plan.counter = len(launch.parts.zeros) > 0          # the persistent build: a tile counter per call
    _framework_of(plan, like)
    plan.out_like_q = not plan.cupy and like.is_contiguous() and tuple(like.shape) == tuple(plan.out_shape)
    store(table, key, plan, limit)


def run_forward(plan, stream, q, k, v, cu=()):
    """``(out, lse)`` of a forward launched from ``plan`` on ``stream`` (``cu``: the varlen build's cu_seqlens)."""
    errors.poll_errors()
    counter = None             # the persistent build's tile counter: held until enqueued (api.run_forward's NOTES)
    if plan.cupy:
        out, lse = cupy.empty(plan.out_shape, plan.dtype), cupy.empty(plan.lse_shape, cupy.float32)
        buffers = (q.data.ptr, k.data.ptr, v.data.ptr, out.data.ptr, lse.data.ptr, *(x.data.ptr for x in cu))
        if plan.counter:
            counter = cupy.empty(1, cupy.int32)
            buffers += (counter.data.ptr,)
    else:
        torch = _torch
        # NOTES: empty_like (no shape or dtype to parse: ~0.5 µs less per allocation) where q is contiguous with
        # the output's shape: the new tensor is then contiguous too (a size-1 dimension may keep q's odd stride,
        # which addresses nothing); the signature fixes q's layout for every call of the plan.
        out = torch.empty_like(q) if plan.out_like_q else torch.empty(plan.out_shape, dtype=plan.dtype,
                                                                      device=plan.device)
        lse = torch.empty(plan.lse_shape, dtype=torch.float32, device=plan.device)
        buffers = (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(), *(
            x.data_ptr() for x in cu))
        if plan.counter:
            counter = torch.empty((1,), dtype=torch.int32, device=plan.device)
            buffers += (counter.data_ptr(),)
    launchers.enqueue_forward(plan.launch, stream, buffers)
    del counter        # stream-ordered from here: the allocator reuses it after the kernel
    return out, lse


def forward(key, q, k, v):
    """``(out, lse)`` from the plan stored under ``key`` (:func:`fwd_key` of the call), or None (then the caller
    takes the full path)."""
    return serve(_fwd_plans, key, _stats, "fwd_hits", run_forward, q, k, v)


# ------------------------------------------------------------------------------------------------------------
# backward
# ------------------------------------------------------------------------------------------------------------
class _BwdPlan:
    __slots__ = ("c", "call", "shapes", "dtype", "device", "device_index", "cupy", "ptr", "work", "stream", "keep",
                 "grads_like", "streams")


def backward_plan(c, call, like, shapes):
    """The plan of a backward the full path has just launched (``c``: its launchers.BwdLaunch with tables and
    launch plan, which takes the error record's addresses as buffers; current device: its device; ``like``: q;
    ``shapes``: of dq, dk, dv)."""
    plan = _BwdPlan()
    plan.c, plan.call, plan.stream, plan.keep, plan.work, plan.grads_like = c, call, None, None, None, None
    plan.shapes, plan.streams = tuple(shapes), {}
    _framework_of(plan, like)
    return plan


def rebased_plan(base, c, call, cu_seqlens):
    """``base`` (the plan of a varlen backward) for another packing of the same tensors, flags and stream:
    ``c`` its launchers.BwdLaunch with tables, ``call`` its error-message tuple, ``cu_seqlens`` its device
    lengths; its launch plan base's with the fields that depend on the lengths patched (plans.rebased)."""
    plan = _BwdPlan()
    for name in _BwdPlan.__slots__:
        setattr(plan, name, getattr(base, name))
    plan.c, plan.call, plan.work, plan.keep, plan.streams = c, call, None, None, {}
    c.plan = plans.rebased(base.c.plan, base.c.specs, c, cu_seqlens)
    return plan


def register_backward(key, c, call, like) -> None:
    """Keep the plan of a backward the full path has just launched (``c``: its launchers.BwdLaunch with tables and
    launch plan; current device: its device). ``like``: q."""
    if key is None:
        return
    p = c.p
    store(_bwd_plans, key, backward_plan(c, call, like, ((p.B, p.Sq, p.H, p.D), (p.B, p.Sk, p.Hkv, p.D),
                                                         (p.B, p.Sk, p.Hkv, p.Dv))))


_CACHED_WORK_BYTES = 256 << 10   # scratch kept per plan (its last stream) up to this size: small problems only


def _work(plan, nbytes, stream_ptr):
    """The backward's scratch buffer: the plan's own one if it was allocated on this stream and is small (a later
    call on the same stream runs after the earlier one's kernels: stream order makes the reuse safe; the
    preprocess pass, folded or not, initialises it), else a fresh one.
    NOTES: at most _CACHED_WORK_BYTES per plan (fixed-length and varlen: 264 plans, 66 MiB) stays allocated this
    way; the host time where this matters (~3 µs per call) is that of small problems. The per-thread default stream
    has one handle in every thread but is another stream in each: its calls never share a scratch."""
    cached = plan.work
    if cached is not None and cached[0] == stream_ptr:
        return cached[1]
    work = _empty(plan, (nbytes,), cupy.uint8 if plan.cupy else _torch.uint8)
    if nbytes <= _CACHED_WORK_BYTES and stream_ptr != cupy.cuda.runtime.streamPerThread:
        plan.work = (stream_ptr, work)
    return work


def run_backward(plan, stream, do, q, k, v, out, lse):
    """``(dq, dk, dv)`` of a backward launched from ``plan`` on ``stream``: outputs allocated in the plan's
    framework, then the full path's launch plan run with this call's addresses (launchers.enqueue_backward), so
    the bits are its."""
    errors.poll_errors()
    c = plan.c
    plan.streams[stream.ptr] = stream              # (for _release)
    work = _work(plan, c.work_bytes, stream.ptr)
    like = plan.grads_like
    if like is None:                               # decided at the plan's first call (as run_forward's)
        like = plan.grads_like = not plan.cupy and q.is_contiguous() and k.is_contiguous() and \
            (tuple(q.shape), tuple(k.shape), tuple(k.shape)) == plan.shapes
    if like:
        dq, dk, dv = _torch.empty_like(q), _torch.empty_like(k), _torch.empty_like(k)
    else:
        dq, dk, dv = (_empty(plan, shape) for shape in plan.shapes)
    ptr = plan.ptr
    slot = errors.acquire_slot(plan.device_index)     # enqueue_backward retires it if anything fails
    launchers.enqueue_backward(c, stream, (ptr(do), ptr(q), ptr(k), ptr(v), ptr(out), ptr(lse), ptr(dq), ptr(dk),
                                           ptr(dv), ptr(work), slot.dptr, slot.hdev), slot=slot, call=plan.call)
    if config.SYNC_ERRORS.get():
        errors.check_errors()
    return dq, dk, dv


def backward(key, do, q, k, v, out, lse):
    """``(dq, dk, dv)`` from the plan stored under ``key`` (:func:`bwd_key` of the call), or None (then the caller
    takes the full path)."""
    return serve(_bwd_plans, key, _stats, "bwd_hits", run_backward, do, q, k, v, out, lse)
