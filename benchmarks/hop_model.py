"""How a backward table's makespan depends on the rank chain's hop, in the engine model with jittered visits.

The engine model of `per_visit.simulate(..., model="engine", writers=2)` (docs/schedules.md, "The two models"),
copied into Python so that each visit's compute can vary (a normal jitter of relative width ``sigma``): with
``sigma`` 0 it gives the Cython model's makespan exactly (tests/unit/test_hop_model.py). The hop ``r`` is a
reduction's time from its turn to its release, in units of a visit's compute. Round 40 measured what the turns cost
(1.9 % at full 3840, 0.8 % at causal 8k; bwd-dq-writer.md), which puts the real hop near 1.1 visits.

Two comparisons (docs/decisions/bwd-engine.md, "Rotations spread over their rectangles"; their figures in
benchmarks/results/experiments/round41_20261207/README.md):

    python benchmarks/hop_model.py spread full:3840 causal:8192      # auto's tables, plain against spread
    python benchmarks/hop_model.py halves --hdim 64 full:3840        # whole heads against half-waves

``spread`` compares the plain rotations (the tree's tables before round 42) with the tree's, whose rotations are
spread over their rectangles (both built here, in Python, by `column_records`); ``--cut N`` cuts the last wave into N
pieces first, as `auto` does. ``halves`` compares tables built here by the tree's rules (units dispatched head by
head, rotations spread where the rectangle has more rows than columns), with each head's units dispatched whole or
in two half-waves by parity (a wave then holds half the units of twice as many heads, so each head's columns in a
wave are half as many as its rectangle's rows). Shapes: the bench's (16k tokens, H * D = 2048), head dim 128
(80-query tiles for full masks and causal from 8192, 64-query below: kernels.bwd_tile) or 64 (128-query tiles).
"""
from __future__ import annotations

import argparse
import heapq

import numpy as np

NUM_SMS = 132


def makespan(visits, rank, cta_start, c: float = 1.0, r: float = 1.0, sigma: float = 0.0, seed: int = 0) -> float:
    """The engine model with two writers (_schedule._simulate_loop's rules): a visit's reduction starts once its dQ
    is handed off, its rank is reached (the previous rank's reduction has ended) and its writer is free (the
    reduction two visits back has ended, the previous one has started); it takes ``r``. The next visit's compute
    starts at the hand-off, max(its dQ ready, the previous reduction's start). Compute times c (1 + sigma N(0, 1)),
    at least 0.2 c."""
    rng = np.random.default_rng(seed)
    cost = np.maximum(0.2 * c, c * (1.0 + sigma * rng.standard_normal(len(visits))))
    tile = visits[:, 1].astype(np.int64) * (1 << 32) + visits[:, 3]
    waiting = {(int(t), int(k)): i for i, (t, k) in enumerate(zip(tile, rank))}
    reached, free = {}, {}
    C = len(cta_start) - 1
    ptr, end = np.array(cta_start[:-1], dtype=np.int64), np.array(cta_start[1:], dtype=np.int64)
    dq_ready, prev_take, prev_end = np.zeros(C), np.zeros(C), np.zeros(C)
    blocked, finish = np.zeros(C, dtype=bool), np.zeros(C)
    events = []
    for q in range(C):
        if end[q] > ptr[q]:
            dq_ready[q] = cost[ptr[q]]
            events.append((dq_ready[q], q))
    heapq.heapify(events)
    while events:
        now, q = heapq.heappop(events)
        v = ptr[q]
        t = int(tile[v])
        if rank[v] != reached.get(t, 0):
            blocked[q] = True
            continue
        start = max(now, free.get(t, 0.0))
        done = start + r
        free[t], reached[t] = done, reached.get(t, 0) + 1
        handoff = max(dq_ready[q], prev_take[q])
        prev_take[q] = start
        writer_free = max(prev_end[q], start)
        prev_end[q] = done
        ptr[q] += 1
        if ptr[q] < end[q]:
            dq_ready[q] = handoff + cost[ptr[q]]
            heapq.heappush(events, (max(dq_ready[q], writer_free), q))
        else:
            finish[q] = done
        nxt = waiting.get((t, reached[t]))
        if nxt is not None:
            q2 = int(visits[nxt, 0])
            if blocked[q2] and ptr[q2] == nxt:
                blocked[q2] = False
                heapq.heappush(events, (done, q2))
    if (ptr != end).any():
        raise ValueError("deadlock")
    return float(finish.max())


def shape_args(spec: str, hdim: int) -> dict:
    """build() arguments of a bench shape 'full:S' / 'causal:S' (16k tokens, H * D = 2048)."""
    mask, s = spec.split(":")
    s, causal = int(s), mask == "causal"
    block_m = 128 if hdim == 64 else 80 if s >= (8192 if causal else 1024) else 64      # kernels.bwd_tile
    return dict(seqlen_q=s, seqlen_k=s, block_m=block_m, block_n=128, num_heads=16384 // s * 2048 // hdim,
                causal=causal, num_sms=NUM_SMS)


