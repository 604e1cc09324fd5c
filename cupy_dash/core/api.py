"""The fixed-length entry points and the launch of every eager call, fixed length and varlen (:func:`run_forward`,
:func:`run_backward`): validation (:mod:`cupy_dash.core.problem`, before anything is allocated or launched) ->
tables -> launch on the caller's stream, results in the caller's type. Layouts, deferred errors, streams and CUDA
graphs: docs/api.md; the error record: docs/architecture.md, "Byte layouts".

NOTES: an eager call first polls the finished backwards without blocking and raises for a failed one. A call made
while torch's current stream captures a CUDA graph enqueues only its kernels there and neither polls nor records
the deferred errors; what no eager call of its variant, shape and schedule has made on that device is made outside
the capture (:func:`cupy_dash.cuda.capture.outside`) and kept for the life of the process. A captured backward
reports a timeout through its own device record, read by :func:`check_errors`.
"""
from __future__ import annotations

import functools
import sys

import cupy
import ml_dtypes
import numpy as np

from .. import config
from .. import schedule as _schedule
from ..cuda import capture, device_tables, jit, kernels, launchers, plans
from ..cuda.params import CONSTANTS
from ..cuda.errors import (acquire_slot, check_errors, graph_record, keep_alive, poll_errors as _poll_errors,
                           record_shared)
from ..schedule import compact_device
from . import fastpath, interop, varlen_host_cu
from .problem import UNCHECKED, check_flag, check_tma_operands, check_window, validate

NP_DTYPES = {"bfloat16": np.dtype(ml_dtypes.bfloat16), "float16": np.dtype(np.float16),
             "float32": np.dtype(np.float32), "uint8": np.dtype(np.uint8), "int32": np.dtype(np.int32)}


def _resolve(info, x, keep, caller=None):
    """(pointer, (batch, row, head) element strides) of a validated CUDA operand.

    torch and CuPy tensors of the caller's framework (``caller``: q's; None: ``info``'s own) are read from their
    attributes (no import needed; the kernels run on the caller's stream, so the framework's stream-ordered memory
    reuse stays safe). JAX and other producers, and an operand of another framework than q's (whose stream the
    kernels do not run on), are imported zero-copy through DLPack (which orders/blocks on their pending work); the
    imported views are kept alive in ``keep`` until the launched work has finished.
    """
    if info.framework in ("torch", "cupy") and info.framework == (caller or info.framework):
        return info.data_ptr, info.strides[:3]
    arr = interop.to_cupy(x)
    keep.append(arr)
    got = interop.describe(arr, info.name)
    if got.shape != info.shape or got.dtype != info.dtype:
        raise ValueError(f"{info.name}: DLPack import gave shape {got.shape} {got.dtype}, expected "
                         f"{info.shape} {info.dtype}")
    if len(info.shape) == 4:
        interop.check_layout(got)
    else:
        interop.check_contiguous(got)
    return got.data_ptr, got.strides[:3]


# outputs and scratch: torch's caching allocator for torch callers (no DLPack round trip), else CuPy's pool
_torch_dtypes: dict = {}
_torch_devices: dict = {}


def _new(fw, device_id, shape, dtype):
    """An uninitialised contiguous buffer and its device pointer, in the caller's allocator."""
    if fw == "torch":
        torch = sys.modules["torch"]
        tdt = _torch_dtypes.get(dtype) or _torch_dtypes.setdefault(dtype, getattr(torch, dtype))
        dev = _torch_devices.get(device_id) or _torch_devices.setdefault(device_id, torch.device("cuda", device_id))
        t = torch.empty(shape, dtype=tdt, device=dev)
        return t, t.data_ptr()
    a = cupy.empty(shape, dtype=NP_DTYPES[dtype])
    return a, a.data.ptr


def call_start(q) -> bool:
    """Whether the caller's current stream on ``q``'s device is capturing a CUDA graph; an eager call first raises
    the error of an earlier call that has failed since (:func:`check_errors`)."""
    capturing = interop.capturing(q)
    if not capturing:
        _poll_errors()
    return capturing


def _export(fw, arr, like):
    """A buffer from :func:`_new` as the caller's type."""
    return arr if fw == "torch" else interop.from_cupy(arr, like)


