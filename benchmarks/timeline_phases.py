"""The MMA warpgroups' phases of a backward visit from the timeline build's %clock64 stamps
(kernels_src/bwd/timeline.cuh, columns 4 + 8 wg + s), and how long each CTA's tensor pipe has no GEMM in flight.
Pure numpy: benchmarks/timeline.py runs the kernel and calls :func:`phase_report`.

A warpgroup has GEMMs in flight from S^T's issue to dP^T's completion and from dV's issue to dK's completion; when
neither warpgroup of a CTA has, its SM's tensor pipe is idle. That idle share is a lower bound of the pipe's idle
time (a GEMM in flight may still wait for the pipe): if it is large, the two warpgroups' softmaxes overlap and the
ping-pong between them is what to change; if small, the GEMMs themselves run slow.
"""
from __future__ import annotations

import numpy as np

WG_BASE, WG_STAMPS = 4, 10                      # timeline.cuh: column 4 + WG_STAMPS * wg + stamp
TOP, S_ISSUE, DP_ISSUE, S_DONE, DP_DONE, DV_ISSUED, BARRIER, DQ_DONE, DK_DONE, SM = range(10)

# (name, from stamp, to stamp) within one visit; "between visits" runs from the warpgroup's previous visit's end
PHASES = (("Q wait", TOP, S_ISSUE), ("dO wait", S_ISSUE, DP_ISSUE), ("S^T wait", DP_ISSUE, S_DONE),
          ("P^T, dP^T wait", S_DONE, DP_DONE), ("dS^T, dV issue", DP_DONE, DV_ISSUED),
          ("dS^T barrier", DV_ISSUED, BARRIER), ("dQ wait", BARRIER, DQ_DONE), ("dQ hand-off, dK wait", DQ_DONE,
                                                                                   DK_DONE))


def wg_stamps(stamps: np.ndarray, wg: int) -> np.ndarray:
    """(V, WG_STAMPS) int64: warpgroup wg's stamps of every visit (the SM id in column SM, warpgroup 0 only)."""
    return stamps[:, WG_BASE + WG_STAMPS * wg: WG_BASE + WG_STAMPS * (wg + 1)]


def _union_length(intervals: np.ndarray) -> int:
    """Total length of the union of closed intervals (n, 2): their span less the gaps that no interval covers."""
    if len(intervals) == 0:
        return 0
    iv = intervals[np.argsort(intervals[:, 0], kind="stable")]
    reach = np.maximum.accumulate(iv[:, 1])
    gaps = np.maximum(iv[1:, 0] - reach[:-1], 0)
    return int(reach[-1] - iv[0, 0] - gaps.sum())


def phase_report(stamps: np.ndarray, cta_start: np.ndarray) -> dict:
    """Per-phase mean cycles of each warpgroup (``phases``: name -> [wg0, wg1], with "between visits": from the
    warpgroup's previous visit's end to this visit's beginning, same CTA), and ``tensor_idle``: the share of the
    CTAs' cycles (first S^T issue to last dK done, summed over CTAs) in which neither warpgroup has a GEMM in
    flight.

    stamps: (V, 24) int64 of the timeline build, visits in table order; cta_start: (C + 1,) the CTAs' first
    visits (plan.cta_start)."""
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
    busy = span = 0
    for a, b in zip(cta_start[:-1], cta_start[1:]):
        if b <= a:
            continue
        w = [wg_stamps(stamps[a:b], wg) for wg in (0, 1)]
        iv = np.concatenate([np.stack([t[:, lo], t[:, hi]], axis=1) for t in w
                             for lo, hi in ((S_ISSUE, DP_DONE), (DV_ISSUED, DK_DONE))])
        busy += _union_length(iv)
        span += int(max(t[:, DK_DONE].max() for t in w) - min(t[:, S_ISSUE].min() for t in w))
    return dict(phases=phases, tensor_idle=1.0 - busy / span if span else 0.0, cycles=span)


def format_report(rep: dict) -> str:
    lines = [f"  {'phase (mean cycles)':24s} {'wg 0':>8s} {'wg 1':>8s}"]
    for name in ("between visits",) + tuple(n for n, _, _ in PHASES):
        w0, w1 = rep["phases"][name]
        lines.append(f"  {name:24s} {w0:8.0f} {w1:8.0f}")
    lines.append(f"  no GEMM in flight in either warpgroup: {100 * rep['tensor_idle']:.1f} % of the CTAs' cycles")
    return "\n".join(lines)
