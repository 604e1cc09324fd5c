"""Schedule tables on the GPU: the one cache of the device-resident tables of every form (LRU per form and device),
the one upload (one copy on the caller's stream; fixed-length tables waited for once, when made) and the one eviction
rule (freed after the work of every stream that read them, never while a CUDA graph may use them). The form is
:func:`cupy_dash.schedule.compact_device.table_form`'s. docs/architecture.md, "Schedule tables on the device".
"""
from __future__ import annotations

import collections
import functools
import threading

import cupy
import cupyx
import numpy as np

from .. import schedule
from ..schedule import compact_device, pieces
from .errors import keep_alive, stream_device

_LIMITS = {"visits": 64, "compact": 8, "varlen": 16}   # tables kept per form and device (LRU)
_lock = threading.RLock()
_caches = {form: collections.OrderedDict() for form in _LIMITS}  # (key, device) -> entry (cached's NOTES)
_captured: dict = {}       # entries used by a CUDA graph capture: never freed
_MAX_PLANS = 256           # host-side per-visit plans kept (LRU)
_plans: collections.OrderedDict = collections.OrderedDict()


def cached(form, key, device_id, stream, make, *, done=False, capture=False):
    """``(tables, extra, event)`` of the tables cached under ``(key, device_id)`` in ``form``'s LRU, made on a
    miss by ``make(stream, staging)`` -> ``(tables, extra)`` with ``device_id`` current (uploads enqueued on
    ``stream``, a stream of that device; host buffers the copies read appended to ``staging``, kept alive until
    they finish). ``done``: ``make`` is waited for here (``stream.synchronize()``), so no call ever waits for an
    event. ``event``: what ``stream`` waits for before reading the tables, or None (after a miss, on the
    uploading stream, or when done). ``capture``: ``stream`` is capturing a CUDA graph: never makes anything,
    returns ``(None, None, None)`` on a miss, and keeps the tables found for the life of the process.

    NOTES: the LRU bound counts the entries of one device (a JAX mesh uploads each packing to every device), so
    an entry is only ever evicted by a miss on its own device, and released after that device's streams (keyed
    by (device, handle): every device's default stream has handle 0)."""
    ckey, cache = (key, device_id), _caches[form]
    with cupy.cuda.Device(device_id), _lock:
        entry = cache.get(ckey)
        if entry is not None:
            cache.move_to_end(ckey)
        else:
            entry = _captured.get(ckey)          # evicted from the LRU, kept alive for a graph
        if capture:
            if entry is None:
                return None, None, None
            _captured[ckey] = entry
            return entry[0], entry[1], None
        if entry is not None:
            entry[4][stream.ptr] = stream
            return entry[0], entry[1], _upload_event(entry, stream)
    staging = []
    with cupy.cuda.Device(device_id):
        tables, extra = make(stream, staging)
        if done:
            stream.synchronize()
            staging = []
        # NOTES: an entry is [tables, extra, uploading stream (None: done), event or None, {stream handle: stream}
        # of the calls that read it, all on its device]: the event is recorded only when a call on another stream
        # first finds the entry (_upload_event); a training loop on one stream records none.
        entry = [tables, extra, None if done else stream, None, {stream.ptr: stream}]
        with _lock:
            found = cache.get(ckey)
            if found is not None:            # made meanwhile by another thread: the one kept (a capture may hold it)
                cache.move_to_end(ckey)
                found[4][stream.ptr] = stream
                tables, extra, event, evicted = found[0], found[1], _upload_event(found, stream), [entry]
            else:
                cache[ckey], event = entry, None
                mine = [k for k in cache if k[1] == device_id]             # oldest first
                evicted = [cache.pop(k) for k in mine[:len(mine) - _LIMITS[form]]]
        for old in evicted:
            _release_after(old, old[4].values(), stream, staging)
        if staging or not done:                      # varlen: every miss counts (_defer_release)
            _defer_release(staging, stream, device_id)
    return tables, extra, event                  # a new entry: enqueued on ``stream``, nothing to wait for there


def _upload_event(entry, stream):
    """What ``stream`` waits for before reading the cached ``entry``'s tables: None when done or on the stream
    that uploaded them, else an event recorded on the uploading stream (once, at the first such call: it may also
    cover work enqueued there after the upload, which only makes the wait longer, never too short). Called under
    _lock, with the entry's device current."""
    if entry[2] is None or entry[2].ptr == stream.ptr:
        return None
    if entry[3] is None:
        event = cupy.cuda.Event(block=False, disable_timing=True)
        event.record(entry[2])
        entry[3] = event
    return entry[3]


