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
import threading

import numpy as np

from . import compact_device, fastpath, interop, varlen_device, varlen_host_cu

_MAX_PLANS = 8            # each holds its packing's device tables (up to a few MB)
_plans: dict = {}
_fwd_plans: dict = {}
_lock = threading.Lock()
_stats = {"hits": 0, "fwd_hits": 0}


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
            os.environ.get("CUPY_DASH_SPIN_TIMEOUT_MS"), os.environ.get(compact_device.ENV),
            os.environ.get(varlen_device.EXPAND_ENV))


def register(key_, c, operands, lse_ptr, work_base, grads, cu_ptrs, call, like, stream, keep) -> None:
    """Keep the plan of a varlen backward the full path has just launched (``c``: its BwdLaunch with tables;
    ``keep``: the device tables and cu_seqlens copies its block points at; current device: its device)."""
    if key_ is None:
        return
    p = c.p
    plan = fastpath.backward_plan(c, operands, lse_ptr, work_base, grads, call, like, (p.Sq, p.H, p.D),
                                  (p.Sk, p.Hkv, p.D), cu_seqlens=cu_ptrs)
    plan.stream, plan.keep = stream, keep
    with _lock:
        if len(_plans) >= _MAX_PLANS:
            _plans.pop(next(iter(_plans)))
        _plans[key_] = plan


def backward(key_, do, q, k, v, out, lse):
    """``(dq, dk, dv)`` from the plan stored under ``key_``, or None (the caller takes the full path)."""
    plan = _plans.get(key_) if key_ is not None else None
    if plan is None or fastpath._ready_stream(plan.device_index) is None:
        return None
    result = fastpath.run_backward(plan, plan.stream, do, q, k, v, out, lse)
    _stats["hits"] += 1
    return result


# ------------------------------------------------------------------------------------------------------------
# forward: no lengths on the host; cu_seqlens are patched in by address (their layout is in the signature)
# ------------------------------------------------------------------------------------------------------------
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
    plan = fastpath.forward_plan(spec, grid, block_m, block_n, p, operands, params, (p.Sq, p.H, p.D), (p.H, p.Sq),
                                 like, cu_infos)
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
    result = fastpath.run_forward(plan, stream, q, k, v, (cu_q, cu_k))
    varlen_host_cu.remember(cu_q, plan.cu_infos[0], cu_q.data_ptr(), stream)
    if cu_k is not cu_q:
        varlen_host_cu.remember(cu_k, plan.cu_infos[1], cu_k.data_ptr(), stream)
    _stats["fwd_hits"] += 1
    return result
