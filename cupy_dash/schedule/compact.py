"""Compact schedules: one record per KV column instead of one row per visit, for long contexts::

    plan = schedule.build_compact("auto", seqlen_q=131072, seqlen_k=131072, block_m=64, block_n=128,
                                  num_heads=32, causal=True, num_sms=132)
    plan.records, plan.cta_columns, plan.cta_col_start     # the tables; plan.nbytes in all
    plan.validate()                    # O(columns) proof of coverage, rank permutations and no deadlock
    visits, rank, cta_start = schedule.expand(plan)       # == schedule.build(...)'s arrays
    plan.visit_of(cta, i); plan.rank_of(head, m_block, n_block)   # what the kernel computes per visit

Why records suffice, each policy's Q-tile rule, the header and the scan bounds: docs/schedules.md, "Compact
records"; byte layout: docs/architecture.md, "Byte layouts"; fields: _records.pxd; why this form where:
docs/decisions/table-forms.md.
"""
from __future__ import annotations

import functools

import numpy as np

from . import _compact, _compact_view, _schedule, _varlen_view, per_visit, varlen_pack

RANK_RULES = ("count", "ascending n", "descending n")   # rank_rule 0, 1, 2


class ColumnRecords:
    """What every table of per-column records has: ``records`` (one row per KV column), ``loads`` (visits per CTA
    of the group-size-1 schedule), ``group_size``, ``policy``, ``num_ctas``, ``rank_rule`` and ``widest_segment``
    (the most columns of a segment), and the column model on them."""

    @property
    def num_columns(self) -> int:
        return len(self.records)

    @property
    def num_visits(self) -> int:
        return int(self.loads.sum()) * self.group_size

    def model_makespan(self, c: float = 1.0, r: float = 0.25, model: str = "dag") -> float:
        """The column-level model (no per-visit simulation): the busiest CTA runs its visits back to back, as it
        does when no visit waits (DAG model: c + r per visit; engine model: max(c, r) per visit plus min(c, r)
        for the pipeline's fill), plus the paper's start-up staircase (n - 1) r for tables whose dQ tiles all add
        in ascending n (rank rule 1), n = min(widest_segment, CTAs): NC for a fixed-length table, the most columns
        of a segment for a packed batch. Waits other than the staircase are not modelled."""
        c, r = per_visit._costs(c, r)
        return varlen_pack.column_model(int(self.loads.max(initial=0)) * self.group_size, self.num_ctas,
                                        self.widest_segment, self.rank_rule, c, r, per_visit._engine(model))

    @property
    def column_model_applies(self) -> bool:
        """Whether :meth:`model_makespan` accounts for the waits of this table: always for symmetric_shift and
        fa3 (their dQ tiles are reached in a strict order whatever the dispatch timing), and for every policy when
        all columns are equally long (they start in lockstep; a packed batch: every column of the batch). shift
        and descending on unequal columns wait wherever the dispatch staggers column starts, which only a
        per-visit simulation sees (docs/decisions/table-forms.md)."""
        lengths = self.records[:, 2] - self.records[:, 1]
        return self.policy in ("symmetric_shift", "fa3") or len(lengths) == 0 or bool((lengths == lengths[0]).all())


