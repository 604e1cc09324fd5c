"""The MMA warpgroups' phases of a backward visit from the timeline build's %clock64 stamps
(kernels_src/bwd/timeline.cuh, columns 4 + 8 wg + s), and how long each CTA's tensor pipe has no GEMM in flight.
Pure numpy: benchmarks/timeline.py runs the kernel and calls :func:`phase_report`.

A warpgroup has GEMMs in flight from S^T's issue to dP^T's completion and from dV's issue to dK's completion; when
neither warpgroup of a CTA has, its SM's tensor pipe is idle. That idle share is a lower bound of the pipe's idle
time (a GEMM in flight may still wait for the pipe): if it is large, the two warpgroups' softmaxes overlap and the
ping-pong between them is what to change; if small, the GEMMs themselves run slow.

A stamp is a clock read, and ptxas moves arithmetic across it. In the 80-query timeline build it puts the dP^T
stamp after 36 of the softmax's 40 `MUFU.EX2` (cuobjdump, 2026-12-07). So "P^T, dP^T wait" holds the exponent stretch
there, and that build reads the same with the exponents held before the wait, where Nsight Compute finds the
production kernels 245 cycles per visit apart (benchmarks/results/experiments/round35_20261207/README.md, call 1).
Check the SASS around a stamp before reading a phase boundary.
"""
from __future__ import annotations

import collections

import numpy as np

WG_BASE, WG_STAMPS = 4, 10                      # timeline.cuh: column 4 + WG_STAMPS * wg + stamp
TOP, S_ISSUE, DP_ISSUE, S_DONE, DP_DONE, DV_ISSUED, BARRIER, DQ_DONE, DK_DONE, SM = range(10)
PROD_Q, PROD_DO = WG_BASE + 2 * WG_STAMPS, WG_BASE + 2 * WG_STAMPS + 1   # timeline.cuh's ProducerStamp columns

# (name, from stamp, to stamp) within one visit; "between visits" runs from the warpgroup's previous visit's end
PHASES = (("Q wait", TOP, S_ISSUE), ("dO wait", S_ISSUE, DP_ISSUE), ("S^T wait", DP_ISSUE, S_DONE),
          ("P^T, dP^T wait", S_DONE, DP_DONE), ("dS^T, dV issue", DP_DONE, DV_ISSUED),
          ("dS^T barrier", DV_ISSUED, BARRIER), ("dQ wait", BARRIER, DQ_DONE), ("dQ hand-off, dK wait", DQ_DONE,
                                                                                   DK_DONE))


def wg_stamps(stamps: np.ndarray, wg: int) -> np.ndarray:
    """(V, WG_STAMPS) int64: warpgroup wg's stamps of every visit (the SM id in column SM, warpgroup 0 only)."""
    return stamps[:, WG_BASE + WG_STAMPS * wg: WG_BASE + WG_STAMPS * (wg + 1)]


def _union_gaps(intervals: np.ndarray) -> np.ndarray:
    """(g, 2): the gaps inside the span of closed intervals (n, 2) that no interval covers, in time order."""
    if len(intervals) == 0:
        return np.zeros((0, 2), dtype=np.int64)
    iv = intervals[np.argsort(intervals[:, 0], kind="stable")]
    reach = np.maximum.accumulate(iv[:, 1])
    open_ = iv[1:, 0] > reach[:-1]
    return np.stack([reach[:-1][open_], iv[1:, 0][open_]], axis=1)


def _union_length(intervals: np.ndarray) -> int:
    """Total length of the union of closed intervals (n, 2): their span less the gaps that no interval covers."""
    if len(intervals) == 0:
        return 0
    gaps = _union_gaps(intervals)
    return int(intervals[:, 1].max() - intervals[:, 0].min() - (gaps[:, 1] - gaps[:, 0]).sum())


# the phase a warpgroup is in after each of its stamps TOP..DK_DONE (after DK_DONE: until the next visit's TOP)
PHASE_AFTER = tuple(name for name, _, _ in PHASES) + ("between visits",)


def _phase_at(t: np.ndarray, when: np.ndarray) -> np.ndarray:
    """Index into PHASE_AFTER of the phase one warpgroup is in at each time of ``when``; t: (n, WG_STAMPS) its
    stamps over one CTA's visits (rows in time order)."""
    flat = t[:, :DK_DONE + 1].ravel()
    i = np.searchsorted(flat, when, side="right") - 1
    return np.clip(i, 0, None) % (DK_DONE + 1)


