"""Runs a script or a module with full-mask per-visit tables whose last partial round of KV columns is split into
pieces of their Q range: a TIMING-ONLY prototype of balancing the last wave (docs/decisions/bwd-engine.md, round 37).

Today 1,920 columns of 48 (full 3840) or 192 (full 15360) visits go to 132 CTAs: 72 CTAs run 15 columns, 60 run
14, so the SMs idle ~3 % of a steady call (benchmarks/clock_check.py's idle share). Here each CTA keeps its first
``floor(columns / CTAs)`` columns and the rest are cut into ``P`` pieces (Q tiles [p L / P, (p + 1) L / P)) handed
out round-robin, by head so that no head has more pieces in flight than Q tiles, each piece's walk rotated so that
a head's concurrent pieces of one range visit distinct Q tiles. Ranks: every dQ tile adds in the order of the
visits' positions in their CTA's list (ties by CTA), which cannot deadlock (the unfinished visit with the smallest
key always can run). ``_check`` proves coverage and ranks before the table is used; Schedule.validate() would
refuse it, since it requires each KV tile's visits to be one chain on one CTA (the kernel's dK / dV are complete
tiles).

The pieces' dK / dV are WRONG: each piece stores its partial sums as the whole tile (the stores race). The real
change would store fp32 partials and add them in a fixed order (e.g. in the postprocess); this leg measures only
what the balance is worth in time. Only MHA full-mask tables without a window are replaced.

    python benchmarks/with_split_tail.py 3 benchmarks/burst_bench.py --shapes full:3840 --tolerance 1e9 ...
    python benchmarks/with_split_tail.py 3 --model      # the load model of full 3840 / 15360, no GPU

The first argument is P; the second a script (ending in .py) or a module, as benchmarks/with_kernels.py takes them.
"""
from __future__ import annotations

import os
import sys

import numpy as np


