"""Where a kernel's warps wait, by stretch of code: an ncu source page (SASS, CSV, as ``device_run.sh ncu`` writes it)
cut at every wait and every GEMM group (``WARPGROUP.DEPBAR``, ``SYNCS.PHASECHK``, ``BAR.SYNC``, ``DEPBAR``, the
first HGMMA of a group) and at the warp roles' entry points (``EXIT`` ends one), each stretch with its stall
samples as a share of the kernel's, that share times the kernel's cycles (``--cycles``, Mcycles: elapsed cycles from
the raw or details page), and its three main stall reasons. Stretches with less than ``--min`` percent of the samples
are merged into the one before. Samples say where warps wait, not whether the tensor pipe idles meanwhile: a map for
comparing two kernels' loops (docs/decisions/bwd-engine.md), not a cost model.

    python benchmarks/ncu_segments.py OURS.sass.csv.gz --cycles 3.996 [--min 0.5]
"""
from __future__ import annotations

import argparse
import collections
import re

from sass_ops import read_page

_CUTS = re.compile(r"^(?:@!?U?P\w+\s+)?(WARPGROUP\.DEPBAR|SYNCS\.PHASECHK|BAR\.SYNC|DEPBAR|EXIT)")


def load(path: str) -> list:
    """[(index, sass text, stall samples, warp-level executions, {reason: samples})] in address order."""
    names, rows = read_page(path)
    col = {n: i for i, n in enumerate(names)}
    reasons = [n for n in names if n.startswith("stall_") and "(Not Issued)" not in n]
    out = []
    for r in rows:
        if len(r) < len(names):
            continue
        out.append((len(out), r[col["Source"]].strip(), int(r[col["Warp Stall Sampling (All Samples)"]] or 0),
                    int(r[col["Instructions Executed"]] or 0), {n[6:]: int(r[col[n]] or 0) for n in reasons}))
    return out


def segments(instructions: list, min_share: float) -> list:
    """[(first index, last index, samples, Counter of reasons)], cut before each wait and each group's first HGMMA."""
    total = sum(i[2] for i in instructions) or 1
    segs, prev_hgmma = [], False
    for idx, sass, samples, _, reasons in instructions:
        hgmma = "HGMMA" in sass
        if not segs or _CUTS.match(sass) or (hgmma and not prev_hgmma):
            segs.append([idx, idx, 0, collections.Counter()])
        prev_hgmma = hgmma
        seg = segs[-1]
        seg[1], seg[2] = idx, seg[2] + samples
        seg[3].update(reasons)
    merged = []
    for seg in segs:
        if merged and 100 * seg[2] / total < min_share:
            last = merged[-1]
            last[1], last[2] = seg[1], last[2] + seg[2]
            last[3].update(seg[3])
        else:
            merged.append(seg)
    return merged


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source")
    ap.add_argument("--cycles", type=float, required=True, help="the kernel's elapsed cycles, in millions")
    ap.add_argument("--min", type=float, default=0.5, help="merge stretches below this percent of the samples")
    args = ap.parse_args(argv)
    instructions = load(args.source)
    total = sum(i[2] for i in instructions) or 1
    text = {i[0]: i[1] for i in instructions}
    print(f"{'lines':>11s} {'%':>5s} {'Mcyc':>6s}  first instruction / main stall reasons (% of all samples)")
    for first, last, samples, reasons in segments(instructions, args.min):
        top = ", ".join(f"{r} {100 * n / total:.1f}" for r, n in reasons.most_common(3) if n)
        print(f"{first:5d}-{last:<5d} {100 * samples / total:5.1f} {samples / total * args.cycles:6.3f}  "
              f"{text[first][:48]:48s} {top}")
    print(f"total samples {total}")


if __name__ == "__main__":
    main()