# ------------------------------------------------------------------------------------------------------------
# forward
# ------------------------------------------------------------------------------------------------------------
def attention_forward(q, k, v, *, causal=False, softmax_scale=None, window=(-1, -1), softcap=0.0):
    """Attention forward. Returns ``(out, lse)`` in the caller's array type.

    Args:
        q: ``(B, Sq, H, D)`` bf16/fp16 CUDA tensor (torch, JAX, CuPy or any ``__dlpack__`` object).
        k, v: ``(B, Sk, Hkv, D)`` and ``(B, Sk, Hkv, Dv)``, same dtype and device; ``H % Hkv == 0`` (query head
            ``h`` reads kv head ``h // (H // Hkv)``). D is 64, 96, 128, 192 or 256; Dv is D, or 128 with D 192.
            Strided inputs are read in place if the last dim is contiguous, other strides are multiples of 8
            elements and the base is 16-byte aligned.
        causal: bottom-right aligned causal mask (query ``i`` sees key ``j <= i + Sk - Sq``).
        softmax_scale: default ``1 / sqrt(D)``.
        window: sliding-window (local) attention, FlashAttention's ``window_size``: query ``i`` sees keys
            ``i + Sk - Sq - left <= j <= i + Sk - Sq + right``; -1 leaves a side unbounded; with ``causal``,
            right is 0.
        softcap: logit soft-capping (Gemma 2's ``attn_logit_softcapping``), ``c > 0``: the logits are
            ``c * tanh(softmax_scale * q.k / c)``; 0 (default): none. lse is then of the capped logits.

    Returns:
        out ``(B, Sq, H, Dv)`` (dtype of q, contiguous) and lse ``(B, H, Sq)`` float32 (natural log of the softmax
        denominator; ``-inf`` and ``out = 0`` for a row that sees no key).

    Runs on the caller's current stream (torch) or CuPy's current stream. Raises, before doing any work, for a
    backward of an earlier call that has since failed (see :func:`check_errors`). May be captured into a CUDA
    graph by torch callers (docs/api.md).
    """
    fast_key = fastpath.fwd_key(q, k, v, causal, softmax_scale, window, softcap) if fastpath.wanted(q) else None
    result = fastpath.forward(fast_key, q, k, v)
    if result is not None:
        return result
    capturing = call_start(q)
    causal = check_flag("causal", causal)
    window = check_window(window, causal)
    p = validate(q, k, v, softmax_scale=softmax_scale, softcap=softcap)
    window = _schedule.canonical_window(window, p.Sq, p.Sk, causal)
    spec, block_m, block_n = kernels.fwd_entry(p.dtype, p.D, causal, p.Dv,
                                               persistent=causal in kernels.FWD_PERSISTENT)
    return run_forward(q, p, spec, block_m, block_n, window, (q, k, v), launchers.fwd_grid(p, block_m),
                       ((p.B, p.Sq, p.H, p.Dv), (p.B, p.H, p.Sq)), capturing, fast_key, fastpath.register_forward)


def run_forward(like, p, spec, block_m, block_n, window, tensors, grid, shapes, capturing, fast_key, register,
                cu=()):
    """The launch of a forward of ``p`` (validated from ``tensors``: q, k, v ``(B, S, H, D)`` as the kernel reads
    them; ``like``: the caller's q), fixed-length and varlen alike: as :func:`run_backward`, with out and lse of
    ``shapes``; ``cu``: the varlen build's ``(number of sequences, (info, cu_seqlens_q), (info, cu_seqlens_k))``,
    copied to the host for the backward (:mod:`cupy_dash.core.varlen_host_cu`). ``register``: the fast path's."""
    fw, dev = p.infos[0].framework, p.device_id
    stream = interop.caller_stream(like, dev)
    with cupy.cuda.Device(dev), stream:
        with capture.loading(dev, capturing):       # as the backward's kernels: outside a capture
            jit.load(spec)
        keep = []
        operands = tuple(_resolve(i, x, keep, fw) for i, x in zip(p.infos, tensors))
        cu_ptrs = tuple(_resolve(info, x, keep)[0] for info, x in cu[1:])
        out, out_ptr = _new(fw, dev, shapes[0], p.dtype)
        lse, lse_ptr = _new(fw, dev, shapes[1], "float32")
        names, counter = plans.FWD_BUFFERS[:7 if cu else 5], None
        if ("DASH_PERSISTENT", 1) in spec.defines:      # (fixed length) its tile counter, zeroed by the plan
            # NOTES: held until the launch is enqueued: freed before, its block could go to another thread's
            # allocation on this stream, and two calls would zero and claim from one counter
            counter, counter_ptr = _new(fw, dev, (1,), "int32")
            names, cu_ptrs = plans.FWD_PERSISTENT_BUFFERS, (counter_ptr,)
        plan = plans.forward_plan(spec, grid, block_m, block_n, p, window, tuple(s for _, s in operands), names,
                                  cu[0] if cu else None)
        try:
            launchers.enqueue_forward(plan, stream, (*(ptr for ptr, _ in operands), out_ptr, lse_ptr, *cu_ptrs))
        finally:
            if keep:
                keep_alive(keep, stream)
        del counter                          # (stream-ordered from here: the allocator reuses it after the kernel)
        if cu and not capturing:             # for the backward of this call (varlen_host_cu.py): no wait there
            (q_info, cu_q), (k_info, cu_k) = cu[1:]
            varlen_host_cu.remember_both(cu_q, cu_k, (q_info, k_info), cu_ptrs, stream)
        if not keep and fast_key is not None and not capturing:
            register(fast_key, plan, shapes, like, tuple(info for info, _ in cu[1:]) or None)
        return _export(fw, out, like), _export(fw, lse, like)