class CompactSchedule(ColumnRecords):
    """Compact records of one schedule and the problem they were built for (arrays read-only, cached)."""

    def __init__(self, policy, args, records, cta_columns, cta_col_start, dispatch_order, loads, meta,
                 auto_method=None):
        (self.seqlen_q, self.seqlen_k, self.block_m, self.block_n, self.num_heads, self.causal, self.num_sms,
         self.group_size, self.window, self.head_section) = args
        self.policy, self.auto_method = policy, auto_method
        self.records, self.cta_columns, self.cta_col_start, self.loads = records, cta_columns, cta_col_start, loads
        self._dispatch_order, self._scan_bounds = dispatch_order, None      # bounds: computed when first needed
        for a in (records, cta_columns, cta_col_start, dispatch_order, loads):
            a.flags.writeable = False
        self.num_m_blocks, self.num_n_blocks = meta["M"], meta["N"]
        self.n_first, self.columns_per_head = meta["n_first"], meta["NC"]
        self.num_ctas, self.tie_sign, self.rank_rule = meta["num_ctas"], meta["tie_sign"], meta["rank_rule"]
        self.key = (policy,) + tuple(args)

    @property
    def scan_bounds(self) -> np.ndarray:
        """int32 (columns, 4): the dQ writer's scan bounds (docs/schedules.md), computed on first use in
        O(columns) (auto's candidates and closed-form rank rules never need them)."""
        if self._scan_bounds is None:
            bounds = _compact.scan_bounds(self.records, self._dispatch_order, self.columns_per_head)
            bounds.flags.writeable = False
            self._scan_bounds = bounds
        return self._scan_bounds

    @property
    def nbytes(self) -> int:
        """Bytes of the device tables: records, cta_columns, cta_col_start, and scan_bounds where the rank rule
        is the count."""
        bounds = self.scan_bounds.nbytes if self.rank_rule == 0 else 0
        return self.records.nbytes + self.cta_columns.nbytes + self.cta_col_start.nbytes + bounds

    column_ranges = per_visit.Schedule.column_ranges

    def validate(self) -> "CompactSchedule":
        """O(columns): raise ValueError unless the records cover every visible tile once, give every dQ tile the
        ranks 0..k-1 and cannot deadlock, and (count rank rule) the scan bounds are true
        (``_compact.check_records`` says why that is a proof)."""
        lo, hi = self.column_ranges()
        bounds = self.scan_bounds if self.rank_rule == 0 else None      # the kernel reads them only to count
        _compact.check_records(self.records, self.cta_columns, self.cta_col_start, self.num_heads // self.group_size,
                               lo, hi, self.n_first, self.columns_per_head, self.tie_sign, bounds)
        return self

    def _view(self):
        return self.records, self.cta_columns, self.cta_col_start, self.n_first, self.columns_per_head, \
            self.group_size

    def visit_of(self, cta: int, i: int) -> tuple:
        """(cta, head, n_block, m_block) of CTA cta's i-th visit, walking its column list (the producer's loop)."""
        return _compact_view.visit_of(*self._view(), cta, i)

    def _rank_view(self):
        return (self.records, self.cta_columns, self.cta_col_start, self.scan_bounds, self.n_first,
                self.columns_per_head, self.group_size, self.tie_sign, self.rank_rule)

    def rank_of(self, head: int, m_block: int, n_block: int, mode: str = "kernel") -> tuple:
        """(rank, records compared) of visit (head, m_block, n_block): the dQ writer's loop. ``mode``: "count"
        compares every column of the KV head that visits the tile; "window" only those between the column's
        scan bounds; "kernel" (what the kernel will do) the rank rule's closed form where there is one, else
        "window"."""
        return _compact_view.rank_of(*self._rank_view(), head, m_block, n_block, mode)

    def visits_and_ranks(self, mode: str = "kernel") -> tuple:
        """(visits, rank, compared) for every visit by visit_of's walk and rank_of's loop (slow: a reference)."""
        return _compact_view.visits_and_ranks(*self._rank_view(), mode)

    def window_scan_stats(self, stride: int = 1) -> tuple:
        """(mean, max) records compared per visit by the "window" count, from the records alone (O(visits) time;
        stride > 1: over every stride-th column's visits)."""
        return _compact_view.window_scan_stats(self.records, self.scan_bounds, self.columns_per_head, stride)

    def expand(self) -> tuple:
        return expand(self)

    def to_schedule(self) -> per_visit.Schedule:
        """The expanded view as a :class:`cupy_dash.schedule.Schedule` (validate / simulate work on it)."""
        visits, rank, cta_start = expand(self)
        return per_visit.Schedule(self.policy, self.seqlen_q, self.seqlen_k, self.block_m, self.block_n,
                                  self.num_heads, self.causal, self.num_sms, visits, rank, cta_start,
                                  self.group_size, self.window, self.head_section)

    def tile_column_bounds(self) -> tuple:
        """(first, end), int64 (num_m_blocks,) each: for Q tile m, the first visible column (index n_block -
        n_first) whose range [lo, hi) ends after m, and the first that starts after m; the columns in between visit
        m. Every head has the same ranges (``column_ranges()``, non-decreasing in n)."""
        lo, hi = self.column_ranges()
        m = np.arange(self.num_m_blocks, dtype=np.int64)
        return np.searchsorted(hi, m, side="right"), np.searchsorted(lo, m, side="right")

    def scan_lengths(self) -> np.ndarray:
        """int64 (num_m_blocks,): columns of one KV head that visit each Q tile, i.e. the records the dQ writer's
        count scans per visit of that tile (every head has the same ranges)."""
        first, end = self.tile_column_bounds()
        return end - first

    @property
    def widest_segment(self) -> int:
        return self.columns_per_head

    def lower_bound(self, c: float = 1.0, r: float = 0.25, model: str = "dag") -> float:
        """:func:`cupy_dash.schedule.lower_bound` from the records."""
        return per_visit.lower_bound(self, c, r, model)

    def __repr__(self):
        return (f"CompactSchedule({self.policy!r}, seqlen_q={self.seqlen_q}, seqlen_k={self.seqlen_k}, "
                f"block_m={self.block_m}, block_n={self.block_n}, num_heads={self.num_heads}, group_size="
                f"{self.group_size}, causal={self.causal}, window={self.window}, num_sms={self.num_sms}: "
                f"{self.num_columns} columns, {self.num_visits} visits on {self.num_ctas} CTAs, rank rule "
                f"{RANK_RULES[self.rank_rule]!r}, {self.nbytes} bytes)")


