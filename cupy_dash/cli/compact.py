"""``python -m cupy_dash schedule --compact`` (and any problem above ``CLI_MAX_SIMULATED_VISITS`` visits): the
schedules of one problem from their compact records, in O(columns) time and memory: no per-visit table, no
per-visit simulation (see cupy_dash.schedule.compact)."""
from __future__ import annotations

import time

import numpy as np

from .. import config, schedule
from ..schedule import compact, compact_device, pieces

CLI_MAX_SIMULATED_VISITS = 1 << 24    # above: the CLI analyses compact records (the per-visit tables need GBs)
SCAN_STATS_VISITS = 1 << 26           # the windowed-count figures look at about this many visits (every k-th column)
POLICY_ORDER = ("fa3", "descending", "shift", "symmetric_shift")
ROW_BYTES = schedule.ROW_BYTES         # per-visit table: visits (4 int32) + rank (int32)


def scan_figures(plan, max_visits=SCAN_STATS_VISITS) -> tuple:
    """Records the dQ writer compares per visit, (mean, max) of the full count and of the windowed count
    (scan bounds), and the column stride of the latter's sample (1: every visit); None when the rank rule is a
    closed form."""
    if plan.rank_rule != 0:
        return None
    per_tile = plan.scan_lengths().astype(float)     # visits of a tile = columns visiting it = records scanned
    stride = -(-plan.num_visits // plan.group_size // max_visits)
    return ((float((per_tile ** 2).sum() / per_tile.sum()), int(per_tile.max())), plan.window_scan_stats(stride),
            stride)


def auto_line(plan) -> str:
    """What ``auto`` runs in the backward of ``plan``'s problem (a Schedule or CompactSchedule: its lengths, tiles,
    heads, mask, CTAs), in one line: the table form and the policy of compact_device.backward_auto, and why."""
    problem = (plan.seqlen_q, plan.seqlen_k, plan.block_m, plan.block_n, plan.num_heads, plan.causal, plan.num_sms,
               plan.group_size, tuple(plan.window))
    policy, compact_tables = compact_device.backward_auto(*problem)
    env = config.COMPACT_TABLES.raw() or ""
    limit = compact_device.AUTO_VISITS
    form = f"{compact_device.ENV}={env}" if env else \
        f"{plan.num_visits} visits {'>' if compact_tables else '<='} {limit} per table"
    if compact_tables:
        rule = ("the fastest closed-form rank rule (a counted rank, shift or symmetric_shift, runs the compact dQ "
                "writer at about half speed: docs/decisions/table-forms.md)")
    else:
        c, r = schedule.AUTO_COSTS
        gqa = ", or descending for few grouped columns per CTA" if plan.group_size > 1 else ""
        order = ", ".join(schedule.AUTO_CANDIDATES)
        rule = (f"schedule.build's choice: the first of {order} within {schedule.AUTO_TOLERANCE:.0%} of the lowest "
                f"makespan in the engine model with c={c:g}, r={r:g} (by {compact.auto_method(*problem)}{gqa})")
    line = (f"auto picks {policy!r}: the backward of this problem uses {'compact' if compact_tables else 'per-visit'} "
            f"tables ({form}), where auto is {rule}")
    return line if compact_tables else line + _cut_text(plan, problem)


def _cut_text(plan, problem) -> str:
    """The end of :func:`auto_line` for per-visit tables whose last wave the backward cuts into split KV columns
    (pieces.num_pieces_for under the split knobs): pieces, columns and the busiest CTA's visits; "" when it does
    not cut them."""
    seqlen_q, seqlen_k, block_m, block_n, heads, causal, num_sms, group_size, window = problem
    num_pieces = pieces.num_pieces_for("auto", plan.num_m_blocks, block_m, causal, group_size, window,
                                       config.SPLIT_COLUMNS.get(), config.SPLIT_PIECES.get())
    if not num_pieces:
        return ""
    base = schedule.build("auto", seqlen_q=seqlen_q, seqlen_k=seqlen_k, block_m=block_m, block_n=block_n,
                          num_heads=heads, causal=causal, num_sms=num_sms, group_size=group_size, window=window)
    cut = pieces.split_for_kernel(base, num_pieces)
    if cut.pieces is None:
        return ""
    return (f"; with head dim 64, 96 or 128 (no soft-capping) it cuts their last wave into {cut.pieces.num_split} "
            f"split KV columns of {num_pieces} pieces, the busiest CTA's {int(np.diff(base.cta_start).max())} visits "
            f"to {int(np.diff(cut.cta_start).max())} (docs/schedules.md, \"Split KV columns\")")


def analyse_compact(*, seqlen_q, seqlen_k, block_m, block_n, heads, causal, num_sms, c=1.0, r=0.25, model="dag",
                    group_size=1, window=(-1, -1)):
    """Build and check (record-level proof) every policy's compact records and evaluate the column model;
    returns one row (dict) per policy."""
    kw = dict(seqlen_q=seqlen_q, seqlen_k=seqlen_k, block_m=block_m, block_n=block_n, num_heads=heads,
              causal=causal, num_sms=num_sms, group_size=group_size, window=window)
    rows = []
    for policy in POLICY_ORDER:
        t0 = time.perf_counter()
        plan = schedule.build_compact(policy, **kw)
        built = time.perf_counter() - t0
        plan.validate()
        rows.append({"policy": policy, "plan": plan, "build_s": built, "makespan": plan.model_makespan(c, r, model),
                     "bound": plan.lower_bound(c, r, model), "scan": scan_figures(plan)})
    return rows


def problem_text(plan) -> str:
    """``plan``'s problem (a Schedule or CompactSchedule: its lengths, tiles, heads, mask, SMs) as the first line
    of an analysis states it."""
    mask = "causal" if plan.causal else "full"
    if plan.window != ((-1, 0) if plan.causal else (-1, -1)):      # causal alone is window (-1, 0)
        mask += f" with window {plan.window}"
    group = f" in groups of {plan.group_size} per KV head" if plan.group_size > 1 else ""
    return (f"seqlen_q={plan.seqlen_q}, seqlen_k={plan.seqlen_k}, tiles {plan.block_m}x{plan.block_n} "
            f"({plan.num_m_blocks} Q x {plan.num_n_blocks} KV), {plan.num_heads} (batch, head) pairs{group}, "
            f"{mask} mask, {plan.num_sms} SMs")


def print_compact(rows, *, c, r, model, reason):
    plan = rows[0]["plan"]
    step = "max(c, r) per visit + min(c, r)" if model == "engine" else "(c + r) per visit"
    print(f"Schedule analysis from compact records ({reason}): {problem_text(plan)}")
    print(f"No per-visit simulation: column model ({model} costs c={c:g}, r={r:g}) = the busiest CTA's visits x "
          f"{step}, plus the paper's closed-form start-up (n - 1) r for tables whose dQ tiles add in ascending n "
          f"(fa3 without a right bound, descending), n = min(columns per head, CTAs); other waits are not "
          f"modelled. Every table is proven valid from its records (coverage, rank permutations, no deadlock).")
    print(f"{'policy':<16} {'CTAs':>5} {'columns':>9} {'visits':>14} {'records':>10} {'per-visit':>11} "
          f"{'build':>8} {'busiest':>11} {'model':>14} {'/ bound':>8} {'rank: compared mean/max':>26}")
    for row in rows:
        p = row["plan"]
        if row["scan"] is None:
            scan = "closed form"
        else:
            (mean, peak), (wmean, wpeak), stride = row["scan"]
            scan = f"{wmean:.0f}/{wpeak}{'~' if stride > 1 else ''} (all: {mean:.0f}/{peak})"
        mark = " " if p.column_model_applies else "*"
        print(f"{row['policy']:<16} {p.num_ctas:>5} {p.num_columns:>9} {p.num_visits:>14} {_mb(p.nbytes):>10} "
              f"{_mb(p.num_visits * ROW_BYTES):>11} {row['build_s'] * 1e3:>6.1f}ms "
              f"{int(p.loads.max()) * p.group_size:>11} {row['makespan']:>14.1f}{mark}"
              f"{row['makespan'] / row['bound']:>8.3f} {scan:>26}")
    if any(not row["plan"].column_model_applies for row in rows):
        print("* the column model misses this table's waits (columns of unequal length walked on their own "
              "clocks): a lower estimate, which schedule.build's choice by the column model leaves out")
    sampled = any(row["scan"] and row["scan"][2] > 1 for row in rows)
    print(f"rank: records the dQ writer compares per visit within the column's scan bounds (all: against every "
          f"column of the KV head that visits the tile); closed form: fa3 / descending add in n order"
          f"{'; ~: over the visits of every k-th column' if sampled else ''}")
    print(f"lower bound {rows[0]['bound']:.1f}")
    print(auto_line(plan))


def _mb(nbytes):
    return f"{nbytes / 1e6:.2f} MB" if nbytes < 1e9 else f"{nbytes / 1e9:.1f} GB"