# ------------------------------------------------------------------------------------------------------------
# backward
# ------------------------------------------------------------------------------------------------------------
def attention_backward(do, q, k, v, out, lse, *, causal=False, softmax_scale=None, schedule="auto",
                       deterministic=True, window=(-1, -1), softcap=0.0):
    """Attention backward. Returns ``(dq, dk, dv)`` in the caller's array type.

    Args:
        do, out: ``(B, Sq, H, Dv)`` (``out`` from :func:`attention_forward`); q ``(B, Sq, H, D)``;
            k ``(B, Sk, Hkv, D)``, v ``(B, Sk, Hkv, Dv)`` with ``H % Hkv == 0`` (GQA / MQA: query head ``h``
            reads kv head ``h // (H // Hkv)``); all one bf16/fp16 dtype on one CUDA device, strided as in
            :func:`attention_forward`.
        lse: ``(B, H, Sq)`` float32, contiguous, from :func:`attention_forward`.
        causal, softmax_scale, window, softcap: as in the forward call (:func:`attention_forward`); the sliding
            window ``(left, right)`` and the cap must be the forward's, so that ``out`` and ``lse`` belong to the
            same mask and logits.
        schedule: dQ reduction order, one of ``cupy_dash.schedule.POLICIES`` ("auto", "fa3", "descending",
            "shift", "symmetric_shift"). Every policy is bitwise run-to-run deterministic; they differ in speed
            (and, since the summation order differs, in the last bits).
        deterministic: False uses atomic dQ adds (faster, not reproducible) with the same work distribution.

    Returns:
        dq ``(B, Sq, H, D)``, dk ``(B, Sk, Hkv, D)`` and dv ``(B, Sk, Hkv, Dv)``, contiguous, dtype of q. With
        GQA the dK, dV of a kv head sum over the ``H // Hkv`` query heads of its group inside one CTA (the schedule
        keeps a KV tile's visits for the whole group on one CTA), so they are as deterministic as in MHA. Rows of
        dq whose query sees no key, and rows of dk, dv whose key no query sees, are 0.

    Runs asynchronously on the caller's stream: three kernels, or one for small problems (``CUPY_DASH_FOLD``;
    docs/architecture.md). A dQ semaphore wait past ``CUPY_DASH_SPIN_TIMEOUT_MS`` makes the kernel give up instead
    of hanging; the failure is raised later, by :func:`check_errors` or the next cupy_dash call. Like the forward,
    it raises first for an earlier failed backward and may be captured into a CUDA graph by torch callers.
    """
    fast_key = fastpath.bwd_key(do, q, k, v, out, lse, causal, softmax_scale, schedule, deterministic,
                                window, softcap) if fastpath.wanted(q) else None
    result = fastpath.backward(fast_key, do, q, k, v, out, lse)
    if result is not None:
        return result
    return _backward(do, q, k, v, out, lse, causal, softmax_scale, schedule, deterministic, None, None, None,
                     window, fast_key, softcap)


