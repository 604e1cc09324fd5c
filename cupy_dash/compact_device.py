"""Compact schedule records on the device, for the backward's DASH_COMPACT builds (large problems, or on request).

The main kernel's compact build (``kernels_src/compact_view.cuh``) reads, instead of the per-visit table, the
four arrays and four scalars of :mod:`cupy_dash.compact` as BwdParams fields (``kernels_src/params.cuh``, the
fields after ``softmax_scale_log2``). :func:`device_arrays` gives them as numpy arrays in exactly the layout
uploaded (the mirror that the CPU tests check against :func:`cupy_dash.compact.expand`); :func:`device_tables`
builds, uploads and caches them like :func:`cupy_dash.schedule.device_tables`.

When: eager backward calls (:func:`cupy_dash.attention_backward`) use the compact build where the per-visit
table would hold more than ``AUTO_VISITS`` visits (20 bytes each: 335 MB, e.g. S = 128k with 32 heads, causal),
and always with ``CUPY_DASH_COMPACT_TABLES=1``; ``CUPY_DASH_COMPACT_TABLES=0`` never uses it. There ``"auto"`` is
``KERNEL_AUTO``: the writer warp computes a counted rank (``shift``, ``symmetric_shift``) from the records at about
half the speed of a closed-form one (measured at S = 64k and 256k causal: ``descending`` 468 / 460 TFLOP/s,
``fa3`` 392 / 409, ``symmetric_shift`` 256 / 263; docs/decisions/table-forms.md), so auto takes the fastest closed form.
"""
from __future__ import annotations

import collections
import threading

import numpy as np

from . import compact, config, schedule

ENV = config.COMPACT_TABLES.name
_MAX_TABLES = 8
_lock = threading.Lock()
_tables: "collections.OrderedDict" = collections.OrderedDict()
_captured: dict = {}


AUTO_VISITS = schedule.AUTO_VISITS
KERNEL_AUTO = "descending"


def enabled() -> bool:
    """Whether ``CUPY_DASH_COMPACT_TABLES`` asks for compact tables whatever the size (read on every call)."""
    return config.COMPACT_TABLES.get() is True


def wanted(seqlen_q, seqlen_k, block_m, block_n, num_heads, causal, window) -> bool:
    """Whether a backward of this problem (num_heads = B * H) uses the compact build: ``CUPY_DASH_COMPACT_TABLES``
    if set (0 / 1), else whether its per-visit table would exceed ``AUTO_VISITS`` visits (O(columns) to count)."""
    forced = config.COMPACT_TABLES.get()
    if forced is not None:
        return forced
    return compact.num_visits(seqlen_q, seqlen_k, block_m, block_n, num_heads, causal, window) > AUTO_VISITS


def auto_policy(compact_tables: bool, *problem) -> str:
    """What ``auto`` runs in each form of the backward's tables, the one place that decides it: compact tables take
    KERNEL_AUTO (the fastest closed-form rank rule: module docstring); per-visit tables take schedule.build's
    choice for ``problem`` (schedule._checked_args's tuple, not needed for compact tables)."""
    return KERNEL_AUTO if compact_tables else schedule._auto_choice(*problem)


def backward_auto(*problem) -> tuple:
    """``(policy, compact_tables)``: what a backward of ``problem`` (schedule._checked_args's tuple: seqlen_q,
    seqlen_k, block_m, block_n, num_heads = B * H, causal, num_sms = co-resident CTAs, group_size, window) runs
    for ``schedule="auto"``, and whether in compact tables (:func:`wanted`; then :func:`auto_policy`)."""
    seqlen_q, seqlen_k, block_m, block_n, num_heads, causal, _, _, window = problem
    compact_tables = wanted(seqlen_q, seqlen_k, block_m, block_n, num_heads, causal, window)
    return auto_policy(compact_tables, *problem), compact_tables


def device_arrays(plan: compact.CompactSchedule) -> dict:
    """What the kernel reads, as numpy arrays / ints keyed by BwdParams field: ``col_records`` int32 (columns,
    8) C-contiguous (32-byte rows: the kernel loads each as two int4), ``cta_columns`` int32, ``cta_col_start``
    int64 (num_ctas + 1,), ``scan_bounds`` int32 (columns, 4) (rank rule 0 only, else None: the kernel then
    never reads them), and the scalars ``n_first``, ``columns_per_head``, ``tie_sign``, ``rank_rule``. Raises
    ValueError where the kernel's 32-bit index arithmetic would overflow."""
    records = np.ascontiguousarray(plan.records, dtype=np.int32)
    if records.ndim != 2 or records.shape[1] != 8:
        raise ValueError(f"compact records must be (columns, 8), got {records.shape}")
    if records.size >= 2 ** 31:
        raise ValueError(f"{len(records)} columns: the kernel indexes records with 32-bit ints")
    bounds = np.ascontiguousarray(plan.scan_bounds, dtype=np.int32) if plan.rank_rule == 0 else None
    return {"col_records": records, "cta_columns": np.ascontiguousarray(plan.cta_columns, dtype=np.int32),
            "cta_col_start": np.ascontiguousarray(plan.cta_col_start, dtype=np.int64), "scan_bounds": bounds,
            "tile_columns": tile_columns(plan),
            "n_first": int(plan.n_first), "columns_per_head": int(plan.columns_per_head),
            "tie_sign": int(plan.tie_sign), "rank_rule": int(plan.rank_rule)}


