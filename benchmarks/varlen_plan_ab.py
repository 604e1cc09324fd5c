"""A new packing's host build in two checkouts, interleaved (no GPU needed): for each checkout in turn, a fresh
process times ``cupy_dash.cuda.varlen_device.plan`` (GPU-expanded form, 16,384 tokens cut at random into B sequences,
16 heads, causal, auto, 132 CTAs) over --packings new packings, best of three loops; --rounds alternations; then
the min and median µs per checkout and B. The checkouts' Cython modules must be built in place
(``python setup.py build_ext --inplace``).

    python benchmarks/varlen_plan_ab.py OLD_CHECKOUT NEW_CHECKOUT [--rounds 8] [--packings 2000]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

_CHILD = r"""
import sys, time
import numpy as np
sys.path.insert(0, sys.argv[1])
from cupy_dash.cuda import varlen_device
assert varlen_device.__file__.startswith(sys.argv[1]), varlen_device.__file__
N = int(sys.argv[2])
for B in (4, 16, 64):
    rng = np.random.default_rng(B)
    cuts = np.sort(rng.integers(1, 16384, size=(N, B - 1)), axis=1)
    lens = np.diff(np.concatenate([np.zeros((N, 1), np.int64), cuts, np.full((N, 1), 16384)], axis=1), axis=1)
    lens = [np.ascontiguousarray(x) for x in lens]
    best = []
    for _ in range(3):
        varlen_device._plans.clear()
        t0 = time.perf_counter()
        for L in lens:
            varlen_device.plan("auto", L, L, 128, 128, 16, 16, True, 132, (-1, 0), compact="expand")
        best.append((time.perf_counter() - t0) / N * 1e6)
    print(B, min(best))
"""


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkouts", nargs=2)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--packings", type=int, default=2000)
    args = ap.parse_args(argv)
    times = {c: {} for c in args.checkouts}
    for _ in range(args.rounds):
        for c in args.checkouts:
            out = subprocess.run([sys.executable, "-c", _CHILD, c, str(args.packings)], check=True,
                                 capture_output=True, text=True).stdout
            for line in out.split("\n"):
                if line.strip():
                    B, us = line.split()
                    times[c].setdefault(int(B), []).append(float(us))
    print(f"varlen_device.plan per new packing, µs (min / median of {args.rounds} interleaved runs)")
    for c, by_b in times.items():
        print(c, "  ".join(f"B={B}: {min(v):.1f} / {statistics.median(v):.1f}" for B, v in sorted(by_b.items())))


if __name__ == "__main__":
    main()
