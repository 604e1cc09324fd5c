"""Does other work on the SM slow a warpgroup's wgmmas? benchmarks/kernels/pipe_interference.cu, one CTA of two
warpgroups per SM: warpgroup 0 runs a chain of GEMMs (SS 64 x 80 x 128 as the backward's S^T / dP^T, or RS
64 x 128 x 80 as its dV / dK), warpgroup 1 meanwhile runs one kind of other work (ex2, FFMA, shared loads, the
same SS GEMM, ex2 and FFMA mixed, FFMA at half the rate, FMUL / FADD, LOP3, IMAD, F2FP, an mbarrier spin, shared
stores, the dQ writer's bulk add). Prints warpgroup 0's cycles per GEMM (median over the CTAs) in each case against
its time alone; warpgroup 1's work is sized to outlast it. Measured on 2026-12-07:
benchmarks/results/experiments/round35_20261207/README.md.

    python benchmarks/pipe_interference.py [--reps 2000] [--json out.json]
    python benchmarks/pipe_interference.py --compile-only      # NVRTC build of every variant, no GPU
"""
from __future__ import annotations

import argparse
from pathlib import Path

from measure import compile_probe, load_probe, write_rows

SOURCE = Path(__file__).parent / "kernels" / "pipe_interference.cu"
GEMMS = {0: "SS m64n80k16 x 8", 1: "RS m64n128k16 x 5"}
OTHERS = {0: "alone", 1: "ex2", 2: "FFMA", 3: "shared loads", 4: "SS GEMM", 5: "ex2 + 2 FFMA", 6: "FFMA half",
          7: "FMUL + FADD", 8: "LOP3", 9: "IMAD", 10: "F2FP bf16x2", 11: "mbarrier spin", 12: "shared stores",
          13: "bulk add 20 KB"}
SMEM = 2 * (64 + 80) * 128 * 2 + 1024 + 64   # two A and two B tiles, the 1024-byte alignment, OTHER 11's mbarrier
BULK_BYTES = 20480                            # the kernel's kBulkBytes


def build(gemm: int, other: int) -> bytes:
    """The cubin of one (GEMM, OTHER) pair; RuntimeError on a compile error or a spill."""
    return compile_probe(f"#define GEMM {gemm}\n#define OTHER {other}\n" + SOURCE.read_text(), "pipe_interference")


def buffers() -> tuple:
    """(cycles, sink, gbuf) for one CTA per SM: the kernel's outputs and OTHER 13's destination (kBulkBytes a CTA)."""
    import cupy
    ctas = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["multiProcessorCount"]
    return (cupy.zeros(2 * ctas, dtype=cupy.int64), cupy.empty(ctas * 256, dtype=cupy.float32),
            cupy.zeros(ctas * BULK_BYTES // 4, dtype=cupy.float32))


def run(kernel, bufs: tuple, reps: int, other_iters: int) -> tuple:
    """(warpgroup 0's, warpgroup 1's) clock64 span, medians over one CTA per SM, of the second of two launches of
    ``kernel`` (load_probe's function) on :func:`buffers`."""
    import cupy
    import numpy as np
    ctas = bufs[0].size // 2
    for _ in range(2):  # the first launch warms up
        kernel((ctas,), (256,), (*bufs, np.int32(reps), np.int32(other_iters)), shared_mem=SMEM)
    cupy.cuda.Device().synchronize()
    c = bufs[0].get().reshape(ctas, 2)
    return float(np.median(c[:, 0])), float(np.median(c[:, 1]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=2000, help="GEMMs of warpgroup 0")
    ap.add_argument("--json", help="write the table here")
    ap.add_argument("--compile-only", action="store_true")
    a = ap.parse_args()
    cubins = {(g, o): build(g, o) for g in GEMMS for o in OTHERS}
    if a.compile_only:
        print(f"OK: {len(cubins)} variants, no spills")
        return
    loaded = {key: load_probe(cubin, "pipe_interference", SMEM) for key, cubin in cubins.items()}
    kernels, gpu = {key: k for key, (k, _, _) in loaded.items()}, loaded[(0, 0)][2]   # the modules stay in loaded
    rows, bufs = [], buffers()
    for g in GEMMS:
        alone, _ = run(kernels[(g, 0)], bufs, a.reps, 0)
        for o in OTHERS:
            iters = 0
            if o:  # size warpgroup 1's work to outlast warpgroup 0: probe, then scale with a margin
                probe_iters = 10 if o in (4, 13) else 1000
                _, probe = run(kernels[(g, o)], bufs, 1, probe_iters)
                iters = int(probe_iters * 1.3 * alone / max(probe, 1.0)) + 1
            wg0, wg1 = run(kernels[(g, o)], bufs, a.reps, iters)
            rows.append(dict(gemm=GEMMS[g], other=OTHERS[o], other_iters=iters, cycles_per_gemm=wg0 / a.reps,
                             vs_alone=wg0 / alone, other_cycles=wg1, other_outlasts=bool(wg1 >= wg0 or not o)))
            print(f"{GEMMS[g]:18s} beside {OTHERS[o]:13s} {wg0 / a.reps:8.1f} cycles per GEMM  x{wg0 / alone:5.3f}"
                  f"  (other work {wg1 / max(wg0, 1):4.2f} of its span)")
    if a.json:
        write_rows(a.json, rows, gpu)


if __name__ == "__main__":
    main()