def _backward_with_plan(do, q, k, v, out, lse, *, plan, causal=False, softmax_scale=None, deterministic=True,
                        spin_timeout_ns=None, timeline=None, window=(-1, -1)):
    """Internal/test hook: the backward driven by an explicit schedule-like ``plan``.

    ``plan`` needs ``visits`` (V, 4) int32 rows (cta, bh, n_block, m_block) grouped by CTA, ``rank`` (V,) int32,
    ``cta_start`` (num_ctas + 1,) int64, ``num_ctas`` and ``policy`` (used in error messages); a ``group_size``
    attribute, if present, must be ``H // Hkv`` (the kernel groups visits into KV tiles by it), and a ``window``
    attribute, if present, must be this call's window in canonical form (``schedule.canonical_window``; a
    table of another mask would leave tiles out or add masked ones). Its tables are
    uploaded for this call only (never cached) and checked only so far as memory safety needs (indices in
    range, cta_start consistent); ranks may be arbitrary, and ``num_ctas`` may exceed the co-resident CTAs, so
    a deliberately inconsistent table exercises the bounded semaphore wait: the call returns, and
    :func:`check_errors` raises RuntimeError. ``spin_timeout_ns`` overrides ``CUPY_DASH_SPIN_TIMEOUT_MS``.
    ``timeline``: a CuPy int64 array (V, ``CONSTANTS.kTimelineCols``); the main kernel's debug build then writes
    the stamps of every visit into it (the columns: kernels_src/bwd/timeline.cuh).
    """
    if plan is None:
        raise ValueError("plan: a schedule-like object is required")
    return _backward(do, q, k, v, out, lse, causal, softmax_scale, None, deterministic, plan, spin_timeout_ns,
                     timeline, window)


