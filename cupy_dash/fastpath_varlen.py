"""Host fast paths of the varlen forward and backward for torch tensors (see :mod:`cupy_dash.fastpath` for the
idea).

A training step with packed sequences calls :func:`cupy_dash.attention_backward_varlen` once per layer with the
same packing, shapes and flags. After a full-path call with torch tensors has been validated and launched, its
plan is kept here: the three kernels, the packed parameter block (pointing at the device copies of the schedule
table and of cu_seqlens that the full path uploaded, which the plan keeps alive), the offsets of the fields that
change per call. A later call with the same signature, lengths and stream re-launches from it: four
``torch.empty``, the patched block, one ``launch_sequence`` (dk, dv zeroed first when the full path did). The
forward's plan needs no lengths (its kernel reads cu_seqlens on the device): its signature holds their layouts,
and their addresses are patched per call.

NOTES: the signature holds what the full path's checks depend on: every tensor's shape, strides, dtype and device,
16-byte alignment of all six addresses, the arguments by type and value, the environment variables that change the
launch (spin timeout, compact tables, device expansion), the torch stream (the table's upload was ordered before the
full call's kernels on that stream only), and the lengths: host cu_seqlens by dtype and bytes (checked by the full
path when the plan was made), device ones through the forward's host copy (:mod:`cupy_dash.varlen_host_cu`; no copy,
no fast path). So a call that would fail a check never matches.
"""
from __future__ import annotations

import os
import struct
import threading

import numpy as np

from . import _launch, errors, fastpath, interop, kernels, launchers, varlen_host_cu

_MAX_PLANS = 8            # each holds its packing's device tables (up to a few MB)
_plans: dict = {}
_fwd_plans: dict = {}
_lock = threading.Lock()
_stats = {"hits": 0, "fwd_hits": 0}
_POINTERS = ("q", "k", "v", "out", "dout", "lse", "lse_log2", "dpsum", "dq_accum", "dq_semaphore", "dq", "dk",
             "dv")


def stats() -> dict:
    return dict(_stats)


def clear() -> None:
    with _lock:
        _plans.clear()
        _fwd_plans.clear()


def _lengths_key(cu, device_index):
    """Hashable lengths of a cu_seqlens argument, or None when they are not known without a copy."""
    if type(cu) in (np.ndarray, list, tuple):
        host = np.asarray(cu)                   # a list's element types show in the dtype (1.0 is not 1)
        return host.dtype.str, host.shape, host.tobytes()
    if not fastpath.is_torch(cu):
        return None
    if not cu.is_cuda:
        if cu.dim() != 1:
            return None
        return str(cu.dtype), cu.numpy().tobytes()
    if cu.get_device() != device_index:
        return None
    info = _DeviceCu(device_index)
    host = varlen_host_cu.lookup(cu, info, cu.data_ptr())
    return None if host is None else ("device", host.tobytes())


class _DeviceCu:
    """What varlen_host_cu.lookup reads of a torch device cu_seqlens' description."""
    __slots__ = ("device_id",)
    framework = "torch"

    def __init__(self, device_id):
        self.device_id = device_id


def key(do, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, softmax_scale, window, schedule, deterministic):
    """The varlen backward's signature (module docstring), or None when the fast path cannot serve the call."""
    if not fastpath.enabled() or not all(fastpath.is_torch(x) for x in (do, q, k, v, out, lse)) or \
            type(causal) is not bool or type(deterministic) is not bool or type(window) is not tuple or \
            type(schedule) is not str or type(max_q) is not int or type(max_k) is not int or \
            (softmax_scale is not None and type(softmax_scale) is not float) or not q.is_cuda:
        return None
    dev = q.get_device()
    lens = _lengths_key(cu_q, dev), _lengths_key(cu_k, dev)
    if lens[0] is None or lens[1] is None:
        return None
    sig = fastpath._sig
    ptrs = do.data_ptr() | q.data_ptr() | k.data_ptr() | v.data_ptr() | out.data_ptr() | lse.data_ptr()
    return (sig(do), sig(q), sig(k), sig(v), sig(out), sig(lse), lens, max_q, max_k, causal, softmax_scale, window,
            schedule, deterministic, not (ptrs & 15), interop._torch_stream_ptr(dev),
            os.environ.get("CUPY_DASH_SPIN_TIMEOUT_MS"), os.environ.get("CUPY_DASH_COMPACT_TABLES"),
            os.environ.get("CUPY_DASH_VARLEN_EXPAND"))


