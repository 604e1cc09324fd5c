"""The public builders, which resolve ``auto``: :func:`build` (per-visit tables: the column records of
``compact._build_compact`` expanded) and :func:`build_compact` (compact records), ``auto``'s choice and the size check
that sends too large a per-visit table to :func:`build_compact`. Policies and choice: docs/schedules.md.
"""
from __future__ import annotations

import copy
import functools

from . import compact, per_visit
from .per_visit import ROW_BYTES


def build(policy: str = "auto", *, seqlen_q: int, seqlen_k: int, block_m: int, block_n: int, num_heads: int,
          causal: bool, num_sms: int, group_size: int = 1, window=(-1, -1),
          head_section: int = 0) -> per_visit.Schedule:
    """Build (or fetch from the cache) the schedule table of ``policy`` for one problem.

    num_heads is the number of (batch, query head) pairs, B * H; group_size the number of query heads that share
    one KV head, H // Hkv (1 for MHA, H for MQA; it must divide num_heads); num_sms the number of persistent CTAs
    that run concurrently (any value >= 1; the table uses min(num_sms, number of work units) CTAs); window the
    sliding window (left, right), -1 unbounded (stored in :func:`cupy_dash.schedule.canonical_window` form as
    ``plan.window``); head_section > 0 runs the ``fa3`` policy's shortest-first rounds over sections of that many KV
    heads (:func:`cupy_dash.schedule.l2_head_section`; the same bits, fewer heads' data in flight), 0 over every
    head.

    A table above ``AUTO_VISITS`` (2^24) visits, where the backward switches to compact tables,
    raises ValueError saying how big it would be, before allocating anything (unless CUPY_DASH_COMPACT_TABLES=0):
    :func:`build_compact` builds the same schedule as per-column records, in O(columns).
    """
    args = per_visit._checked_args(policy, seqlen_q, seqlen_k, block_m, block_n, num_heads, causal, num_sms,
                                   group_size, window, head_section)
    _check_table_size(policy, *args)
    _check_tiles("build", policy, args)
    if policy == "auto":
        return _build_auto(*args)
    return _build(policy, *args)


def build_compact(policy: str = "auto", *, seqlen_q: int, seqlen_k: int, block_m: int, block_n: int,
                  num_heads: int, causal: bool, num_sms: int, group_size: int = 1, window=(-1, -1),
                  head_section: int = 0):
    """The compact records of :func:`cupy_dash.schedule.build`'s table (same arguments, same checks), built in
    O(columns). ``auto`` picks as :func:`cupy_dash.schedule.build` does (``plan.auto_method`` says how)."""
    args = per_visit._checked_args(policy, seqlen_q, seqlen_k, block_m, block_n, num_heads, causal, num_sms,
                                   group_size, window, head_section)
    _check_tiles("build_compact", policy, args)
    if policy == "auto":
        plan = copy.copy(compact._build_compact(_auto_choice(*args), *args))
        plan.auto_method = compact.auto_method(*args)
        return plan
    return compact._build_compact(policy, *args)