@functools.lru_cache(maxsize=64)
def _build_compact(policy, seqlen_q, seqlen_k, block_m, block_n, num_heads, causal, num_sms, group_size=1,
                   window=(-1, -1), head_section=0):
    """The records of a concrete ``policy`` for build()'s checked arguments, built by the varlen builder
    (varlen_pack.schedule_varlen) as one sequence of num_heads query heads: its segments are then the KV heads
    and its records, CTA lists and dispatch order those of the fixed-length schedule (compared with the oracles of
    testing.pyx in tests/unit/test_schedule_one_builder.py)."""
    lengths_q, lengths_k = np.array([seqlen_q], dtype=np.int64), np.array([seqlen_k], dtype=np.int64)
    code = _schedule.POLICY_CODES[policy]
    _, _, (info, _, _, _), built, _, order = varlen_pack.schedule_varlen(
        code, lengths_q, lengths_k, *window, block_m, block_n, num_heads, group_size, causal, num_sms,
        (code,), *per_visit.AUTO_COSTS, per_visit.AUTO_TOLERANCE, per_visit.AUTO_FEW_GROUPED, True, head_section)
    records, cta_columns, cta_col_start, _, loads, num_ctas, tie_sign = built
    M, N, n_first, NC = (int(x) for x in info[0, :4])
    meta = {"M": M, "N": N, "n_first": n_first, "NC": NC, "num_ctas": num_ctas, "tie_sign": tie_sign,
            "rank_rule": varlen_pack.rank_rule_of(code, tie_sign)}
    return CompactSchedule(policy, (seqlen_q, seqlen_k, block_m, block_n, num_heads, causal, num_sms, group_size,
                                    tuple(window), head_section), records, cta_columns, cta_col_start, order, loads,
                           meta)


def expand(plan: CompactSchedule) -> tuple:
    """(visits int32 (V, 4) rows (cta, head, n_block, m_block), rank int32 (V,), cta_start int64 (num_ctas + 1,)):
    the per-visit arrays of ``plan``, which :func:`cupy_dash.schedule.build` returns for the same arguments; ranks
    derived from the records' (step, tie_sign * n) keys, not from the rank rule, in O(visits) by the sweep of
    _varlen_view.pyx (the plan is one sequence of num_heads // group_size KV heads there). Raises TypeError
    naming ``plan`` unless it is compact records."""
    per_visit._table_arg(plan, ("records", "cta_columns", "cta_col_start", "num_m_blocks", "n_first",
                                "columns_per_head", "num_heads", "group_size", "tie_sign"),
                         "compact records (a CompactSchedule from schedule.build_compact(...))")
    return _varlen_view.expand(plan.records, plan.cta_columns, plan.cta_col_start,
                               np.array([plan.num_m_blocks], dtype=np.int64), plan.num_heads // plan.group_size,
                               plan.group_size, plan.tie_sign)


@functools.lru_cache(maxsize=256)
def num_visits(seqlen_q, seqlen_k, block_m, block_n, num_heads, causal, window=(-1, -1)) -> int:
    """Visits of any table of this problem (every policy visits every visible tile once per query head); cached:
    every eager backward asks (compact_device.wanted)."""
    lo, hi = _schedule.column_ranges(seqlen_q, seqlen_k, block_m, block_n, causal, *window)
    return num_heads * int((hi - lo).sum())


def auto_method(seqlen_q, seqlen_k, block_m, block_n, num_heads, causal, num_sms, group_size=1,
                window=(-1, -1), head_section=0) -> str:
    """How ``auto`` chooses for this problem: 'engine simulation' (per visit, up to
    ``schedule.AUTO_MAX_SIMULATED_VISITS`` visits) or 'column model' (:meth:`CompactSchedule.model_makespan`)."""
    v = num_visits(seqlen_q, seqlen_k, block_m, block_n, num_heads, causal, window)
    return "engine simulation" if v <= per_visit.AUTO_MAX_SIMULATED_VISITS else "column model"


def column_model_choice(*args) -> str:
    """``auto``'s choice by the column model (engine costs AUTO_COSTS, same tolerance and tie order as the
    per-visit simulation), among the candidates whose waits it accounts for (``column_model_applies``)."""
    plans = [_build_compact(p, *args) for p in per_visit.AUTO_CANDIDATES]
    times = {p.policy: p.model_makespan(*per_visit.AUTO_COSTS, model="engine") for p in plans
             if p.column_model_applies}
    best = min(times.values())
    return next(p for p in per_visit.AUTO_CANDIDATES
                if p in times and times[p] <= best * (1 + per_visit.AUTO_TOLERANCE))