class _Plan:
    __slots__ = ("c", "call", "launches", "template", "maps", "map_offsets", "offsets", "error_offsets",
                 "deterministic", "dq_shape", "kv_shape", "dtype", "device", "device_index", "stream", "keep")


def register(key_, c, operands, lse_ptr, work_base, grads, cu_ptrs, call, like, stream, keep) -> None:
    """Keep the plan of a varlen backward the full path has just launched (``c``: its BwdLaunch with tables;
    ``keep``: the device tables and cu_seqlens copies its block points at; current device: its device)."""
    if key_ is None:
        return
    p = c.p
    total_q, total_k, H, Hkv, D = p.Sq, p.Sk, p.H, p.Hkv, p.D
    plan = _Plan()
    plan.c, plan.call, plan.keep, plan.stream = c, call, keep, stream
    plan.launches = launchers.bwd_launches(c)
    plan.template = launchers.bwd_params(c, operands, lse_ptr, work_base, grads, (0, 0),
                                         cu_seqlens=cu_ptrs).tobytes()
    (_, q_stride), (_, k_stride), (_, v_stride), _, (_, do_stride) = operands
    maps = fastpath._Maps
    plan.maps = (maps(p.dtype, (1, total_q, H, D), q_stride, c.block_m, "q"),
                 maps(p.dtype, (1, total_k, Hkv, D), k_stride, c.block_n, "k"),
                 maps(p.dtype, (1, total_k, Hkv, D), v_stride, c.block_n, "v"),
                 maps(p.dtype, (1, total_q, H, D), do_stride, c.block_m, "do"))
    dt = kernels.BWD_PARAMS_DTYPE
    off = fastpath._offset
    plan.map_offsets = tuple(off(dt, n) for n in ("tma_q", "tma_k", "tma_v", "tma_do"))
    plan.offsets = tuple(off(dt, n) for n in _POINTERS)
    plan.error_offsets = off(dt, "error"), off(dt, "error_host")
    plan.deterministic = c.deterministic
    plan.dq_shape, plan.kv_shape = (total_q, H, D), (total_k, Hkv, D)
    plan.dtype, plan.device, plan.device_index = like.dtype, like.device, like.get_device()
    with _lock:
        if len(_plans) >= _MAX_PLANS:
            _plans.pop(next(iter(_plans)))
        _plans[key_] = plan


def backward(key_, do, q, k, v, out, lse):
    """``(dq, dk, dv)`` from the plan stored under ``key_``, or None (the caller takes the full path)."""
    plan = _plans.get(key_) if key_ is not None else None
    if plan is None or fastpath._ready_stream(plan.device_index) is None:
        return None
    errors.poll_errors()
    torch = fastpath._torch
    c = plan.c
    work = torch.empty((c.work_bytes,), dtype=torch.uint8, device=plan.device)
    dq = torch.empty(plan.dq_shape, dtype=plan.dtype, device=plan.device)
    dk = torch.empty(plan.kv_shape, dtype=plan.dtype, device=plan.device)
    dv = torch.empty(plan.kv_shape, dtype=plan.dtype, device=plan.device)
    base, off = work.data_ptr(), c.offsets
    values = (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), do.data_ptr(), lse.data_ptr(),
              base + off[0], base + off[1], base + off[2], base + off[3] if plan.deterministic else 0,
              dq.data_ptr(), dk.data_ptr(), dv.data_ptr())
    buf = bytearray(plan.template)
    for maps, o, ptr in zip(plan.maps, plan.map_offsets, values[:3] + values[4:5]):
        buf[o:o + 128] = maps.get(ptr)
    for o, value in zip(plan.offsets, values):
        struct.pack_into("<Q", buf, o, value)
    slot = errors._acquire_slot(plan.device_index)
    struct.pack_into("<Q", buf, plan.error_offsets[0], slot.dptr)
    struct.pack_into("<Q", buf, plan.error_offsets[1], slot.hdev)
    launchers.enqueue_backward(c, buf, values[10:13], plan.stream, slot=slot, call=plan.call,
                               launches=plan.launches)
    _stats["hits"] += 1
    if os.environ.get("CUPY_DASH_SYNC_ERRORS", "") not in ("", "0"):
        errors.check_errors()
    return dq, dk, dv


# ------------------------------------------------------------------------------------------------------------
# forward: no lengths on the host; cu_seqlens are patched in by address (their layout is in the signature)
# ------------------------------------------------------------------------------------------------------------
class _FwdPlan:
    __slots__ = ("func", "launch", "template", "maps", "map_offsets", "offsets", "out_shape", "lse_shape", "dtype",
                 "device", "device_index", "cu_infos")


