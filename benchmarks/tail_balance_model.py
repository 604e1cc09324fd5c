"""The last round of a causal backward's work units, in a load-only model: how far above the ideal per-CTA load
the busiest CTA ends, for `symmetric_shift`'s pairs (today's dispatch), for pairs whose last rounds are dispatched
as single columns longest first, and for every column alone longest first (FA3's grid: one CTA per KV column,
longest first, an SM taking the next CTA when it frees up). No GPU, no ranks or waits (the engine model,
`python -m cupy_dash schedule --model engine`, has those); a unit's cost is its number of visits.

    python benchmarks/tail_balance_model.py

Column n of a causal head (Sq = Sk = S, tiles block_m x block_n) has ceil(S / block_m) - floor(n block_n / block_m)
visits; `symmetric_shift` pairs columns (k, N - 1 - k), all about equally long, and dispatches them to the CTA that
frees up first: with U pairs over G CTAs the busiest CTA takes ceil(U / G) of them against U / G on average.

``--engine``: a prototype of the change on real tables: `symmetric_shift`'s compact records with the last
``--single-rounds`` rounds of pairs (and the partial one) re-dispatched as single columns longest first, each
column's Q tiles in the order ``--tail-order`` (``rotated``: the rectangle its head's tail columns share, rotated by
the column's index among them, then its own triangle ascending; ``descending``), proven valid by ``validate()``
(coverage, ranks, no deadlock, the dQ writer's scan bounds) and simulated in the engine model (rank waits
included) beside the unchanged table.
"""
from __future__ import annotations

import argparse
import heapq
import math

import numpy as np


