"""Runs a script or a module with per-visit tables whose last wave is cut into pieces: a TIMING-ONLY prototype of
balancing the last wave (docs/decisions/bwd-engine.md, "The clock read from the kernel, and the last wave").

At full 3840 / 15360, 1,920 columns of 48 / 192 visits go to 132 CTAs: 72 CTAs run 15 columns and 60 run 14, so the
SMs idle ~3 % of a steady call (benchmarks/clock_check.py's idle share). ``split_tail`` keeps each CTA's columns up
to the least-loaded CTA's load and cuts the rest into ``P`` pieces of their Q range (thirds: 16 of 48 Q tiles),
each to the least-loaded CTA, the heads interleaved, each piece's walk rotated so that a head's pieces of one range
in flight visit distinct Q tiles. Ranks: every dQ tile adds in the order of its visits' positions in their CTA's list
(ties by CTA), which cannot deadlock (the unfinished visit with the smallest key can always run). ``_check`` proves
coverage and ranks before a table is used; Schedule.validate() would refuse it, since it requires each KV tile's
visits to be one chain on one CTA (the kernel's dK / dV are complete tiles). ``makespan`` is the load model.

The pieces' dK / dV are WRONG: each piece stores its partial sums as the whole tile (the stores race). The real
change would store fp32 partials and add them in a fixed order; this leg measures only what the balance is worth in
time. Only MHA tables without a window are replaced: full masks with ``P``, causal ones with ``realtrim``.

    python benchmarks/with_split_tail.py 3 benchmarks/burst_bench.py --shapes full:3840 --tolerance 1e9 ...
    python benchmarks/with_split_tail.py 3 --model      # the load model of the bench's long shapes, no GPU
    python benchmarks/with_split_tail.py realtrim benchmarks/burst_bench.py --shapes causal:8192 causal:16384 ...

The first argument is P, or ``real<P>`` (e.g. ``real3``): the product's split tables (cupy_dash/schedule/pieces.py),
whose pieces' fp32 partial sums the kernel adds in a fixed order (kernels_src/bwd/pieces.cuh): dK / dV right, so
peers' gradient checks apply; or ``realtrim`` (``trim`` too, round 37's name for its timing-only form, which the
real one replaced): the product's ``trim_tail`` of causal tables, each CTA's list cut at the mean load and the cut
remainders moved whole (two pieces per cut column). The second is a script
(ending in .py) or a module, as benchmarks/with_kernels.py takes them.

    python benchmarks/with_split_tail.py real3 benchmarks/burst_bench.py --shapes full:3840 full:15360 ...
"""
from __future__ import annotations

import os
import sys

import numpy as np

from cupy_dash.schedule import pieces as product


