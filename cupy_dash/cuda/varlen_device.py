"""The varlen backward's schedule tables: built from the lengths and cached per packing (:func:`plan`), then on the
device (:func:`device`) as per-visit rows expanded on the GPU (the default), expanded on the host
(``CUPY_DASH_VARLEN_EXPAND=host``), or compact records, uploaded without blocking; the kernels read the
cu_seqlens uploaded with them. docs/architecture.md, "Schedule tables on the device"; docs/decisions/table-forms.md.
"""
from __future__ import annotations

import collections
import math
import threading

import cupy
import numpy as np

from .. import config
from . import device_tables as _dt
from .. import schedule as _schedule
from ..schedule import varlen as varlen_schedule
from ..schedule import varlen_pack

_MAX_PLANS = 32
_plans: "collections.OrderedDict" = collections.OrderedDict()
_plans_lock = threading.Lock()


class Tables:
    """A varlen schedule on the host: the per-visit table (varlen_schedule.expand) as
    :func:`cupy_dash.schedule.check_plan` takes it, or (``compact``: (tie_sign, rank_rule)) the compact records
    packed in the byte layout uploaded (``blob``, ``offsets`` of varlen_pack.NAMES, ``arrays``: views of its
    compact arrays); its key (policy, lengths, tiles, heads, mask, CTAs, form), ``num_visits``
    and the lengths as cu_seqlens (``cu_q``, ``cu_k``; for the compact forms, views of ``blob``, as ``cta_start``
    for the GPU expansion); ``pinned``: ``blob`` lies in pinned host memory (uploaded without staging)."""
    __slots__ = ("visits", "rank", "_cta_start", "num_ctas", "policy", "group_size", "n_blocks", "m_blocks", "key",
                 "_cu_q", "_cu_k", "compact", "num_visits", "expand", "heads", "kv_heads", "blob", "offsets",
                 "shapes", "pinned")

    def _view(self, i):
        off, dtype = int(self.offsets[i]), varlen_pack.DTYPES[i]
        return self.blob[off:off + math.prod(self.shapes[i]) * dtype().itemsize].view(dtype).reshape(self.shapes[i])

    @property
    def cu_q(self):
        return self._cu_q if self.compact is None else self._view(_CU_Q)

    @property
    def cu_k(self):
        return self._cu_k if self.compact is None else self._view(_CU_K)

    @property
    def cta_start(self):
        """int64 (num_ctas + 1,): each CTA's first row of the per-visit table (None for compact records read as
        they are)."""
        if self.compact is None or not self.expand:
            return self._cta_start
        return self._view(_CTA_START)

    @property
    def arrays(self) -> dict:
        """The compact arrays by BwdParams field (the first _NUM_RECORD_ARRAYS of varlen_pack.NAMES), views of
        ``blob``."""
        return {name: self._view(i) for i, name in enumerate(varlen_pack.NAMES[:_NUM_RECORD_ARRAYS])}


_NUM_RECORD_ARRAYS = 7          # varlen_pack.NAMES: the compact arrays, then cta_start, cu_seqlens_q / _k
_CTA_START, _CU_Q, _CU_K = 7, 8, 9


class NamedTables:
    """Varlen tables on one device that name their BwdParams fields: a per-visit table written on the GPU from
    compact records (:func:`_expand_on_device`; ``ptrs``: the device addresses of visits (V, 4) int32, rank (V,)
    int32, cta_start (num_ctas + 1,) int64 inside ``buffer``, the CuPy allocation holding them and the records), or
    compact records read as they are (``ptrs``: the device address by BwdParams field of the compact arrays of
    :attr:`Tables.arrays`, and the scalars ``tie_sign``, ``rank_rule``); ``num_ctas``, ``policy``; ``plans``: as
    :class:`cupy_dash.cuda.device_tables.DeviceTables`'."""
    __slots__ = ("ptrs", "buffer", "num_ctas", "policy", "device_id", "plans")

    def params(self) -> dict:
        """The BwdParams fields these tables set (addresses and scalars; launchers.bwd_params nulls the rest)."""
        return self.ptrs


EXPAND_ENV = config.VARLEN_EXPAND.name   # "host": per-visit tables expanded on the host, not the GPU (default)