def fixed(compact_tables, policy, seqlen_q, seqlen_k, block_m, block_n, num_heads, causal, num_ctas, device_id,
          stream, group_size=1, window=(-1, -1), capture=False, head_section=0, split=0):
    """The tables of one fixed-length problem on one device (num_heads = B * H query heads, group_size = H // Hkv,
    window (left, right) in schedule.canonical_window form): per-visit :class:`DeviceTables` (host plans cached
    here by shape and window, LRU), or with ``compact_tables`` the compact_device.CompactDeviceTables of
    :func:`cupy_dash.schedule.build_compact`'s records (host plans cached there; ``"auto"`` is
    compact_device.KERNEL_AUTO). Device tables are cached by ``(plan.key, device)`` (:func:`cached`, done: a miss
    synchronizes ``stream`` once; later calls may use them on any stream). ``capture``: as :func:`cached`.
    ``head_section``: as :func:`cupy_dash.schedule.build`'s. ``split``: per-visit tables only, the pieces per split
    column of :func:`cupy_dash.schedule.pieces.split_for_kernel` (0: the table as built)."""
    args = dict(seqlen_q=seqlen_q, seqlen_k=seqlen_k, block_m=block_m, block_n=block_n, num_heads=num_heads,
                causal=causal, num_sms=num_ctas, group_size=group_size, window=tuple(window),
                head_section=head_section)
    if compact_tables:
        plan = schedule.build_compact(compact_device.auto_policy(True) if policy == "auto" else policy, **args)
        return cached("compact", plan.key, device_id, stream, lambda stream, staging: (
            upload_compact(plan, device_id, stream, wait=True), None), done=True, capture=capture)[0]
    pkey = (policy, *args.values(), split)
    with _lock:
        plan = _plans.get(pkey)
    if plan is None:                               # outside the lock: other devices' threads go on meanwhile
        plan = pieces.split_for_kernel(schedule.build(policy, **args), split)
    with _lock:
        _plans[pkey] = plan
        _plans.move_to_end(pkey)
        if len(_plans) > _MAX_PLANS:
            _plans.popitem(last=False)
    return cached("visits", plan.key, device_id, stream, lambda stream, staging: (
        upload(plan, num_heads, plan.num_n_blocks, plan.num_m_blocks, device_id, stream, wait=True), None),
        done=True, capture=capture)[0]


per_visit, compact = functools.partial(fixed, False), functools.partial(fixed, True)


class DeviceTables:
    """A per-visit table on one device: ``visits`` (V, 4) int32, ``rank`` (V,) int32, ``cta_start``
    (num_ctas + 1,) int64 CuPy arrays (views of one allocation), plus ``num_ctas``, ``policy`` and ``device_id``;
    ``plans``: the launch plans that read them (:mod:`cupy_dash.cuda.plans`), dropped with them; ``pieces``: None, or
    a table's split columns (:class:`cupy_dash.schedule.pieces.Pieces` with its two arrays on the device)."""
    __slots__ = ("visits", "rank", "cta_start", "num_ctas", "policy", "device_id", "plans", "pieces")


def upload(plan, num_heads: int, n_blocks: int, m_blocks: int, device_id: int, stream, wait=False,
           checked=None) -> DeviceTables:
    """The plan's tables (checked by :func:`cupy_dash.schedule.check_plan`, unless ``checked`` is what that returned
    for them) on device ``device_id`` (whatever the current device is), copied on ``stream`` (:func:`upload_async`;
    ``wait``: the caller synchronizes it)."""
    if checked is None:
        checked = schedule.check_plan(plan, num_heads, n_blocks, m_blocks)
    visits, rank, cta_start, num_ctas = checked
    split = pieces.check_arrays(plan, np.diff(cta_start))
    t = DeviceTables()
    t.pieces = None
    with cupy.cuda.Device(device_id):
        if split is None:
            t.visits, t.rank, t.cta_start = upload_async((visits, rank, cta_start), stream, wait)
        else:
            t.visits, t.rank, t.cta_start, cta_pieces, piece_code = upload_async(
                (visits, rank, cta_start, *split[:2]), stream, wait)
            t.pieces = pieces.Pieces(cta_pieces, piece_code, *split[2:])
    t.num_ctas, t.policy, t.device_id = num_ctas, str(getattr(plan, "policy", "custom")), device_id
    return t


