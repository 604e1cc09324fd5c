"""Host fast paths of repeated varlen calls with torch tensors or CuPy arrays (:mod:`cupy_dash.core.fastpath`).

A backward whose signature, lengths and stream match a full-path call re-launches its launch plan (whose block
points at the device table and cu_seqlens copies the plan keeps alive; dk, dv zeroed first, as in every varlen
backward). Same signature, new lengths (the next step's packing): that plan is the *template* of those tensors; the
lengths are checked as the full path checks them, the packing's table is built and uploaded and the plan's
length-dependent fields patched (fastpath.rebased_plan), without validating the tensors again or encoding TMA maps.
The forward needs no lengths (its kernel reads cu_seqlens): its signature holds their layouts, their addresses are
patched per call.

NOTES: the signature holds what fastpath's does (tensors, 16-byte alignment of all six addresses, arguments by type
and value, config.fingerprint), the caller's stream (the table's upload was ordered before the full call's kernels
on that stream only) and the lengths: host cu_seqlens by dtype and bytes (checked when the plan was made), device
torch ones through the forward's host copy (:mod:`cupy_dash.core.varlen_host_cu`; without one, or CuPy device
lengths: no fast path). So a call that would fail a check never matches.
"""
from __future__ import annotations

import cupy
import numpy as np

from .. import config
from . import fastpath, interop, varlen_host_cu, varlen_launch

_MAX_PLANS = 8            # each holds its packing's device tables (up to a few MB)
_plans: dict = {}
_fwd_plans: dict = {}
_templates: dict = {}     # signature without the lengths -> {(block_m, block_n): a plan of those tensors}
_stats = {"hits": 0, "fwd_hits": 0, "new_packing_hits": 0}


def stats() -> dict:
    return dict(_stats)


def clear() -> None:
    with fastpath._lock:
        _plans.clear()
        _fwd_plans.clear()
        _templates.clear()


def _host_lengths(cu, device_index):
    """(form, host array) of a cu_seqlens argument (form: the host dtype, or "device" for a torch device tensor
    whose forward left a host copy, :mod:`cupy_dash.core.varlen_host_cu`), or None when not known without a copy."""
    if type(cu) in (np.ndarray, list, tuple):
        host = np.asarray(cu)                   # a list's element types show in the dtype (1.0 is not 1)
        return host.dtype.str, host
    if not fastpath.is_torch(cu):
        return None
    if not cu.is_cuda:
        return (str(cu.dtype), cu.numpy()) if cu.dim() == 1 else None
    if cu.get_device() != device_index:
        return None
    host = varlen_host_cu.lookup(cu, _DeviceCu(device_index), cu.data_ptr())
    return None if host is None else ("device", host)


def _lengths_key(cu, device_index):
    """Hashable lengths of a cu_seqlens argument (form, shape, bytes), or None (:func:`_host_lengths`)."""
    found = _host_lengths(cu, device_index)
    return None if found is None else (found[0], found[1].shape, found[1].tobytes())


class _DeviceCu:
    """What varlen_host_cu.lookup reads of a torch device cu_seqlens' description."""
    __slots__ = ("device_id",)
    framework = "torch"

    def __init__(self, device_id):
        self.device_id = device_id


