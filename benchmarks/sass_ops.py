"""Executed SASS instructions per MMA-warp visit, by opcode, of two kernels profiled by Nsight Compute: where one
kernel's loop executes more instructions than the other's.

Input: the source page of an ncu report as CSV (``ncu -i R.ncu-rep --page source --csv --print-source sass``, as
``device_run.sh ncu`` writes it; ``.gz`` read as is). Each instruction's "Instructions Executed" (warp level) is
divided by the loop's count, that of the most executed HGMMA (every MMA warp issues each GEMM once per visit),
so the figures are per MMA warp and visit; instructions below 1 % of that count (prologue, epilogue) are
left out. Predicates and modifiers are dropped from the opcode (``@!P0 LOP3.LUT`` counts as LOP3).

    python benchmarks/sass_ops.py FA3.sass.csv.gz OURS.sass.csv.gz [--min-diff 1.5]
"""
from __future__ import annotations

import argparse
import collections
import csv
import gzip
import re


def read_page(path: str) -> tuple:
    """(column names, rows after the header) of an ncu source page as CSV (``.gz`` read as is)."""
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        rows = list(csv.reader(f))
    header = next(i for i, r in enumerate(rows) if "Source" in r and "Instructions Executed" in r)
    return rows[header], rows[header + 1:]


def load(path: str) -> list:
    """[(sass text, stall samples, warp-level executions)] in address order."""
    names, rows = read_page(path)
    src, samples, executed = (names.index(n) for n in
                              ("Source", "Warp Stall Sampling (All Samples)", "Instructions Executed"))
    return [(r[src].strip(), int(r[samples] or 0), int(r[executed] or 0)) for r in rows if len(r) > executed]


def opcode(sass: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", sass).split()[0].split(".")[0]


def per_visit(instructions: list) -> tuple:
    """(executions per visit by opcode, stall samples by opcode)."""
    loop = max(e for sass, _, e in instructions if opcode(sass) == "HGMMA")
    counts, samples = collections.Counter(), collections.Counter()
    for sass, n, e in instructions:
        if e >= 0.01 * loop:
            counts[opcode(sass)] += e / loop
            samples[opcode(sass)] += n
    return counts, samples


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("first")
    ap.add_argument("second")
    ap.add_argument("--min-diff", type=float, default=1.5, help="show opcodes whose counts differ by at least this")
    args = ap.parse_args(argv)
    (a, sa), (b, sb) = per_visit(load(args.first)), per_visit(load(args.second))
    print(f"{'opcode':12s} {'first':>7s} {'second':>7s} {'diff':>7s}   stall samples first / second")
    for op in sorted(set(a) | set(b), key=lambda o: -(b[o] - a[o])):
        if abs(b[op] - a[op]) >= args.min_diff:
            print(f"{op:12s} {a[op]:7.1f} {b[op]:7.1f} {b[op] - a[op]:7.1f}   {sa[op]} / {sb[op]}")
    print(f"{'total':12s} {sum(a.values()):7.1f} {sum(b.values()):7.1f} {sum(b.values()) - sum(a.values()):7.1f}")


if __name__ == "__main__":
    main()