def _cta_cycles(w: list) -> int:
    """One CTA's cycles, its first S^T issue to its last dK done; ``w``: both warpgroups' stamps of its visits."""
    return int(max(t[:, DK_DONE].max() for t in w) - min(t[:, S_ISSUE].min() for t in w))


def _deciles(x: np.ndarray) -> tuple:
    """(p10, p50, p90) of x, zeros if empty."""
    return tuple(float(v) for v in np.percentile(x, (10, 50, 90))) if len(x) else (0.0, 0.0, 0.0)


def load_report(stamps: np.ndarray, cta_start: np.ndarray, stages: int = 2) -> dict:
    """Deciles (p10, p50, p90 cycles) of the Q and dO loads' timing: "Q issued after release" (the producer's
    Q issue less the later dK done of the visit ``stages`` earlier in the CTA, which freed the stage), "Q issued
    -> S^T issued" and "dO issued -> dP^T issued" (the earlier warpgroup). Empty without producer stamps."""
    stamps = np.asarray(stamps, dtype=np.int64)
    if stamps.shape[1] <= PROD_DO or not (stamps[:, PROD_Q] > 0).any():
        return {}
    w0, w1 = wg_stamps(stamps, 0), wg_stamps(stamps, 1)
    after = []
    for a, b in zip(cta_start[:-1], cta_start[1:]):
        if b - a > stages:
            freed = np.maximum(w0[a:b - stages, DK_DONE], w1[a:b - stages, DK_DONE])
            after.append(stamps[a + stages:b, PROD_Q] - freed)
    return {"Q issued after release": _deciles(np.concatenate(after) if after else np.zeros(0)),
            "Q issued -> S^T issued": _deciles(np.minimum(w0[:, S_ISSUE], w1[:, S_ISSUE]) - stamps[:, PROD_Q]),
            "dO issued -> dP^T issued": _deciles(np.minimum(w0[:, DP_ISSUE], w1[:, DP_ISSUE]) - stamps[:, PROD_DO])}


# The two warpgroups' S^T and dP^T issues and completions, as gemm_order_report names them
GEMM_EVENTS = (("S0 issue", 0, S_ISSUE), ("S1 issue", 1, S_ISSUE), ("dP0 issue", 0, DP_ISSUE),
               ("dP1 issue", 1, DP_ISSUE), ("S0 done", 0, S_DONE), ("S1 done", 1, S_DONE), ("dP0 done", 0, DP_DONE),
               ("dP1 done", 1, DP_DONE))


def gemm_order_report(stamps: np.ndarray) -> dict:
    """How the two warpgroups' S^T and dP^T share the tensor pipe. ``after_issue``: each event of GEMM_EVENTS, its
    mean cycles after the visit's first S^T issue (either warpgroup's); ``orders``: the order of the four completions
    in a visit (e.g. "S0 S1 dP0 dP1": both S^T before either dP^T) -> its share of the visits, most frequent first
    (ties in the order first seen). If the warpgroups' GEMMs ran one after the other, warpgroup 0's dP^T would
    complete about halfway; if their k-steps interleave, both dP^T complete near the end."""
    stamps = np.asarray(stamps, dtype=np.int64)
    if len(stamps) == 0:
        return {"after_issue": {}, "orders": {}}
    t = np.stack([wg_stamps(stamps, wg)[:, col] for _, wg, col in GEMM_EVENTS], axis=1)
    first = np.minimum(t[:, 0], t[:, 1])
    after = {name: float(np.mean(t[:, i] - first)) for i, (name, _, _) in enumerate(GEMM_EVENTS)}
    names = [name.split()[0] for name, _, _ in GEMM_EVENTS[4:]]
    seen = collections.Counter(" ".join(names[i] for i in row) for row in np.argsort(t[:, 4:], axis=1, kind="stable"))
    return {"after_issue": after, "orders": {order: n / len(t) for order, n in seen.most_common()}}