def key(do, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, causal, softmax_scale, window, schedule, deterministic,
        softcap=0.0):
    """The varlen backward's signature (module docstring), or None when the fast path cannot serve the call."""
    if not fastpath.enabled() or type(causal) is not bool or type(deterministic) is not bool or \
            not fastpath.int_pair(window) or type(schedule) is not str or type(max_q) is not int or \
            type(max_k) is not int or (softmax_scale is not None and type(softmax_scale) is not float) or \
            type(softcap) not in fastpath.NUMBERS:
        return None
    if all(fastpath.is_torch(x) for x in (do, q, k, v, out, lse)) and q.is_cuda:
        dev, sig = q.get_device(), fastpath._sig
        ptrs = do.data_ptr() | q.data_ptr() | k.data_ptr() | v.data_ptr() | out.data_ptr() | lse.data_ptr()
        stream = interop._torch_stream_ptr(dev)
    elif all(fastpath.is_cupy(x) for x in (do, q, k, v, out, lse)):
        dev, sig = q.device.id, fastpath._cupy_sig
        ptrs = do.data.ptr | q.data.ptr | k.data.ptr | v.data.ptr | out.data.ptr | lse.data.ptr
        stream = cupy.cuda.get_current_stream(dev).ptr
    else:
        return None
    lens = _lengths_key(cu_q, dev), _lengths_key(cu_k, dev)
    if lens[0] is None or lens[1] is None:
        return None
    return (sig(do), sig(q), sig(k), sig(v), sig(out), sig(lse), lens, max_q, max_k, causal, softmax_scale, window,
            schedule, deterministic, not (ptrs & 15), stream, config.fingerprint(), softcap)


def _template_key(key_):
    """The signature without the lengths (their forms kept) and without max_seqlen_q / max_seqlen_k (they follow
    the packing): what a new packing of the same tensors shares."""
    lens = key_[6]
    return key_[:6] + ((lens[0][0], lens[1][0]),) + key_[9:]


def register(key_, c, call, like, stream, keep) -> None:
    """Keep the plan of a varlen backward the full path has just launched (``c``: its BwdLaunch with tables and
    launch plan; ``keep``: the device tables and cu_seqlens copies its block points at; current device: its
    device), under its signature and, as the template of new packings of its tile, under the signature without the
    lengths."""
    if key_ is None:
        return
    p = c.p
    plan = fastpath.backward_plan(c, call, like, ((p.Sq, p.H, p.D), (p.Sk, p.Hkv, p.D), (p.Sk, p.Hkv, p.Dv)))
    plan.stream, plan.keep = stream, keep
    _store(key_, plan)
    tkey = _template_key(key_)
    fastpath.store(_templates, tkey, {**_templates.get(tkey, {}), (c.block_m, c.block_n): plan}, _MAX_PLANS)


def _store(key_, plan) -> None:
    fastpath.store(_plans, key_, plan, _MAX_PLANS)


def backward(key_, do, q, k, v, out, lse, cu_q=None, cu_k=None):
    """``(dq, dk, dv)`` from the plan stored under ``key_``, or from a template of the same tensors with other
    lengths (:func:`_new_packing`, given ``cu_q`` and ``cu_k``), or None (the caller takes the full path). A plan
    launches on the stream its table was uploaded for (the signature holds it)."""
    if key_ is None:
        return None
    plan = _plans.get(key_)
    if plan is None:
        bases = _templates.get(_template_key(key_)) if cu_q is not None else None
        if not bases or fastpath._ready_stream(next(iter(bases.values()))) is None:
            return None
        plan = _new_packing(key_, bases, cu_q, cu_k)
        if plan is None:
            return None
        _stats["new_packing_hits"] += 1
    elif fastpath._ready_stream(plan) is None:
        return None
    result = fastpath.run_backward(plan, plan.stream, do, q, k, v, out, lse)
    _stats["hits"] += 1
    return result