def column_visits(seqlen: int, block_m: int, block_n: int) -> list:
    """Visits of each KV column of one causal head (bottom-right aligned, Sq = Sk = seqlen)."""
    m_tiles = math.ceil(seqlen / block_m)
    return [m_tiles - (block_n * n) // block_m for n in range(math.ceil(seqlen / block_n))]


def busiest(units, num_ctas: int) -> int:
    """The busiest CTA's load when ``units`` (costs, in dispatch order) go to the CTA that frees up first."""
    loads = [(0, c) for c in range(num_ctas)]
    for cost in units:
        load, c = heapq.heappop(loads)
        heapq.heappush(loads, (load + cost, c))
    return max(load for load, _ in loads)


def makespans(seqlen: int, block_m: int, block_n: int, heads: int, num_ctas: int, single_rounds: int) -> dict:
    """Busiest load over the ideal (total / num_ctas) for the three dispatches; ``single_rounds``: how many rounds
    of pairs before the last, partial one are dispatched as single columns too."""
    cols = column_visits(seqlen, block_m, block_n)
    n_cols = len(cols)
    pairs = [(k, n_cols - 1 - k) for k in range(n_cols // 2)] * heads
    alone = [cols[n_cols // 2]] * heads if n_cols % 2 else []
    ideal = heads * sum(cols) / num_ctas
    keep = max(0, (len(pairs) // num_ctas - single_rounds) * num_ctas)
    tail = sorted([cols[k] for pair in pairs[keep:] for k in pair] + alone, reverse=True)
    return {
        "pairs": busiest([cols[a] + cols[b] for a, b in pairs] + alone, num_ctas) / ideal,
        "pairs, singles at the end": busiest([cols[a] + cols[b] for a, b in pairs[:keep]] + tail, num_ctas) / ideal,
        "every column alone, longest first": busiest(sorted(cols * heads, reverse=True), num_ctas) / ideal,
    }


F = {"step": 0, "lo": 1, "hi": 2, "split": 3, "rot": 4, "cta": 5, "head": 6, "n": 7}   # _records.pxd's fields


def tail_plan(seqlen: int, block_m: int, block_n: int, heads: int, num_ctas: int, single_rounds: int,
              tail_order: str = "descending", section: int = 0):
    """(unchanged symmetric_shift compact plan of a causal problem, :func:`retail` of it)."""
    from cupy_dash.schedule import compact
    base = compact._build_compact("symmetric_shift", seqlen, seqlen, block_m, block_n, heads, True, num_ctas)
    return base, retail(base, single_rounds, tail_order, section)


def retail(base, single_rounds: int, tail_order: str = "descending", section: int = 0):
    """``base`` (symmetric_shift compact records whose dispatch order is all pairs) with its last partial round of
    pairs and the ``single_rounds`` before it re-dispatched as single columns, longest first within sections of
    ``section`` heads, one section after the other (0: one section); validated. ValueError if ``base`` is not all
    pairs (an odd number of columns per head, a band)."""
    from cupy_dash.schedule import compact
    rec, order, num_ctas = base.records.copy(), np.asarray(base._dispatch_order), base.num_ctas
    pairs = order.reshape(-1, 2) if len(order) % 2 == 0 else None    # unit u: records order[2u], order[2u + 1]
    if pairs is None or not (np.all(rec[pairs[:, 0], F["cta"]] == rec[pairs[:, 1], F["cta"]]) and np.all(
            rec[pairs[:, 0], F["n"]] + rec[pairs[:, 1], F["n"]] == 2 * base.n_first + base.columns_per_head - 1)):
        raise ValueError("the prototype takes symmetric_shift tables of pairs only")
    units = len(pairs)
    keep = max(0, (units // num_ctas - single_rounds) * num_ctas)
    kept = order[:2 * keep]
    loads = np.zeros(num_ctas, dtype=np.int64)
    np.maximum.at(loads, rec[kept, F["cta"]], rec[kept, F["step"]] + rec[kept, F["hi"]] - rec[kept, F["lo"]])
    tail = sorted(order[2 * keep:], key=lambda i: (rec[i, F["head"]] // section if section else 0,
                                                   -(rec[i, F["hi"]] - rec[i, F["lo"]]), rec[i, F["head"]],
                                                   rec[i, F["n"]]))
    heap = [(int(loads[c]), c) for c in range(num_ctas)]
    heapq.heapify(heap)
    shared, index = {}, {}        # rotated: per head, the start of the rectangle its tail columns share; a counter
    for i in tail:
        head = int(rec[i, F["head"]])
        shared[head] = max(shared.get(head, 0), int(rec[i, F["lo"]]))
    for i in tail:
        load, c = heapq.heappop(heap)
        length = int(rec[i, F["hi"]] - rec[i, F["lo"]])
        rec[i, F["cta"]], rec[i, F["step"]] = c, load
        heapq.heappush(heap, (load + length, c))
        loads[c] = load + length
        head = int(rec[i, F["head"]])
        if tail_order == "descending":
            rec[i, F["split"]], rec[i, F["rot"]] = -1, 0
        else:
            k = index[head] = index.get(head, -1) + 1
            rec[i, F["split"]], rec[i, F["rot"]] = shared[head], k % (int(rec[i, F["hi"]]) - shared[head])
    new_order = np.concatenate([kept, np.array(tail, dtype=order.dtype)])
    by_cta = sorted(range(len(rec)), key=lambda i: (rec[i, F["cta"]], rec[i, F["step"]]))
    cta_columns = np.array(by_cta, dtype=base.cta_columns.dtype)
    cta_col_start = np.searchsorted(rec[by_cta, F["cta"]], np.arange(num_ctas + 1)).astype(base.cta_col_start.dtype)
    meta = {"M": base.num_m_blocks, "N": base.num_n_blocks, "n_first": base.n_first, "NC": base.columns_per_head,
            "num_ctas": num_ctas, "tie_sign": base.tie_sign, "rank_rule": base.rank_rule}
    args = (base.seqlen_q, base.seqlen_k, base.block_m, base.block_n, base.num_heads, base.causal, base.num_sms,
            base.group_size, base.window, base.head_section)
    plan = compact.CompactSchedule(base.policy, args, rec, cta_columns, cta_col_start, new_order,
                                   loads.astype(base.loads.dtype), meta)
    return plan.validate()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--num-ctas", type=int, default=132)
    ap.add_argument("--single-rounds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--engine", action="store_true", help="prototype tables in the engine model")
    ap.add_argument("--tail-order", choices=["descending", "rotated"], default="descending")
    ap.add_argument("--section", type=int, default=0, help="heads per section of the tail's dispatch (0: all)")
    args = ap.parse_args()
    if args.engine:
        from cupy_dash.schedule import per_visit
        c, r = per_visit.AUTO_COSTS
        for hdim, seqlen, block_m, heads in [(128, 4096, 64, 64), (128, 8192, 80, 32), (128, 16384, 80, 16)]:
            for rounds in args.single_rounds:
                base, plan = tail_plan(seqlen, block_m, 128, heads, args.num_ctas, rounds, args.tail_order,
                                       args.section)
                b = base.to_schedule()
                t = plan.to_schedule()
                bound = b.lower_bound(c, r, "engine")
                print(f"d{hdim} causal {seqlen} {block_m}x128, R={rounds} ({args.tail_order}, section "
                      f"{args.section}): engine makespan / bound {b.simulate(c, r, 'engine') / bound:.4f} -> "
                      f"{t.simulate(c, r, 'engine') / bound:.4f}")
        return
    # (head dim, S, block_m, block_n): the bench's causal shapes (16k tokens, H * D = 2048) and their tile plans
    shapes = [(128, 2048, 64, 128), (128, 4096, 64, 128), (128, 8192, 80, 128), (128, 16384, 80, 128),
              (64, 2048, 128, 128), (64, 8192, 128, 128), (64, 16384, 128, 128)]
    print("busiest CTA's visits / ideal; causal, 16k tokens, H * D = 2048, "
          f"{args.num_ctas} CTAs; R = rounds of pairs dispatched as single columns besides the last")
    for hdim, seqlen, block_m, block_n in shapes:
        heads = (16384 // seqlen) * (2048 // hdim)
        row = [f"d{hdim} S={seqlen} {block_m}x{block_n}:"]
        for r in args.single_rounds:
            m = makespans(seqlen, block_m, block_n, heads, args.num_ctas, r)
            if r == args.single_rounds[0]:
                row.append(f"pairs {m['pairs']:.4f}")
            row.append(f"R={r} {m['pairs, singles at the end']:.4f}")
        row.append(f"all alone {m['every column alone, longest first']:.4f}")
        print("  ".join(row))


if __name__ == "__main__":
    main()
