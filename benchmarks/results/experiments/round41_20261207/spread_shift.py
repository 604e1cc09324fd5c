"""Rotations spread over their shared rectangles in place of the tree's (patches/spread_rectangles.patch: full
masks' shift columns start at Q tile k L // NC, a causal symmetric_shift wave's long columns rotate by i W // k),
applied to the records that ``compact._build_compact`` returns (per-visit tables are expanded from them, ranks
derived from their keys; compact tables read them). For an A/B of the two in one device run:

    python spread_shift.py benchmarks/burst_bench.py --impls dash_det ...      # a script or a module
    PYTHONPATH=<this folder> python -m pytest -p spread_shift -n 8 tests/gpu/...  # a pytest plugin (xdist too)

Fixed-length problems without a window under `shift` and `symmetric_shift` (auto's choice at the bench shapes);
their tables are the patch's exactly (checked on the CPU). Varlen tables are not reached. For trees before
21e8bd4 only: that commit merged the patch, and on later trees the records are spread already (spread_pairs asserts).
"""
import functools

import numpy as np

import records_swap

LO, HI, SPLIT, ROT, CTA, HEAD, N = 1, 2, 3, 4, 5, 6, 7      # _records.pxd's fields


def spread_full(plan, rec) -> bool:
    """Full masks (every column on one rectangle [lo, M) of L > NC tiles): column k rotated by k L // NC."""
    M, NC = plan.num_m_blocks, plan.columns_per_head
    L = rec[:, HI] - rec[:, LO]
    if not ((rec[:, LO] == rec[0, LO]).all() and (rec[:, HI] == M).all()) or L[0] <= NC:
        return False
    rotated = rec[:, SPLIT] == rec[:, LO]
    rec[rotated, ROT] = (rec[rotated, N] - plan.n_first) * L[rotated] // NC
    return True


def spread_pairs(plan, rec) -> bool:
    """Causal `symmetric_shift` pairs (k, NC - 1 - k), one per CTA, units dispatched head by head: the long column
    of unit u = head P + k, in wave w = u // G (G CTAs), rotates by its index i in the wave's k' columns of its
    head, spread to i W // k' over the rectangle's W = M - split rows when W > k' (the builder's pair_rectangle)."""
    M, NC, G = plan.num_m_blocks, plan.columns_per_head, plan.num_ctas
    P = (NC + 1) // 2
    k = rec[:, N] - plan.n_first
    long, short = k < P, k >= P
    if not (rec[short, SPLIT] == -1).all() or not (rec[long, SPLIT] >= 0).all():
        return False
    head = rec[:, HEAD].astype(np.int64)
    partner = head * NC + (NC - 1 - k)                     # records are in (kv head, n_block) order
    if not (rec[partner[short], CTA] == rec[short, CTA]).all():
        return False
    for i in np.flatnonzero(long):
        base, u = head[i] * P, head[i] * P + k[i]
        w = u // G
        k0 = max(w * G, base) - base
        k1 = min((w + 1) * G, base + P) - 1 - base
        W, count, idx = M - rec[i, SPLIT], k1 - k0 + 1, u - base - k0
        assert rec[i, ROT] == idx % W, "not the plain rectangle rotation"
        rec[i, ROT] = idx * W // count if W > count else idx % W
    return True


def spread_rotation(build):
    """``compact._build_compact`` with the spread rotations."""
    from cupy_dash.schedule import compact

    @functools.lru_cache(maxsize=64)
    def wrapped(policy, seqlen_q, seqlen_k, block_m, block_n, num_heads, causal, num_sms, group_size=1,
                window=(-1, -1), head_section=0):
        args = (seqlen_q, seqlen_k, block_m, block_n, num_heads, causal, num_sms, group_size, tuple(window),
                head_section)
        plan = build(policy, *args)
        if policy not in ("shift", "symmetric_shift") or tuple(window) != ((-1, 0) if causal else (-1, -1)):
            return plan                         # (canonical windows: causal is right bound 0)
        rec = np.array(plan.records)
        if not spread_full(plan, rec) and not (policy == "symmetric_shift" and causal and spread_pairs(plan, rec)):
            return plan
        meta = {"M": plan.num_m_blocks, "N": plan.num_n_blocks, "n_first": plan.n_first,
                "NC": plan.columns_per_head, "num_ctas": plan.num_ctas, "tie_sign": plan.tie_sign,
                "rank_rule": plan.rank_rule}
        return compact.CompactSchedule(plan.policy, args, rec, np.array(plan.cta_columns),
                                       np.array(plan.cta_col_start), np.array(plan._dispatch_order),
                                       np.array(plan.loads), meta).validate()
    return wrapped


# apply(): every table built from now on in this process takes the wrapper's records (call before the first build)
apply, pytest_configure = records_swap.plugin("spread", spread_rotation)

if __name__ == "__main__":
    records_swap.main(__doc__, apply)
