"""Is nvidia-smi's sampled SM clock the clock our backward runs at in a steady loop? steady_bench.py derives cycles
per call from it (ms x sampled MHz), and at the power limit the two implementations' clocks differ by more than
their cycles do (docs/decisions/bwd-engine.md, "The dQ store spread over dK"). This runs the timeline debug build
(kernels_src/bwd/timeline.cuh) back to back for a while, as steady_bench.py runs the normal one, and reads the SM
clock from the last call's own stamps: per CTA, its %clock64 against its %globaltimer between its first and last
visit. Printed beside nvidia-smi's median over the same loop.

    CUPY_DASH_BWD_FULL_BLOCK_M=80 CUPY_DASH_BWD_CAUSAL_BLOCK_M=80 \
        python benchmarks/clock_check.py --shapes 128:full:3840 128:causal:8192 --json clock_check.json

The timeline build's stamps cost its visits ~500 cycles each, so its clock is that of a slightly different load:
what is compared is the two readings of one loop, not the normal build's clock. Also per loop: the SMs' idle share
of the last call (each CTA's time before its first visit and after its last one, against the call's span: the
steady loop's last-wave idle, which Nsight Compute counts only for a lone call), and with ``--cold-s`` the probe
of one call after that many idle seconds (the unthrottled clock: ``clocks.max.sm`` if %clock64 counts SM cycles).
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

KWG_TOP_COL = 4      # warpgroup 0's %clock64 at the top of a visit (timeline.cuh: 4 + kWgStamps * 0 + kWgTop)
KSTART_COL = 0       # the CTA's %globaltimer (ns) when the visit starts (timeline.cuh: kStampStart)
KLAST_COL = 3        # ... when its dQ piece is released, the visit's last stamp (kStampReleased)


def cta_clocks_mhz(stamps: np.ndarray, cta_start: np.ndarray) -> np.ndarray:
    """Per CTA with at least two visits, (clock64 of its last visit - of its first) / (globaltimer ns between the
    same visits), in MHz. stamps: (V, kTimelineCols) int64 of one call; cta_start: (C + 1,) visit offsets."""
    out = []
    for c in range(len(cta_start) - 1):
        a, b = int(cta_start[c]), int(cta_start[c + 1]) - 1
        ns = stamps[b, KSTART_COL] - stamps[a, KSTART_COL]
        if b > a and ns > 0:
            out.append((stamps[b, KWG_TOP_COL] - stamps[a, KWG_TOP_COL]) / ns * 1e3)
    return np.asarray(out, dtype=np.float64)


def idle_share(stamps: np.ndarray, cta_start: np.ndarray) -> float:
    """The CTAs' mean idle share of one call: per CTA, the %globaltimer time from the call's first visit start to
    its own first, and from its last visit's release to the call's last release, over the call's span. stamps: (V,
    kTimelineCols) int64; cta_start: (C + 1,) visit offsets (CTAs without visits left out)."""
    busy = np.diff(cta_start) > 0
    begin, end = stamps[cta_start[:-1][busy], KSTART_COL], stamps[cta_start[1:][busy] - 1, KLAST_COL]
    t0, t1 = begin.min(), end.max()
    return float(np.mean((begin - t0) + (t1 - end)) / (t1 - t0))


def check(hdim: int, causal: bool, S: int, loop_s: float, smi, cold_s: float = 0.0) -> dict:
    import cupy

    import cupy_dash
    from steady_bench import pipelined_loop
    from timeline import stamped_backward

    backward, plan, stamps = stamped_backward(hdim, causal, S, "symmetric_shift")

    def call():
        backward()
        event = cupy.cuda.Event()
        event.record()
        return event

    call().synchronize()                              # compiles and warms up
    cold = None
    if cold_s > 0:
        time.sleep(cold_s)
        call().synchronize()
        cold = float(np.median(cta_clocks_mhz(stamps.get(), np.asarray(plan.cta_start))))
    ms, calls, wall0, wall1 = pipelined_loop(call, lambda e: e.synchronize(), loop_s)
    cupy.cuda.Device().synchronize()
    cupy_dash.check_errors()
    last = stamps.get()
    probe = cta_clocks_mhz(last, np.asarray(plan.cta_start))
    smi_mhz, smi_w, samples = smi.window(wall0, wall1)
    row = dict(shape=f"{hdim}:{'causal' if causal else 'full'}:{S}", block_m=plan.block_m, ms=ms, calls=calls,
               probe_mhz_median=float(np.median(probe)), probe_mhz_p10=float(np.percentile(probe, 10)),
               probe_mhz_p90=float(np.percentile(probe, 90)), smi_mhz=smi_mhz, smi_w=smi_w, smi_samples=samples,
               idle_share=idle_share(last, np.asarray(plan.cta_start)), cold_probe_mhz=cold)
    print(f"{row['shape']:18s} m{plan.block_m}  {ms:.3f} ms x {calls}  probe {row['probe_mhz_median']:.0f} MHz "
          f"(p10 {row['probe_mhz_p10']:.0f}, p90 {row['probe_mhz_p90']:.0f})  nvidia-smi {smi_mhz} MHz "
          f"{smi_w} W ({samples} samples)  SM idle {100 * row['idle_share']:.1f} %"
          + (f"  cold probe {cold:.0f} MHz" if cold else ""), flush=True)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", nargs="+", default=["128:full:3840", "128:causal:8192"], help="hdim:mask:seqlen")
    ap.add_argument("--loop-s", type=float, default=0.5)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cold-s", type=float, default=0.0, help="idle seconds before a lone call's probe")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import cupy

    from measure import write_rows
    from steady_bench import Smi, _text
    smi = Smi()
    rows = []
    try:
        for _ in range(args.rounds):
            for shape in args.shapes:
                d, mask, S = shape.split(":")
                rows.append(check(int(d), mask == "causal", int(S), args.loop_s, smi, args.cold_s))
    finally:
        smi.close()
    if args.json:
        write_rows(args.json, rows, _text(cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]))
    ratios = [r["probe_mhz_median"] / r["smi_mhz"] for r in rows if r["smi_mhz"]]
    if ratios:
        print(f"probe / nvidia-smi: median {statistics.median(ratios):.3f} over {len(ratios)} loops")


if __name__ == "__main__":
    main()