def _new_packing(key_, bases, cu_q, cu_k):
    """The plan of a call whose tensors, flags and stream are those of the templates ``bases`` (per tile) but whose
    lengths are new: the lengths checked as the full path checks them (ValueError before anything is enqueued), the
    packing's launch made as the full path makes it (varlen_launch.packing_launch), the launch plan of the template of
    its tile (the longest sequence picks it, kernels.varlen_tile_seqlen; the TMA boxes are the tile's) with this
    packing's table, lengths and scratch layout (fastpath.rebased_plan; TMA maps reused: same tensors); kept under
    ``key_`` for the packing's later calls. None where the full path must run (no visits, no template of its tile
    yet, or a window that the new max_seqlen_q / max_seqlen_k make canonical otherwise than the templates')."""
    from ..schedule import canonical_window
    base = next(iter(bases.values()))            # the tensors, flags and stream: the same in every template
    c0, dev = base.c, base.device_index
    p = c0.p
    max_q, max_k, window, schedule = key_[7], key_[8], key_[11], key_[12]
    max_q = varlen_launch.check_max_seqlen("max_seqlen_q", max_q)
    max_k = varlen_launch.check_max_seqlen("max_seqlen_k", max_k)
    varlen_launch.check_max_within(max_q, max_k, p.Sq, p.Sk)
    cu_host = varlen_launch.checked_cu_seqlens(*(_host_lengths(cu, dev)[1] for cu in (cu_q, cu_k)), p.Sq, p.Sk,
                                               max_q, max_k)
    if canonical_window(window, max_q, max_k, c0.causal) != c0.window:
        return None
    with cupy.cuda.Device(dev):
        c, cu_dev, call = varlen_launch.packing_launch(dev, p, c0.causal, c0.deterministic, schedule, c0.window,
                                                       c0.spin_timeout_ns, cu_host, max_q, base.stream)
        base = None if c is None else bases.get((c.block_m, c.block_n))
        if base is None or base.c.window != c.window:  # no sequence sees a key (the full path writes zeros), no
            return None                                # template of this tile yet, or one of another window
        plan = fastpath.rebased_plan(base, c, call, (cu_dev[0].data.ptr, cu_dev[1].data.ptr))
    plan.keep = (c.tables, *cu_dev)
    _store(key_, plan)
    return plan


# ------------------------------------------------------------------------------------------------------------
# forward: no lengths on the host; cu_seqlens are patched in by address (their layout is in the signature)
# ------------------------------------------------------------------------------------------------------------
def forward_key(q, k, v, cu_q, cu_k, max_q, max_k, causal, softmax_scale, window, softcap=0.0):
    """The varlen forward's signature, or None when the fast path cannot serve the call."""
    if not fastpath.enabled() or type(causal) is not bool or not fastpath.int_pair(window) or \
            type(max_q) is not int or type(max_k) is not int or \
            (softmax_scale is not None and type(softmax_scale) is not float) or type(softcap) not in fastpath.NUMBERS:
        return None
    if all(fastpath.is_torch(x) for x in (q, k, v, cu_q, cu_k)):
        sig, ptrs = fastpath._sig, q.data_ptr() | k.data_ptr() | v.data_ptr() | cu_q.data_ptr() | cu_k.data_ptr()
    elif all(fastpath.is_cupy(x) for x in (q, k, v, cu_q, cu_k)):
        sig, ptrs = fastpath._cupy_sig, q.data.ptr | k.data.ptr | v.data.ptr | cu_q.data.ptr | cu_k.data.ptr
    else:
        return None
    return (sig(q), sig(k), sig(v), sig(cu_q), sig(cu_k), max_q, max_k, causal, softmax_scale, window,
            not (ptrs & 15), cu_q is cu_k, softcap)


def register_forward(key_, launch, shapes, like, cu_infos) -> None:
    """Keep the plan of a varlen forward the full path has just launched (``launch``: its launch plan;
    ``cu_infos``: the TensorInfo of cu_seqlens_q and cu_seqlens_k, for the host copies of later calls)."""
    fastpath.register_forward(key_, launch, shapes, like, cu_infos, _fwd_plans, _MAX_PLANS * 8)


def _run_forward(plan, stream, q, k, v, cu_q, cu_k):
    result = fastpath.run_forward(plan, stream, q, k, v, (cu_q, cu_k))
    if not plan.cupy:                    # (host copies of torch tensors only: varlen_host_cu)
        varlen_host_cu.remember_both(cu_q, cu_k, plan.cu_infos, (cu_q.data_ptr(), cu_k.data_ptr()), stream)
    return result


def forward(key_, q, k, v, cu_q, cu_k):
    """``(out, lse)`` from the plan stored under ``key_``, or None (the caller takes the full path)."""
    return fastpath.serve(_fwd_plans, key_, _stats, "fwd_hits", _run_forward, q, k, v, cu_q, cu_k)
