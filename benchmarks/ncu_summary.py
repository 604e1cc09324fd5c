"""The headline figures of one kernel's Nsight Compute raw page (``ncu -i X.ncu-rep --page raw --csv``), one per
line: duration, cycles, grid, waves, instructions, tensor-pipe and issue activity, L2 hit rate, DRAM throughput, and
the warp stall reasons per issued instruction, largest first. Used by device_run.sh to compare two kernels at a
glance; the CSV itself is the record.

    python benchmarks/ncu_summary.py ours_causal1024.raw.csv [--stalls 8]
    python benchmarks/ncu_summary.py X.raw.csv --metrics gpu__time_duration.sum sm__cycles_elapsed.max ...

``--metrics``: instead, one line per kernel of the page (every kernel of a call: pre-, main and postprocess), its
name and the metrics named, as the file writes them.
"""
from __future__ import annotations

import argparse
import csv

HEADLINE = ("gpu__time_duration.sum", "sm__cycles_elapsed.max", "launch__grid_size",
            "launch__waves_per_multiprocessor", "smsp__inst_executed.sum",
            "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed",
            "smsp__issue_active.avg.pct_of_peak_sustained_active", "smsp__warps_active.avg.per_cycle_active",
            "lts__t_sector_hit_rate.pct", "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed")
STALL = ("smsp__average_warps_issue_stalled_", "_per_issue_active.ratio")


def read_all(path) -> list:
    """[{metric: (unit, value text)}] of every kernel in a raw-page CSV (row 0 names, row 1 units), in its order."""
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    start = next(i for i, r in enumerate(rows) if "gpu__time_duration.sum" in r)
    names, units = rows[start], rows[start + 1]
    return [{n: (u, v) for n, u, v in zip(names, units, values)} for values in rows[start + 2:]]


def read_raw(path) -> dict:
    """{metric: (unit, value text)} of the first kernel in a raw-page CSV."""
    return read_all(path)[0]


def per_kernel(kernels: list, metrics: list) -> list:
    """'<kernel name, 48 characters> <metric>=<value> ...', one line per kernel (read_all's list)."""
    return [" ".join([k.get("Kernel Name", ("", "?"))[1][:48]] + [f"{m}={k.get(m, ('', '-'))[1]}" for m in metrics])
            for k in kernels]


def _number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def summary(raw: dict, stalls: int = 8) -> list:
    lines = [f"{name} {raw[name][1]} {raw[name][0]}".rstrip() for name in HEADLINE if name in raw]
    reasons = [(name[len(STALL[0]):-len(STALL[1])], _number(v)) for name, (_, v) in raw.items()
               if name.startswith(STALL[0]) and name.endswith(STALL[1])]
    reasons = sorted((r for r in reasons if r[1] is not None), key=lambda r: -r[1])[:stalls]
    lines.append("stalls per issue: " + ", ".join(f"{n} {v:.2f}" for n, v in reasons))
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("raw_csv")
    ap.add_argument("--stalls", type=int, default=8)
    ap.add_argument("--metrics", nargs="+", default=None, help="one line per kernel with these metrics instead")
    opts = ap.parse_args()
    if opts.metrics:
        print("\n".join(per_kernel(read_all(opts.raw_csv), opts.metrics)))
        return
    print("\n".join(summary(read_raw(opts.raw_csv), opts.stalls)))


if __name__ == "__main__":
    main()