def phase_report(stamps: np.ndarray, cta_start: np.ndarray, stages: int = 2) -> dict:
    """Per-phase mean cycles of each warpgroup (``phases``: name -> [wg0, wg1], with "between visits": from the
    warpgroup's previous visit's end to this visit's beginning, same CTA), and ``tensor_idle``: the share of the
    CTAs' cycles (first S^T issue to last dK done, summed over CTAs) in which neither warpgroup has a GEMM in
    flight; ``quantiles``: per phase, each warpgroup's (p10, p50, p90) cycles; ``idle_by_phase``: "wg 0 phase | wg 1
    phase" -> the share of the CTAs' cycles with no GEMM in flight spent in that pair of phases (taken at each idle
    gap's midpoint), largest first; ``cycles``: those CTAs' cycles, ``cycles_per_visit``: over every visit;
    ``gemm_order``: :func:`gemm_order_report`.

    stamps: (V, kTimelineCols) int64 of the timeline build, visits in table order; cta_start: (C + 1,) the
    CTAs' first visits (plan.cta_start); stages: the Q / dO stages of the build (load_report)."""
    stamps = np.asarray(stamps, dtype=np.int64)
    cta_start = np.asarray(cta_start, dtype=np.int64)
    phases = {name: [0.0, 0.0] for name, _, _ in PHASES}
    phases["between visits"] = [0.0, 0.0]
    for wg in (0, 1):
        t = wg_stamps(stamps, wg)
        for name, a, b in PHASES:
            phases[name][wg] = float(np.mean(t[:, b] - t[:, a])) if len(t) else 0.0
        gaps = [t[a + 1:b, TOP] - t[a:b - 1, DK_DONE] for a, b in zip(cta_start[:-1], cta_start[1:]) if b - a > 1]
        phases["between visits"][wg] = float(np.mean(np.concatenate(gaps))) if gaps else 0.0
    quantiles = {name: [_deciles(wg_stamps(stamps, wg)[:, b] - wg_stamps(stamps, wg)[:, a]) for wg in (0, 1)]
                 for name, a, b in PHASES}
    busy = span = 0
    idle_by = {}
    for a, b in zip(cta_start[:-1], cta_start[1:]):
        if b <= a:
            continue
        w = [wg_stamps(stamps[a:b], wg) for wg in (0, 1)]
        iv = np.concatenate([np.stack([t[:, lo], t[:, hi]], axis=1) for t in w
                             for lo, hi in ((S_ISSUE, DP_DONE), (DV_ISSUED, DK_DONE))])
        busy += _union_length(iv)
        span += _cta_cycles(w)
        gaps = _union_gaps(iv)
        if len(gaps):
            mid = (gaps[:, 0] + gaps[:, 1]) // 2
            key = _phase_at(w[0], mid) * len(PHASE_AFTER) + _phase_at(w[1], mid)
            sums = np.bincount(key, weights=gaps[:, 1] - gaps[:, 0])
            for k in np.flatnonzero(sums):
                idle_by[int(k)] = idle_by.get(int(k), 0) + int(sums[k])
    idle_by_phase = {f"{PHASE_AFTER[k // len(PHASE_AFTER)]} | {PHASE_AFTER[k % len(PHASE_AFTER)]}": n / span
                     for k, n in sorted(idle_by.items(), key=lambda kv: -kv[1])} if span else {}
    visits = int(cta_start[-1] - cta_start[0])
    return dict(phases=phases, quantiles=quantiles, tensor_idle=1.0 - busy / span if span else 0.0, cycles=span,
                cycles_per_visit=span / visits if visits else 0.0,
                idle_by_phase=idle_by_phase, loads=load_report(stamps, cta_start, stages),
                gemm_order=gemm_order_report(stamps))