def column_records(seqlen: int, block_m: int, block_n: int, heads: int, causal: bool, halves: int = 1,
                   num_sms: int = NUM_SMS, policy: str = "symmetric_shift", spread: bool = True):
    """The compact records (a CompactSchedule) of `shift` (full) or paired `symmetric_shift` (causal) at
    Sq = Sk, built here by the builder's rules (round 41's spread rectangles, merged in round 42): units (a column; a
    causal pair (k, N - 1 - k)) dispatched head by head to the CTA with the least load (ties: the lowest index);
    column k of a full mask rotated by k M // N (k mod M when M = N); a causal wave's long columns by i W // k over
    their rectangle of W rows (i: the index among the head's k long columns in the wave), then their triangle
    ascending, the short column descending. ``spread`` False: the plain rotations of the tree before round 42 (k mod
    M, i mod W). ``halves`` 2: each head's units in two half-waves by parity of k (chunks of heads whose even units
    fill a wave, then their odd ones), so that a wave holds half of each head's columns and a full mask's rotation k
    mod M puts them two Q tiles apart. With ``halves`` 1 the records are the tree's (every array;
    tests/unit/test_hop_model.py). Half-waves break what the compact
    path's scan bounds assume (a head's columns dispatched in runs of its lowest and highest n), so their records
    serve only per-visit tables: validate those (``to_schedule().validate()``)."""
    from cupy_dash.schedule import compact
    M, N = -(-seqlen // block_m), -(-seqlen // block_n)
    lo = [n * block_n // block_m for n in range(N)]
    P = (N + 1) // 2 if causal else N
    if halves == 1:
        units = [(h, k) for h in range(heads) for k in range(P)]
    else:
        chunk = max(1, num_sms * halves // P)
        units = [(h, k) for h0 in range(0, heads, chunk) for part in range(halves)
                 for h in range(h0, min(heads, h0 + chunk)) for k in range(P) if k % halves == part]
    G = min(num_sms, len(units))
    records = np.zeros((heads * N, 8), dtype=np.int32)
    lists, order, load = [[] for _ in range(G)], [], [(0, q) for q in range(G)]
    for u, (h, k) in enumerate(units):
        t, q = heapq.heappop(load)
        if causal:
            wave = [kk for hh, kk in units[u // G * G:(u // G + 1) * G] if hh == h]
            i, count, split = wave.index(k), len(wave), lo[max(wave)]
            W = M - split
            rot = i * W // count if W > count and spread else i % W
            cols = [(k, lo[k], split, rot)] + ([(N - 1 - k, lo[N - 1 - k], -1, 0)] if N - 1 - k != k else [])
        else:
            cols = [(k, 0, 0, k * M // N if M > N and spread else k % M)]
        for n, first, split, rot in cols:
            records[h * N + n] = (t, first, M, split, rot, q, h, n)
            lists[q].append(h * N + n)
            order.append(h * N + n)
            t += M - first
        heapq.heappush(load, (t, q))
    args = (seqlen, seqlen, block_m, block_n, heads, causal, num_sms, 1, (-1, 0) if causal else (-1, -1), 0)
    tie = 1 if policy == "shift" else -1           # `shift` is full masks only here: its columns never tie
    meta = {"M": M, "N": N, "n_first": 0, "NC": N, "num_ctas": G, "tie_sign": tie, "rank_rule": 0}
    loads = np.zeros(G, dtype=np.int64)
    for t, q in load:
        loads[q] = t
    return compact.CompactSchedule(policy, args, records,
                                   np.array([i for x in lists for i in x], dtype=np.int32),
                                   np.r_[0, np.cumsum([len(x) for x in lists])].astype(np.int64),
                                   np.array(order, dtype=np.int64), loads, meta)


def _tables(mode: str, spec: str, hdim: int, cut: int) -> dict:
    """{leg name: (visits, rank, cta_start)} of one comparison."""
    args = shape_args(spec, hdim)
    if mode == "halves":
        out = {}
        for name, halves in (("whole", 1), ("halves", 2)):
            plan = column_records(args["seqlen_q"], args["block_m"], args["block_n"], args["num_heads"],
                                  args["causal"], halves).to_schedule().validate()
            out[name] = (np.asarray(plan.visits), np.asarray(plan.rank), np.asarray(plan.cta_start))
        return out
    from cupy_dash.schedule import pieces
    out = {}
    for name in ("plain", "spread"):
        plan = column_records(args["seqlen_q"], args["block_m"], args["block_n"], args["num_heads"], args["causal"],
                              spread=name == "spread").to_schedule()
        if cut:
            plan = pieces.split_for_kernel(plan, cut)
        out[name] = (np.asarray(plan.visits), np.asarray(plan.rank), np.asarray(plan.cta_start))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=("spread", "halves"))
    ap.add_argument("shapes", nargs="+")
    ap.add_argument("--hdim", type=int, default=128, choices=(64, 128))
    ap.add_argument("--hops", type=float, nargs="+", default=[0.8, 1.0, 1.1, 1.2])
    ap.add_argument("--sigma", type=float, default=0.05)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--cut", type=int, default=0, help="spread: pieces per cut column of the last wave (0: uncut)")
    opts = ap.parse_args()
    for spec in opts.shapes:
        legs = _tables(opts.mode, spec, opts.hdim, opts.cut)
        ideal = len(next(iter(legs.values()))[0]) / NUM_SMS
        for r in opts.hops:
            t = {name: np.mean([makespan(*tab, r=r, sigma=opts.sigma, seed=s) for s in range(opts.seeds)]) / ideal
                 for name, tab in legs.items()}
            (a, x), (b, y) = t.items()
            print(f"{spec} d{opts.hdim} hop {r}: {a} {x:.4f}  {b} {y:.4f}  ({(y / x - 1) * 100:+.2f} %)", flush=True)


if __name__ == "__main__":
    main()
