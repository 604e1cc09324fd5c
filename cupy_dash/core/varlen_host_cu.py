"""Host copies of device ``cu_seqlens`` taken by the varlen forward, for the backward of the same call (docs/api.md,
"Packed variable-length batches"): the forward enqueues an asynchronous copy into pinned host memory after the work
that produced them, and the backward, given the same tensors (as FlashAttention's users and autograd pass them),
takes it (waiting on its long-finished event) instead of copying and waiting for the stream.

NOTES: an entry serves a backward only at the forward's address, for a tensor of the same shape, strides, dtype
and torch version.
It holds the forward's storage (up to _MAX_HELD_BYTES), so the memory cannot be given to another tensor while the
entry lives: every tensor at that address is a view of it, and views share their version counter. Autograd's saved
tensors and compiled graphs hand the backward another object over the same memory, and under torch.compile the
forward's object dies when it returns: the weak reference that a larger storage gets then misses. The first lookup
waits for the copy's event; later ones, a CUDA graph capture among them, read without waiting. During capture
nothing is enqueued (a captured copy would run only at replay) and a copy not yet waited for misses. torch tensors
only (CuPy arrays have no version counter; JAX passes host lengths); writes other than through torch (DLPack, a raw
kernel) do not bump the version and are not seen.
"""
from __future__ import annotations

import collections
import threading
import weakref

import cupy
import cupyx
import numpy as np

from . import interop

_MAX_ENTRIES = 64
_MAX_HELD_BYTES = 1 << 20
_lock = threading.Lock()
_entries: "collections.OrderedDict" = collections.OrderedDict()
_stats = {"hits": 0, "misses": 0}


class _Entry:
    __slots__ = ("storage", "ref", "layout", "version", "host", "event", "lengths")


def _layout(cu) -> tuple:
    return tuple(cu.shape), cu.stride(), cu.dtype


def _serves(e, cu) -> bool:
    """Whether entry ``e`` (keyed by ``cu``'s address) holds the lengths of ``cu``: same shape, strides, dtype and
    version, and the forward's memory held by the entry or its tensor alive (a view at the same address in another
    layout, e.g. every other element, has other lengths)."""
    if e is None or cu.is_inference() or e.version != cu._version or e.layout != _layout(cu):
        return False
    if e.storage is not None:
        return True
    seen = e.ref()
    return seen is not None and seen._version == e.version


def remember(cu, info, ptr: int, stream) -> None:
    """Enqueue on ``stream`` (current device: the tensor's) a copy of the device int32 ``cu`` (``info``: its
    :class:`cupy_dash.core.interop.TensorInfo`, ``ptr`` its address) to pinned host memory, for :func:`lookup`."""
    if info.framework != "torch" or cu.is_inference():      # (an inference tensor has no version counter)
        return
    key = (ptr, info.device_id)
    with _lock:
        e = _entries.get(key)
    if _serves(e, cu):
        # this memory, unchanged since its copy was enqueued: the copy still holds.
        # NOTES: not taken again after a backward read it: a forward recomputed in the backward (activation
        # checkpointing) would then make that backward wait for the stream. So a buffer refilled by a write torch
        # does not count (.data, a kernel of another library, DLPack) keeps serving its last copy (docs/api.md)
        return
    if interop.capturing(cu):
        return
    e = _Entry()
    e.storage = e.ref = None
    try:
        storage = cu.untyped_storage()
        if storage.nbytes() <= _MAX_HELD_BYTES:
            e.storage = storage
        else:
            e.ref = weakref.ref(cu)
    except (AttributeError, TypeError):
        return
    e.layout, e.version, e.lengths = _layout(cu), cu._version, None
    e.host = cupyx.empty_pinned(info.shape[0], dtype=np.int32)
    rt = cupy.cuda.runtime
    rt.memcpyAsync(e.host.ctypes.data, ptr, e.host.nbytes, rt.memcpyDeviceToHost, stream.ptr)
    e.event = cupy.cuda.Event(block=False, disable_timing=True)
    e.event.record(stream)
    with _lock:
        _entries[key] = e
        _entries.move_to_end(key)
        while len(_entries) > _MAX_ENTRIES:
            _entries.popitem(last=False)


def remember_both(cu_q, cu_k, infos, ptrs, stream) -> None:
    """:func:`remember` of a varlen forward's cu_seqlens_q and cu_seqlens_k (``infos``, ``ptrs``: theirs), once
    when they are one tensor."""
    remember(cu_q, infos[0], ptrs[0], stream)
    if cu_k is not cu_q:
        remember(cu_k, infos[1], ptrs[1], stream)


def lookup(cu, info, ptr: int):
    """The host int64 copy of ``cu`` that a forward took (after waiting for it, the first time), or None when there
    is none for this address, shape and version, or when it was never waited for and the stream captures."""
    if info.framework != "torch":
        return None
    with _lock:
        e = _entries.get((ptr, info.device_id))
    if not _serves(e, cu):
        _stats["misses"] += 1
        return None
    if e.lengths is None:
        if interop.capturing(cu):
            _stats["misses"] += 1
            return None
        e.event.synchronize()
        e.lengths = e.host.astype(np.int64)
    _stats["hits"] += 1
    return e.lengths.copy()


def stats() -> dict:
    return dict(_stats)


def clear() -> None:
    with _lock:
        _entries.clear()