def switch_report(stamps: np.ndarray, visits: np.ndarray, cta_start: np.ndarray, group: int = 1) -> dict:
    """What a CTA's change of KV tile costs the MMA warpgroups: for each warpgroup, the cycles from the end of its
    previous visit (dK done) to its S^T issue, split by whether the visit is the first of its KV tile in the CTA
    (the previous visit's tile was another: the dK / dV epilogue, the new K and V, the Q wait) or not (the Q wait
    alone). ``switch`` / ``within``: (mean, p50) cycles of each warpgroup; ``switch_parts``: the switches' mean
    cycles of each warpgroup from dK done to the next visit's top (the epilogue, ``end -> top``) and from the top to
    the S^T issue (the Q and K waits, ``top -> S^T``); ``switches``: how many; ``excess``: the switches' cycles beyond
    the within-tile median, summed, over the CTAs' cycles (first S^T issue to last dK done), both warpgroups' mean:
    what an epilogue hidden behind the next tile's first visit could save at most.

    visits: (V, 4) int32 (cta, head, n_block, m_block) in table order (plan.visits), ``group`` query heads per KV
    head (GQA: the heads of a group share the KV tile); stamps and cta_start as in :func:`phase_report`."""
    stamps = np.asarray(stamps, dtype=np.int64)
    visits = np.asarray(visits)
    cta_start = np.asarray(cta_start, dtype=np.int64)
    first = np.zeros(len(visits), dtype=bool)
    follows = np.zeros(len(visits), dtype=bool)   # visits with a previous visit in the same CTA
    span = 0
    for a, b in zip(cta_start[:-1], cta_start[1:]):
        if b - a > 1:
            follows[a + 1:b] = True
            kv_head, n_block = visits[a:b, 1] // group, visits[a:b, 2]
            first[a + 1:b] = (kv_head[1:] != kv_head[:-1]) | (n_block[1:] != n_block[:-1])
        if b > a:
            span += _cta_cycles([wg_stamps(stamps[a:b], wg) for wg in (0, 1)])
    rep = dict(switch=[], within=[], switch_parts=[], switches=int(first.sum()), excess=0.0)
    excess = []
    prev = np.flatnonzero(follows) - 1
    for wg in (0, 1):
        t = wg_stamps(stamps, wg)
        cost = np.zeros(len(visits), dtype=np.int64)
        cost[follows] = t[follows, S_ISSUE] - t[prev, DK_DONE]
        sw, wi = cost[first], cost[follows & ~first]
        rep["switch"].append((float(sw.mean()), float(np.median(sw))) if len(sw) else (0.0, 0.0))
        rep["within"].append((float(wi.mean()), float(np.median(wi))) if len(wi) else (0.0, 0.0))
        epilogue = t[first, TOP] - t[np.flatnonzero(first) - 1, DK_DONE]
        rep["switch_parts"].append({"end -> top": float(epilogue.mean()) if len(sw) else 0.0,
                                    "top -> S^T": float((sw - epilogue).mean()) if len(sw) else 0.0})
        excess.append(float((sw - rep["within"][wg][1]).sum()) / span if span and len(sw) else 0.0)
    rep["excess"] = float(np.mean(excess))
    return rep


def format_switch_report(rep: dict) -> str:
    sw, wi = rep["switch"], rep["within"]
    return (f"  KV-tile switches {rep['switches']}: end of visit -> S^T issue, mean / p50 cycles, wg 0 | wg 1: "
            f"switch {sw[0][0]:.0f} / {sw[0][1]:.0f} | {sw[1][0]:.0f} / {sw[1][1]:.0f}, within a tile "
            f"{wi[0][0]:.0f} / {wi[0][1]:.0f} | {wi[1][0]:.0f} / {wi[1][1]:.0f}; beyond the within-tile median: "
            f"{100 * rep['excess']:.2f} % of the CTAs' cycles; a switch's mean "
            + " | ".join(", ".join(f"{k} {v:.0f}" for k, v in parts.items()) for parts in rep["switch_parts"]))


def format_report(rep: dict) -> str:
    lines = [f"  {'phase (mean cycles)':24s} {'wg 0':>8s} {'wg 1':>8s}"]
    for name in ("between visits",) + tuple(n for n, _, _ in PHASES):
        w0, w1 = rep["phases"][name]
        lines.append(f"  {name:24s} {w0:8.0f} {w1:8.0f}")
    lines.append(f"  no GEMM in flight in either warpgroup: {100 * rep['tensor_idle']:.1f} % of the CTAs' cycles")
    lines.append(f"  CTA cycles per visit (first S^T issue to last dK done): {rep['cycles_per_visit']:.0f}")
    lines.append(f"  {'phase p10 / p50 / p90':24s} {'wg 0':>20s} {'wg 1':>20s}")
    for name, (q0, q1) in rep.get("quantiles", {}).items():
        lines.append(f"  {name:24s} {'/'.join(f'{x:.0f}' for x in q0):>20s} {'/'.join(f'{x:.0f}' for x in q1):>20s}")
    lines.append("  no GEMM in flight, by the phases the warpgroups are in (wg 0 | wg 1), % of the CTAs' cycles:")
    for pair, share in list(rep.get("idle_by_phase", {}).items())[:8]:
        lines.append(f"    {pair:52s} {100 * share:5.1f}")
    for name, q in rep.get("loads", {}).items():
        lines.append(f"  {name:28s} p10 / p50 / p90 {'/'.join(f'{x:.0f}' for x in q):>20s}")
    order = rep.get("gemm_order", {})
    if order.get("after_issue"):
        lines.append("  S^T / dP^T of both warpgroups, mean cycles after the visit's first S^T issue: "
                     + ", ".join(f"{k} {v:.0f}" for k, v in order["after_issue"].items()))
        lines.append("  completion orders, % of visits: "
                     + ", ".join(f"{k} {100 * v:.1f}" for k, v in list(order["orders"].items())[:4]))
    return "\n".join(lines)