def split_tail(base, pieces: int):
    """``base`` (a per-visit Schedule of a full mask) with its tail columns cut into ``pieces`` pieces; validated.
    ValueError where the columns are not all equally long or the CTAs already carry equal column counts."""
    from cupy_dash.schedule import per_visit
    visits, cta_start = np.asarray(base.visits), np.asarray(base.cta_start)
    G, M = base.num_ctas, base.num_m_blocks
    runs = []                                              # per CTA: [(bh, n)] in order
    for c in range(G):
        v = visits[cta_start[c]:cta_start[c + 1]]
        change = np.flatnonzero(np.any(v[1:, 1:3] != v[:-1, 1:3], axis=1)) + 1
        runs.append([(int(v[i, 1]), int(v[i, 2])) for i in np.concatenate([[0], change])])
        if len(v) != len(runs[-1]) * M:
            raise ValueError("not a full mask of whole columns")
    keep = min(len(r) for r in runs)
    tail = [col for r in runs for col in r[keep:]]
    if not tail:
        raise ValueError("no tail to split")
    L = -(-M // pieces)
    ranges = [(p * L, min(M, (p + 1) * L)) for p in range(pieces) if p * L < M]
    # Pieces by head, interleaved across heads, so that each round of G pieces spreads over the heads in flight.
    by_head = {}
    for col in tail:
        by_head.setdefault(col[0], []).extend((col, lo, hi) for lo, hi in ranges)
    order, queues = [], [list(q) for q in by_head.values()]
    while any(queues):
        for q in queues:
            if q:
                order.append(q.pop(0))
    lists = [[(bh, n, m) for bh, n in r[:keep] for m in _walk(visits, cta_start, c, bh, n, M)]
             for c, r in enumerate(runs)]
    rot = {}
    for j, ((bh, n), lo, hi) in enumerate(order):
        key = (j // G, bh, lo)                             # the round, the head, the range
        k = rot[key] = rot.get(key, -1) + 1
        span = hi - lo
        lists[j % G].extend((bh, n, lo + (k + s) % span) for s in range(span))
    rows, rank_key = [], []
    for c, lst in enumerate(lists):
        for pos, (bh, n, m) in enumerate(lst):
            rows.append((c, bh, n, m))
            rank_key.append((bh, m, pos, c))
    rows = np.asarray(rows, dtype=np.int32)
    order_idx = sorted(range(len(rows)), key=lambda i: rank_key[i])
    rank = np.zeros(len(rows), dtype=np.int32)
    prev, r = None, 0
    for i in order_idx:
        tile = rank_key[i][:2]
        r = r + 1 if tile == prev else 0
        prev = tile
        rank[i] = r
    new_start = np.concatenate([[0], np.cumsum([len(lst) for lst in lists])]).astype(np.int64)
    plan = per_visit.Schedule(base.policy, base.seqlen_q, base.seqlen_k, base.block_m, base.block_n,
                              base.num_heads, base.causal, base.num_sms, rows, rank, new_start, base.group_size,
                              base.window, base.head_section)
    return _check(plan)


def _check(plan):
    """ValueError unless every (head, n_block, m_block) is visited once and every dQ tile's ranks are 0..k-1 in
    the order of (position in the CTA's list, CTA); returns ``plan``."""
    v, rank = np.asarray(plan.visits), np.asarray(plan.rank)
    M, N = plan.num_m_blocks, plan.num_n_blocks
    tiles = (v[:, 1].astype(np.int64) * N + v[:, 2]) * M + v[:, 3]
    if len(np.unique(tiles)) != plan.num_heads * N * M or len(tiles) != plan.num_heads * N * M:
        raise ValueError("a tile is visited twice or not at all")
    pos = np.arange(len(v)) - np.repeat(np.asarray(plan.cta_start)[:-1], np.diff(plan.cta_start))
    order = np.lexsort((v[:, 0], pos, v[:, 3], v[:, 1]))
    dq_tile = v[order, 1].astype(np.int64) * M + v[order, 3]
    first = np.concatenate([[0], np.flatnonzero(np.diff(dq_tile)) + 1])
    expect = np.arange(len(v)) - np.repeat(first, np.diff(np.concatenate([first, [len(v)]])))
    if not np.array_equal(rank[order], expect):
        raise ValueError("ranks are not the visits' order")
    return plan


def makespan(plan, switch: float = 1.0) -> float:
    """The load model's makespan, in visits: each visit costs ``c`` (per_visit.AUTO_COSTS), a KV-tile switch
    ``switch``, and a visit of rank k > 0 ends no earlier than ``r`` after its tile's rank k - 1 (the rank waits).
    Visits are taken in (position, CTA) order, which every table here ranks by."""
    from cupy_dash.schedule import per_visit
    c, r = per_visit.AUTO_COSTS
    v, rank, cs = np.asarray(plan.visits), np.asarray(plan.rank), np.asarray(plan.cta_start)
    pos = np.arange(len(v)) - np.repeat(cs[:-1], np.diff(cs))
    clock, column, ends = np.zeros(plan.num_ctas), [None] * plan.num_ctas, {}
    for i in np.lexsort((v[:, 0], pos)):
        cta, bh, n, m = (int(x) for x in v[i])
        t = clock[cta] + (switch if column[cta] not in (None, (bh, n)) else 0.0)
        column[cta] = (bh, n)
        done = t + c if rank[i] == 0 else max(t + c, ends[(bh, m, int(rank[i]) - 1)] + r)
        ends[(bh, m, int(rank[i]))] = clock[cta] = done
    return float(clock.max())


def _model(pieces: int) -> None:
    from cupy_dash.schedule import auto
    for S, B in ((3840, 4), (15360, 1)):
        base = auto.build("auto", seqlen_q=S, seqlen_k=S, block_m=80, block_n=128, num_heads=16 * B, causal=False,
                          num_sms=132)
        a, b = makespan(base), makespan(split_tail(base, pieces))
        print(f"full {S}, B {B}, 80 x 128, 132 CTAs: makespan {a:.0f} -> {b:.0f} visits ({100 * (b / a - 1):+.1f} %)")


def _walk(visits, cta_start, c, bh, n, M):
    """The Q tiles CTA c visits in column (bh, n), in its order."""
    v = visits[cta_start[c]:cta_start[c + 1]]
    sel = v[(v[:, 1] == bh) & (v[:, 2] == n)]
    assert len(sel) == M
    return [int(m) for m in sel[:, 3]]


def main():
    if len(sys.argv) < 3 or not sys.argv[1].isdigit():
        sys.exit(__doc__)
    pieces, target = int(sys.argv[1]), sys.argv[2]
    if target == "--model":
        return _model(pieces)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import with_kernels
    from cupy_dash import schedule
    built = schedule.build

    def build(policy="auto", **args):
        plan = built(policy, **args)
        if args.get("causal") or args.get("group_size", 1) != 1 or tuple(args.get("window", (-1, -1))) != (-1, -1):
            return plan
        try:
            split = split_tail(plan, pieces)
        except ValueError:
            return plan
        print(f"with_split_tail: {plan!r}: busiest CTA {np.diff(plan.cta_start).max()} -> "
              f"{np.diff(split.cta_start).max()} visits", file=sys.stderr)
        return split

    schedule.build = build
    with_kernels.run_target(target, sys.argv[3:])


if __name__ == "__main__":
    main()
