"""Compact schedules of packed variable-length batches, host side: :func:`build_varlen` (the argument checks; the
records by varlen_pack.schedule_varlen) and :class:`VarlenSchedule`. Segments, local tiles, how mixed lengths are
dispatched and the header: docs/schedules.md, "Packed batches"; byte layout: docs/architecture.md, "Byte layouts".
"""
from __future__ import annotations

import numpy as np

from . import _schedule, _varlen_sched, _varlen_view, per_visit, varlen_pack
from .compact import ColumnRecords

RANK_COUNT, RANK_ASC_N, RANK_DESC_N = 0, 1, 2


class VarlenSchedule(ColumnRecords):
    """Compact records of one packed batch (arrays read-only)."""

    def __init__(self, policy, problem, out, info, head_section=0):
        (self.seqlens_q, self.seqlens_k, self.block_m, self.block_n, self.heads, self.causal, self.num_sms,
         self.group_size, self.windows) = problem
        self.policy, self.head_section = policy, head_section
        (self.records, self.cta_columns, self.cta_col_start, seg_col_start, self.loads, self.num_ctas,
         self.tie_sign) = out
        self.num_kv_heads = self.heads // self.group_size
        self.seg_col_start = seg_col_start.astype(np.int32)
        self.n_first = np.maximum(info[:, 2], 0).astype(np.int32)
        self.num_m_blocks, self.num_n_blocks = info[:, 0].copy(), info[:, 1].copy()
        self.rank_rule = varlen_pack.rank_rule_of(_schedule.POLICY_CODES[policy], self.tie_sign)
        self.auto_dispatched = ()       # build_varlen("auto"): the candidates whose dispatch auto ran
        for a in (self.records, self.cta_columns, self.cta_col_start, self.seg_col_start, self.n_first, self.loads):
            a.flags.writeable = False

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.records, self.cta_columns, self.cta_col_start, self.seg_col_start,
                                      self.n_first))

    def validate(self) -> "VarlenSchedule":
        """O(columns): raise ValueError unless the records cover exactly the visible tiles of every sequence,
        give every dQ tile the ranks 0..k-1, cannot deadlock and obey the rank rule (_varlen_sched.check_varlen
        says why that is a proof)."""
        _varlen_sched.check_varlen(self.records, self.cta_columns, self.cta_col_start, self.seg_col_start,
                                   self.seqlens_q, self.seqlens_k, self.windows, self.block_m, self.block_n,
                                   self.causal, self.num_kv_heads, self.tie_sign, self.rank_rule)
        return self

    def expand(self) -> tuple:
        return expand(self)

    @property
    def widest_segment(self) -> int:
        return int(np.diff(self.seg_col_start).max(initial=0))

    def __repr__(self):
        return (f"VarlenSchedule({self.policy!r}, {len(self.seqlens_q)} sequences, heads={self.heads}, "
                f"group_size={self.group_size}, causal={self.causal}: {self.num_columns} columns, "
                f"{self.num_visits} visits on {self.num_ctas} CTAs, {self.nbytes} bytes)")


def _lengths(name, seqlens) -> np.ndarray:
    arr = np.asarray(seqlens)
    if arr.ndim != 1 or len(arr) < 1 or arr.dtype.kind not in "iu":
        raise ValueError(f"{name}: expected a 1-D host sequence of ints (one per sequence), got {seqlens!r}")
    if len(arr) and (arr.min() < 0 or arr.max() >= 1 << 31):
        raise ValueError(f"{name}: lengths must be in [0, 2^31)")
    return np.ascontiguousarray(arr, dtype=np.int64)


def _problem(policy, seqlens_q, seqlens_k, block_m, block_n, heads, causal, num_sms, group_size, window):
    if policy not in per_visit.POLICIES:
        raise ValueError(f"unknown schedule {policy!r}; expected one of {', '.join(per_visit.POLICIES)}")
    sq, sk = _lengths("seqlens_q", seqlens_q), _lengths("seqlens_k", seqlens_k)
    if len(sq) != len(sk):
        raise ValueError(f"seqlens_q and seqlens_k name {len(sq)} and {len(sk)} sequences")
    heads = per_visit._positive_int("heads", heads, maximum=per_visit.MAX_HEADS)
    group = per_visit._positive_int("group_size", group_size)
    if heads % group:
        raise ValueError(f"group_size ({group}) must divide heads ({heads})")
    causal = per_visit._flag("causal", causal)
    return (sq, sk, per_visit._positive_int("block_m", block_m), per_visit._positive_int("block_n", block_n),
            heads, causal, per_visit._positive_int("num_sms", num_sms, maximum=per_visit.MAX_SMS), group,
            per_visit.check_window(window, causal))


POLICY_NAMES = {code: name for name, code in _schedule.POLICY_CODES.items()}


def schedule_args(policy, problem) -> tuple:
    """The arguments of varlen_pack.schedule_varlen (and the first ones of new_packing) for ``problem``
    (:func:`_problem`'s tuple: lengths int64, tiles, heads, causal, CTAs, group, checked window), with auto's
    constants (schedule.AUTO_*) as they are now."""
    sq, sk, bm, bn, heads, causal, num_sms, group, (left, right) = problem
    codes = _schedule.POLICY_CODES
    c, r = per_visit.AUTO_COSTS
    return (-1 if policy == "auto" else codes[policy], sq, sk, left, right, bm, bn, heads, group, causal, num_sms,
            tuple(codes[p] for p in per_visit.AUTO_CANDIDATES), c, r, per_visit.AUTO_TOLERANCE,
            per_visit.AUTO_FEW_GROUPED)


def build_varlen(policy: str = "auto", seqlens_q=None, seqlens_k=None, *, block_m: int, block_n: int, heads: int,
                 causal: bool, num_sms: int, group_size: int = 1, window=(-1, -1),
                 head_section: int = 0) -> VarlenSchedule:
    """Compact records of the backward schedule of a packed batch (docs/schedules.md), O(columns): the arguments
    checked here, the records built by varlen_pack.schedule_varlen. ``auto`` picks among
    schedule.AUTO_CANDIDATES by the column model, as compact.column_model_choice does, and builds the records of
    its choice only (``plan.auto_dispatched``: the candidates it had to dispatch to choose). ``head_section``: as
    :func:`cupy_dash.schedule.build`'s, over the KV heads of every sequence at once."""
    problem = _problem(policy, seqlens_q, seqlens_k, block_m, block_n, heads, causal, num_sms, group_size, window)
    head_section = per_visit._positive_int("head_section", head_section, minimum=0)
    code, wins, shapes, built, dispatched, _ = varlen_pack.schedule_varlen(*schedule_args(policy, problem),
                                                                          head_section=head_section)
    plan = VarlenSchedule(POLICY_NAMES[code], problem[:8] + (wins,), built, shapes[0], head_section)
    plan.auto_dispatched = tuple(POLICY_NAMES[c] for c in dispatched)
    return plan


def expand(plan: VarlenSchedule) -> tuple:
    """(visits int32 (V, 4) rows (cta, bh, n_block, m_block) in every CTA's execution order, rank int32 (V,),
    cta_start int64 (num_ctas + 1,)): the per-visit table, ranks derived independently of the rank rule (every
    dQ tile (bh, m) sorts its visits by (step, tie_sign * n)), in O(visits) without a sort (_varlen_view)."""
    return _varlen_view.expand(plan.records, plan.cta_columns, plan.cta_col_start, plan.num_m_blocks,
                               plan.num_kv_heads, plan.group_size, plan.tie_sign)
