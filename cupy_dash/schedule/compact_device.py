"""Compact schedule records on the device, for the backward's DASH_COMPACT builds (``kernels_src/compact_view.cuh``
reads them as the BwdParams fields after ``softmax_scale_log2``, ``kernels_src/params.cuh``): the decision of the
table form (:func:`table_form`), what ``auto`` runs in each form (compact tables: ``KERNEL_AUTO``, the fastest
closed-form rank rule), and :func:`device_arrays`, the arrays exactly as uploaded (the CPU tests check them against
:func:`compact.expand`; :func:`cupy_dash.cuda.device_tables.compact` uploads and caches them). Why:
docs/decisions/table-forms.md.
"""
from __future__ import annotations

import numpy as np

from .. import config
from . import auto, compact, per_visit

ENV = config.COMPACT_TABLES.name
AUTO_VISITS = per_visit.AUTO_VISITS
KERNEL_AUTO = "descending"


def enabled() -> bool:
    """Whether ``CUPY_DASH_COMPACT_TABLES`` asks for compact tables whatever the size (read on every call)."""
    return config.COMPACT_TABLES.get() is True


def table_form(num_visits=None, varlen=False) -> str:
    """The form of a backward's schedule tables, the one place that decides it (core.api, jax.callbacks, core.varlen;
    docs/decisions/table-forms.md): ``"compact"`` with ``CUPY_DASH_COMPACT_TABLES=1`` or, unset, above
    ``AUTO_VISITS`` visits; else ``"expand"`` (varlen with ``CUPY_DASH_VARLEN_EXPAND=device``, the default: rows
    written on the GPU by kernels_src/bwd_expand.cu) or ``"visits"`` (rows built and uploaded by the host).
    ``num_visits``: the per-visit table's size, or a callable counting it (called only where the size decides), or
    None where it is known only after the build (a varlen packing: varlen_device.plan then applies the size rule).
    Soft-capped backwards follow the same rule (their compact builds keep 1 - t^2 in shared memory at head dims 64
    and 128: kernels_src/bwd/visit_math.cuh, kDtPairs)."""
    forced = config.COMPACT_TABLES.get()
    if forced is None and num_visits is not None:
        count = num_visits() if callable(num_visits) else num_visits
        forced = count > AUTO_VISITS
    if forced:
        return "compact"
    return "expand" if varlen and config.VARLEN_EXPAND.get() == "device" else "visits"


def wanted(seqlen_q, seqlen_k, block_m, block_n, num_heads, causal, window) -> bool:
    """Whether a fixed-length backward of this problem (num_heads = B * H) uses the compact build
    (:func:`table_form`; its visits counted in O(columns))."""
    return table_form(lambda: compact.num_visits(seqlen_q, seqlen_k, block_m, block_n, num_heads, causal,
                                                 window)) == "compact"


def auto_policy(compact_tables: bool, *problem) -> str:
    """What ``auto`` runs in each form of the backward's tables, the one place that decides it: compact tables take
    KERNEL_AUTO (module docstring); per-visit tables take schedule.build's choice for ``problem``
    (per_visit._checked_args's tuple, not needed for compact tables)."""
    return KERNEL_AUTO if compact_tables else auto._auto_choice(*problem)


def backward_auto(*problem) -> tuple:
    """``(policy, compact_tables)``: what a backward of ``problem`` (per_visit._checked_args's tuple: seqlen_q,
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
    """int32 (num_m_blocks, 2): row m is ``plan.tile_column_bounds()`` at Q tile m, the columns that visit it;
    every head has the same ranges, so one row per Q tile serves all heads."""
    out = np.empty((plan.num_m_blocks, 2), dtype=np.int32)
    out[:, 0], out[:, 1] = plan.tile_column_bounds()
    return out


class CompactDeviceTables:
    """A compact schedule on one device: the arrays of :func:`device_arrays` as CuPy arrays (``scan_bounds``
    None where unused), the scalars, ``num_ctas``, ``policy``, ``device_id`` and ``nbytes``; ``plans``: the launch
    plans that read them (cupy_dash.cuda.plans), dropped with them."""
    __slots__ = ("col_records", "cta_columns", "cta_col_start", "scan_bounds", "tile_columns", "n_first",
                 "columns_per_head", "tie_sign", "rank_rule", "num_ctas", "policy", "device_id", "nbytes", "plans")

    def params(self) -> dict:
        """The BwdParams fields these tables set (addresses and scalars; launchers.bwd_params nulls the rest)."""
        ptr = {k: (0 if getattr(self, k) is None else getattr(self, k).data.ptr)
               for k in ("col_records", "cta_columns", "cta_col_start", "scan_bounds", "tile_columns")}
        return dict(ptr, n_first=self.n_first, columns_per_head=self.columns_per_head, tie_sign=self.tie_sign,
                    rank_rule=self.rank_rule)
