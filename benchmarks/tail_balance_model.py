"""The last round of a causal backward's work units, in a load-only model: how far above the ideal per-CTA load
the busiest CTA ends, for `symmetric_shift`'s pairs (today's dispatch), for pairs whose last rounds are dispatched
as single columns longest first, and for every column alone longest first (FA3's grid: one CTA per KV column,
longest first, an SM taking the next CTA when it frees up). No GPU, no ranks or waits (the engine model,
`python -m cupy_dash schedule --model engine`, has those); a unit's cost is its number of visits.

    python benchmarks/tail_balance_model.py

Column n of a causal head (Sq = Sk = S, tiles block_m x block_n) has ceil(S / block_m) - floor(n block_n / block_m)
visits; `symmetric_shift` pairs columns (k, N - 1 - k), all about equally long, and dispatches them to the CTA that
frees up first: with U pairs over G CTAs the busiest CTA takes ceil(U / G) of them against U / G on average.
"""
from __future__ import annotations

import argparse
import heapq
import math


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--num-ctas", type=int, default=132)
    ap.add_argument("--single-rounds", type=int, nargs="+", default=[0, 1, 2])
    args = ap.parse_args()
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