def tile_columns(plan: compact.CompactSchedule) -> np.ndarray:
    """int32 (num_m_blocks, 2): for Q tile m, the first visible column (index n_block - n_first) whose range
    [lo, hi) ends after m, and the first that starts after m; the columns in between visit m. Every head has the
    same ranges (``plan.column_ranges()``, non-decreasing in n), so one row per Q tile serves all heads."""
    lo, hi = (np.asarray(x, dtype=np.int64) for x in plan.column_ranges())
    m = np.arange(-(-plan.seqlen_q // plan.block_m), dtype=np.int64)
    out = np.empty((len(m), 2), dtype=np.int32)
    out[:, 0] = np.searchsorted(hi, m, side="right")
    out[:, 1] = np.searchsorted(lo, m, side="right")
    return out


class CompactDeviceTables:
    """A compact schedule on one device: the arrays of :func:`device_arrays` as CuPy arrays (``scan_bounds``
    None where unused), the scalars, ``num_ctas``, ``policy``, ``device_id`` and ``nbytes``."""
    __slots__ = ("col_records", "cta_columns", "cta_col_start", "scan_bounds", "tile_columns", "n_first",
                 "columns_per_head", "tie_sign", "rank_rule", "num_ctas", "policy", "device_id", "nbytes")

    def params(self) -> dict:
        """The BwdParams fields these tables set (addresses and scalars; launchers.bwd_params nulls the rest)."""
        ptr = {k: (0 if getattr(self, k) is None else getattr(self, k).data.ptr)
               for k in ("col_records", "cta_columns", "cta_col_start", "scan_bounds", "tile_columns")}
        return dict(ptr, n_first=self.n_first, columns_per_head=self.columns_per_head, tie_sign=self.tie_sign,
                    rank_rule=self.rank_rule)


def upload(plan: compact.CompactSchedule, device_id: int) -> CompactDeviceTables:
    """:func:`device_arrays` of ``plan`` as CuPy arrays on device ``device_id`` (whatever the current device is:
    the tables are cached under that id; asynchronous copies)."""
    import cupy
    arrays = device_arrays(plan)
    t = CompactDeviceTables()
    t.nbytes = 0
    with cupy.cuda.Device(device_id):
        for name, value in arrays.items():
            if isinstance(value, np.ndarray):
                value = cupy.asarray(value)
                t.nbytes += value.nbytes
            setattr(t, name, value)
    t.num_ctas, t.policy, t.device_id = int(plan.num_ctas), str(plan.policy), device_id
    return t


def device_tables(policy, seqlen_q, seqlen_k, block_m, block_n, num_heads, causal, num_ctas, device_id,
                  stream, group_size=1, window=(-1, -1), capture=False) -> CompactDeviceTables | None:
    """:func:`cupy_dash.schedule.device_tables` (same arguments, same caching and capture rules) for the compact
    build: the records of :func:`cupy_dash.compact.build_compact` (host plans cached there), uploaded once per
    plan and device."""
    import cupy
    if policy == "auto":
        policy = auto_policy(True)
    plan = compact.build_compact(policy, seqlen_q=seqlen_q, seqlen_k=seqlen_k, block_m=block_m, block_n=block_n,
                                 num_heads=num_heads, causal=causal, num_sms=num_ctas, group_size=group_size,
                                 window=tuple(window))
    key = (plan.key, device_id)
    with _lock:
        t = _tables.get(key)
        if t is not None:
            _tables.move_to_end(key)
        else:
            t = _captured.get(key)
        if t is not None or capture:
            if capture and t is not None:
                _captured[key] = t
            return t
        t = upload(plan, device_id)
        # NOTES: as for the per-visit tables: later calls on any stream use them, so the copies finish first.
        stream.synchronize()
        _tables[key] = t
        while len(_tables) > _MAX_TABLES:
            _, old = _tables.popitem(last=False)
            with cupy.cuda.Device(old.device_id):
                cupy.cuda.runtime.deviceSynchronize()   # in-flight kernels may still read the evicted tables
            del old
        return t