def split_tail(base, pieces: int, floor: int | None = None):
    """``base`` (a per-visit Schedule) with its tail cut into pieces; checked (``_check``). Each CTA keeps its runs
    (KV columns) while its load stays within the least-loaded CTA's; every column left over is cut into ``pieces``
    ranges of ceil(num_m_blocks / pieces) Q tiles (full mask: equal thirds; causal: a short column in fewer), and
    each piece goes to the least-loaded CTA, pieces of the heads interleaved. ``floor``: the load each CTA keeps up
    to (default: the least-loaded CTA's). ValueError if nothing is left over."""
    M = base.num_m_blocks
    lists, tail = product.keep_to(base, int(np.diff(base.cta_start).min()) if floor is None else floor)
    if not tail:
        raise ValueError("no tail to split")
    L = -(-M // pieces)
    by_head = {}                                           # per head: (column, lo, hi) of its pieces
    for col, tiles in tail:
        lo, hi = min(tiles), max(tiles) + 1
        by_head.setdefault(col[0], []).extend((col, a, min(hi, a + L)) for a in range(lo, hi, L))
    order, queues = [], [list(q) for q in by_head.values()]
    while any(queues):                                     # the heads interleaved
        for q in queues:
            if q:
                order.append(q.pop(0))
    rot, pieces_rows = {}, []
    for (bh, n), lo, hi in order:
        k = rot[(bh, lo)] = rot.get((bh, lo), -1) + 1      # a head's pieces of one range start apart
        pieces_rows.append([(bh, n, lo + (k + s) % (hi - lo)) for s in range(hi - lo)])
    product.hand_out(lists, pieces_rows)
    return _check(product.ranked(base, lists), base)


def _check(plan, base):
    """ValueError unless ``plan`` visits the tiles ``base`` visits, each once, and every dQ tile's ranks are 0..k-1
    in the order of (position in the CTA's list, CTA); returns ``plan``."""
    v, rank = np.asarray(plan.visits), np.asarray(plan.rank)
    M, N = plan.num_m_blocks, plan.num_n_blocks

    def tiles(x):
        return np.sort((x[:, 1].astype(np.int64) * N + x[:, 2]) * M + x[:, 3])
    mine = tiles(v)
    if np.any(mine[1:] == mine[:-1]) or not np.array_equal(mine, tiles(np.asarray(base.visits))):
        raise ValueError("a tile is visited twice or not at all")
    if not np.array_equal(rank, product.rank_by_position(v, np.asarray(plan.cta_start), M)):
        raise ValueError("ranks are not the visits' order")
    return plan


def makespan(plan, switch: float = 1.0) -> float:
    """The load model's makespan, in visits: each visit costs ``c`` (per_visit.AUTO_COSTS), a KV-tile switch
    ``switch``, and a visit of rank k > 0 ends no earlier than ``r`` after its tile's rank k - 1 ends (the rank
    waits). Each CTA runs its list in order; a CTA whose next visit's predecessor has not ended waits for it.
    per_visit.simulate's engine model would refuse these tables: it validates them first."""
    from cupy_dash.schedule import per_visit
    c, r = per_visit.AUTO_COSTS
    v, rank, cs = np.asarray(plan.visits), np.asarray(plan.rank), np.asarray(plan.cta_start)
    clock, column, nxt = np.zeros(plan.num_ctas), [None] * plan.num_ctas, cs[:-1].copy()
    ends, waiting = {}, {}
    ready = list(range(plan.num_ctas))
    while ready:
        cta = ready.pop()
        while nxt[cta] < cs[cta + 1]:
            i = nxt[cta]
            _, bh, n, m = (int(x) for x in v[i])
            k = int(rank[i])
            if k > 0 and (bh, m, k - 1) not in ends:
                waiting[(bh, m, k - 1)] = cta
                break
            t = clock[cta] + (switch if column[cta] not in (None, (bh, n)) else 0.0)
            column[cta] = (bh, n)
            clock[cta] = ends[(bh, m, k)] = t + c if k == 0 else max(t + c, ends[(bh, m, k - 1)] + r)
            nxt[cta] += 1
            if (bh, m, k) in waiting:
                ready.append(waiting.pop((bh, m, k)))
    if np.any(nxt != cs[1:]):
        raise ValueError("the table deadlocks")
    return float(clock.max())


def _model(pieces: int) -> None:
    from cupy_dash.schedule import auto
    for causal, S in ((False, 3840), (False, 15360), (True, 8192), (True, 16384)):
        B = (16384 if causal else 15360) // S
        base = auto.build("auto", seqlen_q=S, seqlen_k=S, block_m=80, block_n=128, num_heads=16 * B, causal=causal,
                          num_sms=132)
        a, b, t = makespan(base), makespan(split_tail(base, pieces)), makespan(product.trim_tail(base))
        print(f"{'causal' if causal else 'full'} {S}, B {B}, 80 x 128, 132 CTAs: makespan {a:.0f} visits; in "
              f"{pieces} pieces {b:.0f} ({100 * (b / a - 1):+.1f} %); trimmed {t:.0f} ({100 * (t / a - 1):+.1f} %)")


def replaces(args: dict, trim: bool) -> bool:
    """Whether the wrapper replaces the table that schedule.build(**args) makes: MHA without a window, causal with
    ``trim`` and full masks without it."""
    from cupy_dash import schedule
    causal = bool(args.get("causal"))
    unwindowed = schedule.canonical_window((-1, -1), args["seqlen_q"], args["seqlen_k"], causal)
    # NOTES: callers pass the window in canonical form: a causal mask's is (-1, 0), not (-1, -1)
    return causal == trim and args.get("group_size", 1) == 1 and tuple(args.get("window", unwindowed)) == unwindowed


def main():
    mode = sys.argv[1] if len(sys.argv) >= 3 else ""
    real = mode in ("trim", "realtrim") or (mode.startswith("real") and mode[4:].isdigit())
    if not (mode.isdigit() or real):
        sys.exit(__doc__)
    trim, target = mode in ("trim", "realtrim"), sys.argv[2]
    pieces = 3 if trim else int(mode[4:] if real else mode)
    if target == "--model":
        return _model(pieces)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import with_kernels
    from cupy_dash import schedule
    built = schedule.build

    def build(policy="auto", **args):
        plan = built(policy, **args)
        if not replaces(args, trim) or (real and plan.policy in schedule.PORTABLE_POLICIES):
            return plan
        if real:
            split = product.trim_tail(plan) if trim else product.split_tail(plan, pieces)
            if split is plan:
                return plan
        else:
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