def device(t: Tables, num_heads, dev, stream, capture=False, done=False):
    """(tables, cu_seqlens_q, cu_seqlens_k, event) of ``t`` on device ``dev``: :class:`NamedTables` (expanded on
    the GPU or compact records) or (expanded on the host) ``device_tables.DeviceTables``, cached (LRU,
    :func:`cupy_dash.cuda.device_tables.cached`) so that a repeated packing uploads nothing; a miss enqueues the
    uploads on ``stream`` (no wait; ``done``: waited for, so that no later call needs an event of it). ``event``,
    ``capture``: as ``device_tables.cached``'s (a miss during capture:
    ``(None, None, None, None)``, nothing uploaded or expanded). The device cu_seqlens are the lengths the table was
    built from: CuPy arrays for per-visit tables, :class:`DeviceRef` for the compact forms (read by ``.data.ptr``
    alike). ``stream`` is a stream of ``dev``; allocations, copies, events and the expansion kernel go to ``dev``
    whatever the current device is."""
    def make(stream, staging):
        if t.expand:
            d, cu_q, cu_k = _expand_on_device(t, dev, stream, staging)
        elif t.compact:
            buf, _ = _dt._upload([(t.blob, 0)], t.blob.nbytes, 0, stream, staging, t.pinned)
            d = NamedTables()
            d.ptrs = dict(_record_ptrs(t, buf.ptr), tie_sign=int(t.compact[0]), rank_rule=int(t.compact[1]))
            d.buffer, d.num_ctas = buf, t.num_ctas
            cu_q, cu_k = _device_view(buf, t, _CU_Q), _device_view(buf, t, _CU_K)
        else:
            visits, rank, cta_start, num_ctas = _schedule.check_plan(t, num_heads, t.n_blocks, t.m_blocks)
            d = _dt.DeviceTables()
            d.visits, d.rank, d.cta_start, cu_q, cu_k = _dt.upload_async((visits, rank, cta_start, t.cu_q, t.cu_k),
                                                                         stream)
            d.num_ctas = num_ctas
        d.policy, d.device_id = t.policy, dev
        return d, (cu_q, cu_k)
    d, cu, event = _dt.cached("varlen", t.key, dev, stream, make, done=done, capture=capture)
    if d is None:                                   # a miss during capture: nothing made
        return None, None, None, None
    return d, cu[0], cu[1], event


def _record_ptrs(t: Tables, base: int) -> dict:
    """Device address by BwdParams field of the compact arrays of ``t.blob`` copied to ``base``."""
    return {name: base + int(t.offsets[i]) for i, name in enumerate(varlen_pack.NAMES[:_NUM_RECORD_ARRAYS])}


def _device_view(buf, t: Tables, i: int):
    """The device address of varlen_pack.NAMES[i] in ``buf`` (``t.blob`` copied to its head), as a
    :class:`DeviceRef`."""
    ref = DeviceRef()
    ref.data = buf + int(t.offsets[i])
    return ref


class DeviceRef:
    """An array's place inside a CuPy allocation: ``data``, a cupy MemoryPointer (``data.ptr``: the address; it
    keeps the allocation alive), what the varlen launchers read of the device cu_seqlens."""
    __slots__ = ("data",)