def _check_tiles(name, policy, args) -> None:
    """ValueError, naming the call, if the problem (per_visit._checked_args's tuple) has 2^31 Q or KV tiles or more,
    which no table numbers (a few visible visits, as in a causal mask with far more queries than keys, pass the
    size check; the builder's own error would not say which argument)."""
    seqlen_q, seqlen_k, block_m, block_n = args[:4]
    tiles = max(-(-seqlen_q // block_m), -(-seqlen_k // block_n))
    if tiles >= 1 << 31:
        raise ValueError(f"schedule.{name}({policy!r}, seqlen_q={seqlen_q}, seqlen_k={seqlen_k}, block_m={block_m}, "
                         f"block_n={block_n}, ...): {_NO_TABLE} {tiles} tiles on one side")


_NO_TABLE = ("no table holds this problem: schedule.build_compact's records number Q and KV tiles with int32, and it "
             "has")


def _check_table_size(policy, seqlen_q, seqlen_k, block_m, block_n, num_heads, causal, num_sms, group_size,
                      window, head_section=0):
    """ValueError if the per-visit table of this problem (build()'s checked arguments) would hold more than
    AUTO_VISITS visits, the size above which the backward uses compact tables, unless
    CUPY_DASH_COMPACT_TABLES=0 asks for per-visit tables of any size (as it does of the backward). The visits are
    counted in O(KV tiles), or bounded below in O(1) by one per head and visible KV tile where that bound already
    exceeds the limit (2^40 tokens: no count over 2^33 KV tiles)."""
    from .. import config
    limit = per_visit.AUTO_VISITS
    num_n_blocks = -(-seqlen_k // block_n)
    if num_heads * -(-seqlen_q // block_m) * num_n_blocks <= limit or config.COMPACT_TABLES.get() is False:
        return
    columns = num_n_blocks - per_visit.unseen_keys(seqlen_q, seqlen_k, causal, window) // block_n   # visible tiles
    if num_heads * columns > limit:
        visits, about = num_heads * columns, "at least "
    else:
        visits, about = compact.num_visits(seqlen_q, seqlen_k, block_m, block_n, num_heads, causal, window), ""
    if visits <= limit:
        return
    mask = "causal" if causal else "full"
    what = (f"schedule.build({policy!r}, seqlen_q={seqlen_q}, seqlen_k={seqlen_k}, block_m={block_m}, "
            f"block_n={block_n}, num_heads={num_heads}, {mask} mask): the per-visit table would hold {about}{visits} "
            f"visits ({about}{visits * ROW_BYTES / 1e9:.3g} GB at {ROW_BYTES} bytes a visit), above the {limit} "
            f"visits where the backward switches to compact tables")
    tiles = max(-(-seqlen_q // block_m), num_n_blocks)
    if tiles >= 1 << 31:
        raise ValueError(f"{what}; {_NO_TABLE} {tiles} tiles on one side")
    raise ValueError(f"{what}. Use schedule.build_compact(...) with the same arguments: the same schedule as one "
                     f"record per KV column ({num_heads // group_size * columns} columns), in O(columns) time and "
                     f"memory (CUPY_DASH_COMPACT_TABLES=0 lets build make per-visit tables of any size)")


@functools.lru_cache(maxsize=64)
def _auto_choice(seqlen_q, seqlen_k, block_m, block_n, num_heads, causal, num_sms, group_size=1,
                 window=(-1, -1), head_section=0) -> str:
    """The concrete policy that ``auto`` builds for this problem (per_visit._checked_args's tuple): descending for
    few grouped columns per CTA, else the column model's choice or the per-visit engine simulation's
    (:func:`cupy_dash.schedule.compact.auto_method` says which)."""
    args = (seqlen_q, seqlen_k, block_m, block_n, num_heads, causal, num_sms, group_size, window, head_section)
    few = per_visit.AUTO_FEW_GROUPED * num_sms
    if group_size > 1 and len(compact._build_compact("descending", *args).records) <= few:
        return "descending"
    if compact.auto_method(*args) == "column model":
        return compact.column_model_choice(*args)
    times = {}
    for candidate in per_visit.AUTO_CANDIDATES:
        plan = _build(candidate, *args)
        times[candidate] = per_visit.simulate(plan, *per_visit.AUTO_COSTS, model="engine")
    best = min(times.values())
    return next(p for p in per_visit.AUTO_CANDIDATES if times[p] <= best * (1 + per_visit.AUTO_TOLERANCE))


@functools.lru_cache(maxsize=64)
def _build(policy, seqlen_q, seqlen_k, block_m, block_n, num_heads, causal, num_sms, group_size=1,
           window=(-1, -1), head_section=0) -> per_visit.Schedule:
    """The per-visit table of a concrete ``policy`` for build()'s checked arguments: its compact records
    (:func:`build_compact`'s, from the one builder) expanded by :func:`cupy_dash.schedule.compact.expand`."""
    return compact._build_compact(policy, seqlen_q, seqlen_k, block_m, block_n, num_heads, causal, num_sms,
                                  group_size, window, head_section).to_schedule()


def _build_auto(*args) -> per_visit.Schedule:
    """The per-visit table of ``auto``'s choice for the checked problem ``args``."""
    return _build(_auto_choice(*args), *args)