def _backward(do, q, k, v, out, lse, causal, softmax_scale, schedule, deterministic, plan, spin_timeout_ns,
              timeline, window, fast_key=None, softcap=0.0):
    capturing = call_start(q)
    causal, deterministic = check_flag("causal", causal), check_flag("deterministic", deterministic)
    window = check_window(window, causal)
    p = validate(q, k, v, do, out, lse, softmax_scale=softmax_scale,
                 schedule=schedule if plan is None else UNCHECKED, backward=True, softcap=softcap)
    if capturing and plan is not None:
        raise RuntimeError("plan: an explicit plan is uploaded per call, which cannot happen during CUDA graph "
                           "capture")
    window = _schedule.canonical_window(window, p.Sq, p.Sk, causal)
    if spin_timeout_ns is None:
        spin_timeout_ns = config.spin_timeout_ns()
    else:
        spin_timeout_ns = int(spin_timeout_ns)
        if spin_timeout_ns <= 0:
            raise ValueError(f"spin_timeout_ns: expected a positive number, got {spin_timeout_ns}")
    B, Sq, Sk, H, Hkv, D = p.B, p.Sq, p.Sk, p.H, p.Hkv, p.D
    group = H // Hkv                                      # query heads per kv head
    if plan is not None and getattr(plan, "group_size", group) != group:
        raise ValueError(f"plan: built for group_size={plan.group_size} query heads per kv head, but q has H={H} "
                         f"and k, v have Hkv={Hkv} heads (group_size {group})")
    if plan is not None and tuple(getattr(plan, "window", window)) != window:
        raise ValueError(f"plan: built for window={tuple(plan.window)}, but this call's window is {window} "
                         f"(canonical form for Sq={Sq}, Sk={Sk})")
    dev = p.device_id
    check_tma_operands(p)
    # NOTES: compact tables (per-column records) serve policy-built tables without a timeline, for problems whose
    # per-visit table would be large or on request (compact_device.table_form); such calls are not registered on the
    # torch fast path, which replays per-visit launches.
    # NOTES: an explicit plan (a test hook) was built with kernels.bwd_tile's tiles for no seqlen_q
    tile_sq = Sq if plan is None else 0
    tile = kernels.bwd_tile(D, causal, seqlen_q=tile_sq, window=window)
    capped = p.softcap > 0
    compact = plan is None and timeline is None and compact_device.wanted(Sq, Sk, tile.block_m, tile.block_n, B * H,
                                                                          causal, window)
    with capture.loading(dev, capturing):
        specs, bm, bn, max_ctas = kernels.bwd_entry(dev, p.dtype, D, causal, timeline is not None, compact,
                                                    softcap=capped, seqlen_q=tile_sq, window=window,
                                                    head_dim_v=p.Dv)
    c = launchers.BwdLaunch(specs, bm, bn, p, deterministic, spin_timeout_ns, causal, window)
    if timeline is not None or (plan is not None and plan.num_ctas > max_ctas):
        c.fold = False      # NOTES: the fold's grid barriers need every CTA co-resident (kernels_src/bwd/fold.cuh)
    checked = None
    if plan is not None:
        checked = _schedule.check_plan(plan, B * H, -(-Sk // bn), c.num_m_blocks)   # before allocating
        num_visits, cols = len(checked[1]), CONSTANTS.kTimelineCols
        if timeline is not None and (timeline.shape != (num_visits, cols) or timeline.dtype != np.int64):
            raise ValueError(f"timeline: expected an int64 CuPy array of shape ({num_visits}, {cols})")
    stream = interop.caller_stream(q, dev)
    with cupy.cuda.Device(dev), stream:
        keep = []
        if plan is None:
            def find(side, capture):
                return launchers.bwd_tables(schedule, c, max_ctas, dev, side or stream, capture=capture,
                                            compact=compact)
            c.tables = capture.find_or_make(dev, find) if capturing else find(None, False)
        else:
            c.tables = device_tables.upload(plan, B * H, -(-Sk // bn), c.num_m_blocks, dev, stream, checked=checked)
            keep.append(c.tables)
        call = (c.tables.policy, B, H, Sq, Sk, D, causal, window)   # names the call in an error message
        register = functools.partial(fastpath.register_backward, fast_key if plan is None and timeline is None and
                                     not compact else None, c, call=call, like=q)
        return run_backward(c, p, call, stream, (q, k, v, out, do), lse, capturing, keep,
                            ((B, Sq, H, D), (B, Sk, Hkv, D), (B, Sk, Hkv, p.Dv)), register,
                            timeline_ptr=0 if timeline is None else timeline.data.ptr)


def run_backward(c, p, call, stream, tensors, lse, capturing, keep, shapes, register, timeline_ptr=0,
                 cu_seqlens=(0, 0)):
    """The launch of a backward whose :class:`launchers.BwdLaunch` ``c`` has its tables, on ``stream`` (current,
    device ``p.device_id`` current), fixed-length and varlen alike: the operands ``tensors`` (q, k, v, out, do, as
    validated into ``p``) and ``lse`` resolved to addresses (copies kept in ``keep``), new dq, dk, dv of ``shapes`` in
    the caller's framework, a workspace, an error slot (eager) or the graph's own record (``capturing``), the launch
    plan ``c.plan`` run with them, then the fast path's ``register()`` for an eager call that kept nothing. ``call``
    names it in error messages. Returns (dq, dk, dv) in the caller's type. With CUPY_DASH_SYNC_ERRORS set, an eager
    call waits for its kernels and raises their error."""
    dev = p.device_id
    graph_error = None
    if capturing:       # a record of its own, never reset by the graph (errors.py); no slot, event or copy
        with capture.outside(dev):       # the device's record block, at its first backward
            graph_error = graph_record(dev, call)
        if record_shared(dev, graph_error):
            c.fold = False
    qi, ki, vi, doi, oi = p.infos                     # validate's order; the kernels take out before dout
    fw = qi.framework
    operands = tuple(_resolve(i, x, keep, fw) for i, x in zip((qi, ki, vi, oi, doi), tensors))
    lse_ptr, _ = _resolve(p.lse_info, lse, keep, fw)
    work, base = _new(fw, dev, (c.work_bytes,), "uint8")
    (dq, dq_ptr), (dk, dk_ptr), (dv, dv_ptr) = (_new(fw, dev, shape, p.dtype)
                                                for shape in shapes)
    c.plan = plans.backward_plan(c, tuple(s for _, s in operands), plans.BWD_BUFFERS[:10 if capturing else 12],
                                 error=(graph_error, 0) if capturing else None, cu_seqlens=cu_seqlens,
                                 timeline=timeline_ptr)
    slot = None if capturing else acquire_slot(dev)
    (q_ptr, _), (k_ptr, _), (v_ptr, _), (o_ptr, _), (do_ptr, _) = operands
    buffers = (do_ptr, q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, dq_ptr, dk_ptr, dv_ptr, base)
    try:
        launchers.enqueue_backward(c, stream, buffers if capturing else (*buffers, slot.dptr, slot.hdev), slot=slot,
                                   call=call)
    finally:                 # (a launch that failed part way may have enqueued kernels that read the imports)
        if keep:
            keep_alive(keep, stream)
    if not keep and not capturing:
        register()
    result = tuple(_export(fw, g, tensors[0]) for g in (dq, dk, dv))
    if not capturing and config.SYNC_ERRORS.get():
        check_errors()
    return result
