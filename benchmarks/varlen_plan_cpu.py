"""Host build of a new packing's varlen backward table, as the backward runs it (no GPU needed): median µs of
``cupy_dash.cuda.varlen_device.plan`` over new random packings of --tokens tokens into B sequences (causal, 16 heads,
128 x 128 tiles, 132 CTAs, ``auto``), per table form: "expand" (compact records packed for the upload, expanded
on the GPU: the default), "compact" (read as records by the compact kernel) and "per-visit" (expanded on the host).

    python benchmarks/varlen_plan_cpu.py [--tokens 16384] [--batches 4 16 64] [--packings 300]
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from cupy_dash.cuda import varlen_device  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--batches", type=int, nargs="+", default=[4, 16, 64])
    ap.add_argument("--packings", type=int, default=300)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    print(f"varlen_device.plan per new packing, {args.tokens} tokens, H = 16, causal, auto (median us of "
          f"{args.packings})")
    print("B    expand  compact  per-visit")
    for b in args.batches:
        row = []
        for form in ("expand", True, False):
            times = []
            for _ in range(args.packings):
                cuts = np.sort(rng.choice(np.arange(1, args.tokens), b - 1, replace=False))
                lens = np.diff(np.concatenate([[0], cuts, [args.tokens]])).astype(np.int64)
                t0 = time.perf_counter_ns()
                varlen_device.plan("auto", lens, lens, 128, 128, 16, 16, True, 132, (-1, 0), form)
                times.append(time.perf_counter_ns() - t0)
            row.append(np.median(times) / 1e3)
        print(f"{b:<3d} {row[0]:7.1f}  {row[1]:7.1f}  {row[2]:9.1f}")


if __name__ == "__main__":
    main()