_FWD_POINTERS = ("lse", "out", "cu_seqlens_q", "cu_seqlens_k")


def forward_key(q, k, v, cu_q, cu_k, max_q, max_k, causal, softmax_scale, window):
    """The varlen forward's signature, or None when the fast path cannot serve the call."""
    if not fastpath.enabled() or not all(fastpath.is_torch(x) for x in (q, k, v, cu_q, cu_k)) or \
            type(causal) is not bool or type(window) is not tuple or type(max_q) is not int or \
            type(max_k) is not int or (softmax_scale is not None and type(softmax_scale) is not float):
        return None
    sig = fastpath._sig
    ptrs = q.data_ptr() | k.data_ptr() | v.data_ptr() | cu_q.data_ptr() | cu_k.data_ptr()
    return (sig(q), sig(k), sig(v), sig(cu_q), sig(cu_k), max_q, max_k, causal, softmax_scale, window,
            not (ptrs & 15), cu_q is cu_k)


def register_forward(key_, spec, grid, block_m, block_n, p, operands, params, cu_infos, like) -> None:
    """Keep the plan of a varlen forward the full path has just launched (``params``: its packed block;
    ``cu_infos``: the TensorInfo of cu_seqlens_q and cu_seqlens_k, for the host copies of later calls)."""
    if key_ is None:
        return
    from . import jit
    total_q, total_k, H, Hkv, D = p.Sq, p.Sk, p.H, p.Hkv, p.D
    plan = _FwdPlan()
    plan.func = jit.load(spec).ptr
    gx, gy, gz = kernels._grid(grid)
    plan.launch = (gx, gy, gz, spec.threads, spec.smem_bytes)
    plan.template = params.tobytes()
    (_, q_stride), (_, k_stride), (_, v_stride) = operands
    maps = fastpath._Maps
    plan.maps = (maps(p.dtype, (1, total_q, H, D), q_stride, block_m, "q"),
                 maps(p.dtype, (1, total_k, Hkv, D), k_stride, block_n, "k"),
                 maps(p.dtype, (1, total_k, Hkv, D), v_stride, block_n, "v"),
                 maps(p.dtype, (1, total_q, H, D), launchers._contiguous((1, total_q, H, D)), 64, "out", 1))
    dt = kernels.FWD_PARAMS_DTYPE
    off = fastpath._offset
    plan.map_offsets = tuple(off(dt, n) for n in ("tma_q", "tma_k", "tma_v", "tma_o"))
    plan.offsets = tuple(off(dt, n) for n in _FWD_POINTERS)
    plan.out_shape, plan.lse_shape = (total_q, H, D), (H, total_q)
    plan.dtype, plan.device, plan.device_index = like.dtype, like.device, like.get_device()
    plan.cu_infos = cu_infos
    with _lock:
        if len(_fwd_plans) >= _MAX_PLANS * 8:
            _fwd_plans.pop(next(iter(_fwd_plans)))
        _fwd_plans[key_] = plan


def forward(key_, q, k, v, cu_q, cu_k):
    """``(out, lse)`` from the plan stored under ``key_``, or None (the caller takes the full path)."""
    plan = _fwd_plans.get(key_) if key_ is not None else None
    stream = fastpath._ready_stream(plan.device_index) if plan is not None else None
    if stream is None:
        return None
    errors.poll_errors()
    torch = fastpath._torch
    out = torch.empty(plan.out_shape, dtype=plan.dtype, device=plan.device)
    lse = torch.empty(plan.lse_shape, dtype=torch.float32, device=plan.device)
    out_ptr, cu_q_ptr, cu_k_ptr = out.data_ptr(), cu_q.data_ptr(), cu_k.data_ptr()
    buf = bytearray(plan.template)
    for maps, o, ptr in zip(plan.maps, plan.map_offsets, (q.data_ptr(), k.data_ptr(), v.data_ptr(), out_ptr)):
        buf[o:o + 128] = maps.get(ptr)
    for o, value in zip(plan.offsets, (lse.data_ptr(), out_ptr, cu_q_ptr, cu_k_ptr)):
        struct.pack_into("<Q", buf, o, value)
    gx, gy, gz, threads, smem = plan.launch
    _launch.launch(plan.func, gx, gy, gz, threads, smem, stream.ptr, buf)
    varlen_host_cu.remember(cu_q, plan.cu_infos[0], cu_q_ptr, stream)
    if cu_k is not cu_q:
        varlen_host_cu.remember(cu_k, plan.cu_infos[1], cu_k_ptr, stream)
    _stats["fwd_hits"] += 1
    return out, lse