def _expand_on_device(t: Tables, dev, stream, staging_out: list):
    """(:class:`NamedTables`, cu_seqlens_q, cu_seqlens_k) of ``t`` (compact records, ``t.expand``): the records,
    the CTAs' row starts and the lengths uploaded in one copy to the head of one allocation, then the per-visit
    rows and ranks written behind them on the GPU by kernels_src/bwd_expand.cu, both enqueued on ``stream``
    (the staging of the copy appended to ``staging_out``, as device_tables._upload)."""
    num_rows = max(t.num_visits, 1)
    visits_bytes = -(-num_rows * 16 // 256) * 256
    buf, head = _dt._upload([(t.blob, 0)], t.blob.nbytes, visits_bytes + num_rows * 4, stream, staging_out, t.pinned)
    d = NamedTables()
    base = buf.ptr
    d.ptrs = dict(visits=base + head, rank=base + head + visits_bytes, cta_start=base + int(t.offsets[_CTA_START]))
    d.buffer, d.num_ctas = buf, t.num_ctas
    launch = _expand_launches.get(dev) or _expand_launch(dev)
    launch(t.num_ctas, stream, (*_record_ptrs(t, base).values(), t.compact[0], t.compact[1], t.heads, t.kv_heads,
                                d.ptrs["visits"], d.ptrs["rank"], d.ptrs["cta_start"]))
    return d, _device_view(buf, t, _CU_Q), _device_view(buf, t, _CU_K)


_expand_launches: dict = {}    # device -> the launch of kernels_src/bwd_expand.cu there (_expand_launch)
_EXPAND_FIELDS = varlen_pack.NAMES[:_NUM_RECORD_ARRAYS] + ("tie_sign", "rank_rule", "num_heads", "num_heads_kv",
                                                           "visits", "rank", "cta_start")


def _expand_launch(dev):
    """``launch(num_ctas, stream, values)`` of the varlen bwd_expand kernel on device ``dev``: its block
    holds ``values`` (the _EXPAND_FIELDS, in order) and zeros elsewhere (the expansion reads those fields only);
    its grid is (num_ctas, kernels.EXPAND_CHUNKS). The function handle and the fields' places are found once."""
    from . import executor, jit, kernels, params
    spec = kernels.expand_spec()
    with cupy.cuda.Device(dev):                     # the handle is valid on the device it was loaded on only
        func = jit.load(spec).ptr
    offsets = params.int_field_offsets(kernels.BWD_PARAMS_DTYPE, _EXPAND_FIELDS)
    zeros = bytes(kernels.BWD_PARAMS_DTYPE.itemsize)

    def launch(num_ctas, stream, values):
        executor.launch(func, num_ctas, kernels.EXPAND_CHUNKS, 1, spec.threads, spec.smem_bytes, stream.ptr,
                        executor.patched_block(zeros, offsets, values))
    _expand_launches[dev] = launch
    return launch


def _too_large(num_visits, compact_above) -> bool:
    """compact_device.table_form's size rule, applied once a varlen table's size is known: a per-visit table of
    more than ``compact_above`` visits takes compact records instead."""
    return compact_above is not None and num_visits > compact_above


def plan(policy, lens_q, lens_k, block_m, block_n, heads, kv_heads, causal, max_ctas, window,
         compact=False, compact_above=None, pinned=False, head_section=0) -> Tables:
    """The varlen schedule of one packed batch (lengths: int64 host arrays) on at most ``max_ctas`` CTAs (fewer
    when the batch has fewer KV columns), per-visit, ``compact`` (True) or compact records to be expanded on the
    GPU (``"expand"``), cached by lengths (LRU): training on fixed packings builds each once. ``compact_above``:
    a per-visit form whose table would hold more visits than this is built compact instead (``t.compact`` says
    which form came out). ``pinned``: a compact form built here packs its blob into pinned memory where it can
    (device_tables._pinned_blob; the GPU paths). ``head_section``: as :func:`cupy_dash.schedule.build_varlen`'s."""
    columns = kv_heads * varlen_pack.kv_tiles(np.ascontiguousarray(lens_k, np.int64), block_n)
    num_sms, group = max(1, min(max_ctas, columns)), heads // kv_heads
    key = (policy, lens_q.tobytes(), lens_k.tobytes(), block_m, block_n, heads, causal, num_sms, group, window,
           compact, compact_above, head_section)
    with _plans_lock:
        t = _plans.get(key)
        if t is not None:
            _plans.move_to_end(key)
            return t
    t = Tables()
    t.compact, t.visits, t.rank, t._cta_start, t.blob, t._cu_q, t._cu_k = None, None, None, None, None, None, None
    t.pinned = False
    t.heads, t.kv_heads = heads, kv_heads
    if compact:
        # NOTES: the forms a training step builds anew, in one call (varlen_pack.new_packing: the records of
        # varlen_schedule.build_varlen, packed) without build_varlen's argument checks (the lengths come checked).
        if policy not in _schedule.POLICIES:
            raise ValueError(f"unknown schedule {policy!r}; expected one of {', '.join(_schedule.POLICIES)}")
        problem = (np.ascontiguousarray(lens_q, np.int64), np.ascontiguousarray(lens_k, np.int64), block_m,
                   block_n, heads, causal, num_sms, group, _schedule.check_window(window, causal))
        out = varlen_pack.new_packing(*varlen_schedule.schedule_args(policy, problem), True,
                                      _dt._pinned_blob if pinned else None, head_section)
        code, t.blob, t.offsets, t.shapes, t.num_visits, t.num_ctas, tie_sign, rank_rule, t.m_blocks, t.n_blocks = out
        t.pinned = pinned and _dt._pins(t.blob.nbytes)     # what _pinned_blob chose (a failed pin clears _pinned_ok)
        t.policy, t.compact = varlen_schedule.POLICY_NAMES[code], (tie_sign, rank_rule)
        if compact == "expand" and _too_large(t.num_visits, compact_above):
            compact = True
    else:
        built = varlen_schedule.build_varlen(policy, lens_q, lens_k, block_m=block_m, block_n=block_n, heads=heads,
                                             causal=causal, num_sms=num_sms, group_size=group, window=window,
                                             head_section=head_section)
        t.num_visits, t.num_ctas, t.policy = int(built.num_visits), int(built.num_ctas), str(built.policy)
        if _too_large(t.num_visits, compact_above):
            compact = True
            t.blob, t.offsets, t.shapes, _ = varlen_pack.pack(
                built.records, built.cta_columns, built.cta_col_start, built.seg_col_start, built.n_first,
                built.num_m_blocks, built.seqlens_q, built.seqlens_k, kv_heads, group, False)
            t.compact = (int(built.tie_sign), int(built.rank_rule))
        else:
            t.visits, t.rank, t._cta_start = built.expand()
            t._cu_q, t._cu_k = (np.concatenate(([0], np.cumsum(x))).astype(np.int32) for x in (lens_q, lens_k))
        t.n_blocks = max(1, int((-(-lens_k // block_n)).max()))
        t.m_blocks = max(1, int((-(-lens_q // block_m)).max()))
    t.expand = compact == "expand"
    t.group_size, t.key = group, key
    with _plans_lock:
        _plans[key] = t
        while len(_plans) > _MAX_PLANS:
            _plans.popitem(last=False)
    return t