def upload_compact(plan, device_id: int, stream, wait=False):
    """:func:`cupy_dash.schedule.compact_device.device_arrays` of ``plan`` as a
    :class:`cupy_dash.schedule.compact_device.CompactDeviceTables` on device ``device_id`` (whatever the current
    device is), copied on ``stream`` as :func:`upload`."""
    arrays = compact_device.device_arrays(plan)
    t = compact_device.CompactDeviceTables()
    names = [k for k, v in arrays.items() if isinstance(v, np.ndarray)]
    with cupy.cuda.Device(device_id):
        uploaded = dict(zip(names, upload_async([arrays[k] for k in names], stream, wait)))
    for name, value in arrays.items():
        setattr(t, name, uploaded.get(name, value))
    t.nbytes = sum(a.nbytes for a in uploaded.values())
    t.num_ctas, t.policy, t.device_id = int(plan.num_ctas), str(plan.policy), device_id
    return t


def upload_async(arrays, stream, wait=False):
    """Device copies of host ``arrays`` (views of one device buffer, each 256-byte aligned), enqueued on ``stream``
    as one copy from one pinned staging buffer (kept alive until the copy finishes): unlike copies from pageable
    memory, this neither blocks the host nor waits for the stream. ``wait``: the caller synchronizes ``stream``
    next, so the copy is from pageable memory into an allocation of the exact size (:func:`_upload`)."""
    offsets, total = [], 0
    for a in arrays:
        offsets.append(total)
        total += -(-a.nbytes // 256) * 256
    staging = []
    mem, _ = _upload(list(zip(arrays, offsets)), total, 0, stream, staging, wait=wait)
    if not wait:
        keep_alive(staging, stream)
    buf = cupy.ndarray((max(total, 1),), dtype=cupy.uint8, memptr=mem)
    return [buf[off:off + a.nbytes].view(a.dtype).reshape(a.shape) for a, off in zip(arrays, offsets)]


def _upload(pieces, nbytes: int, extra_bytes: int, stream, staging_out: list, pinned: bool = False,
            wait: bool = False):
    """(buffer, head): a CuPy device allocation (MemoryPointer) of ``head`` (``nbytes`` rounded up to 256 bytes) +
    ``extra_bytes`` bytes whose first ``nbytes`` are the host ``pieces`` ((array, byte offset) pairs), enqueued on
    ``stream`` as one copy from pinned memory (no wait): from the one piece itself when ``pinned`` (a blob of
    :func:`_pinned_blob`), else through pinned staging. The host buffer copied from is appended to
    ``staging_out``: the caller keeps it alive until the copy has finished. ``wait`` (the caller synchronizes
    ``stream`` next): pageable staging and an allocation of the exact size (:func:`_device_bytes` is for tables
    made at every step; a fixed-length table is made once, and may be large)."""
    head = -(-nbytes // 256) * 256
    if pinned:
        (staging, _), = pieces
    else:
        staging = np.empty(nbytes, np.uint8) if wait else cupyx.empty_pinned(_pow2(nbytes), dtype=np.uint8)
        for a, off in pieces:
            if a.dtype == np.uint8 and a.flags.c_contiguous:          # a blob of varlen_pack.pack
                staging[off:off + a.nbytes] = a
            else:
                staging[off:off + a.nbytes] = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    size = max(head + extra_bytes, 1) if wait else _device_bytes(head + extra_bytes)
    buf = cupy.cuda.alloc(size)       # no ndarray: only the address is read
    cupy.cuda.runtime.memcpyAsync(buf.ptr, staging.ctypes.data, nbytes, cupy.cuda.runtime.memcpyHostToDevice,
                                  stream.ptr)
    staging_out.append(staging)
    return buf, head


def _pow2(nbytes: int) -> int:
    # NOTES: pinned buffers have power-of-two sizes, for CuPy's pool to reuse (docs/architecture.md)
    return 1 << max(nbytes - 1, 0).bit_length()


_POW2_DEVICE_MAX = 16 << 20


def _device_bytes(nbytes: int) -> int:
    """The size of a new packing's device allocation: a power of two up to _POW2_DEVICE_MAX bytes (CuPy's pool then
    finds an evicted table's block of the same size), exact above (long sequences' tables, built rarely)."""
    nbytes = max(nbytes, 1)
    return _pow2(nbytes) if nbytes <= _POW2_DEVICE_MAX else nbytes


_PINNED_BLOB_MAX = 1 << 20      # larger blobs (long sequences: cached, rarely new) stay pageable
_pinned_ok = [True]


def _pins(nbytes: int) -> bool:
    """Whether :func:`_pinned_blob` gives a blob of ``nbytes`` pinned memory."""
    return nbytes <= _PINNED_BLOB_MAX and _pinned_ok[0]


def _pinned_blob(nbytes: int):
    """A writable uint8 host array of at least ``nbytes`` for varlen_pack.pack to pack a new packing into: pinned
    (the upload then copies from it directly) up to _PINNED_BLOB_MAX bytes, else, or where pinned memory cannot be
    had (no CUDA driver: CPU tests of the GPU paths), pageable (the upload stages it)."""
    if _pins(nbytes):
        size = _pow2(nbytes)
        try:
            return np.ndarray((size,), dtype=np.uint8, buffer=cupy.cuda.alloc_pinned_memory(size))
        except cupy.cuda.runtime.CUDARuntimeError:
            _pinned_ok[0] = False
    return np.empty(nbytes, dtype=np.uint8)


_DEFER_MISSES = 4
_deferred: dict = {}       # (device, stream handle) -> [stream, objects to free after its work so far]
_deferred_misses = [0]


def _defer_release(objs, stream, device_id: int) -> None:
    """Keep ``objs`` (a new packing's pinned blob, cache entries it evicted) alive until the work enqueued on
    ``stream`` (of device ``device_id``) so far has finished: every held list goes to errors.keep_alive (one event
    per stream) at every _DEFER_MISSES-th miss of any stream, however many streams there are
    (prepare_varlen_backward may use its own).
    NOTES: held until an event recorded at a later miss completes: later than needed, never earlier (stream order).
    Each list is flushed with its device current: a default stream (handle 0, CuPy's device_id -1) is that of the
    current device."""
    with _lock:
        held = _deferred.get((device_id, stream.ptr))
        if held is None:
            held = _deferred[(device_id, stream.ptr)] = [stream, []]
        held[1].extend(objs)
        _deferred_misses[0] += 1
        if _deferred_misses[0] < _DEFER_MISSES:
            return
        flush = list(_deferred.items())
        _deferred.clear()
        _deferred_misses[0] = 0
    for (dev, ptr), (s, keep) in flush:
        if not keep:
            continue
        with cupy.cuda.Device(dev):
            if _capturing(s):      # no event on a capturing stream: held to a later flush
                with _lock:
                    _deferred.setdefault((dev, ptr), [s, []])[1].extend(keep)
                continue
            try:
                keep_alive(keep, s)
            except cupy.cuda.runtime.CUDARuntimeError:     # the stream is gone: wait for its device instead
                _synchronize(s)


def release_after(obj, streams, device_id: int) -> None:
    """Keep ``obj`` (e.g. a dropped launch plan holding tables) alive until the work enqueued so far on every stream
    in ``streams`` (of device ``device_id``) has finished, as an evicted cache entry is (:func:`_release_after`)."""
    with cupy.cuda.Device(device_id):
        _release_after(obj, streams, None, [])


def _release_after(entry, streams, stream, deferred: list) -> None:
    """Free an evicted cache ``entry`` once the work enqueued so far on every stream that used it has finished
    (on ``stream``, the caller's, if any: appended to ``deferred``, for :func:`_defer_release`): an event per other
    stream (errors.keep_alive), never a host wait; none on a stream capturing a CUDA graph (the entry is then kept
    for the life of the process); a device synchronize where one cannot be recorded (a destroyed stream). Called
    with the entry's device current: the caller's (an entry is evicted by a miss on its own device only).
    NOTES: a packed batch with new lengths evicts an entry at every training step."""
    for s in streams:
        try:
            if stream is not None and s.ptr == stream.ptr:
                deferred.append(entry)
            elif _capturing(s):   # made during a capture (capture.outside): no event on the capturing stream
                _captured[("evicted", id(entry))] = entry
            else:
                keep_alive([entry], s)
        except cupy.cuda.runtime.CUDARuntimeError:
            _synchronize(s)


def _capturing(stream) -> bool:
    """Whether ``stream`` is capturing a CUDA graph (False for a stream destroyed since: the callers handle it)."""
    try:
        return bool(cupy.cuda.runtime.streamIsCapturing(stream.ptr))
    except cupy.cuda.runtime.CUDARuntimeError:
        return False


def _synchronize(stream) -> None:
    """Wait for all work of ``stream``'s device (a stream destroyed since it was used: its device still runs)."""
    with cupy.cuda.Device(stream_device(stream)):
        cupy.cuda.runtime.deviceSynchronize()
