"""benchmarks/ncu_summary.py: the headline figures and the largest stall reasons of a raw-page CSV."""
from __future__ import annotations

import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import ncu_summary  # noqa: E402


def test_summary_reads_the_first_kernel_and_ranks_the_stalls(tmp_path):
    names = ["ID", "gpu__time_duration.sum", "launch__grid_size", "smsp__average_warps_issue_stalled_barrier_"
             "per_issue_active.ratio", "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio",
             "smsp__average_warps_issue_stalled_gmma_per_issue_active.ratio"]
    rows = [names, ["", "ms", "", "", "", ""], ["0", "0.19", "2,048", "1.5", "2.25", "n/a"],
            ["1", "9.99", "1", "9", "9", "9"]]
    path = tmp_path / "k.raw.csv"
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows(rows)
    lines = ncu_summary.summary(ncu_summary.read_raw(path), stalls=2)
    assert lines == ["gpu__time_duration.sum 0.19 ms", "launch__grid_size 2,048",
                     "stalls per issue: wait 2.25, barrier 1.50"]


def test_per_kernel_lines_name_every_kernel_and_its_metrics(tmp_path):
    rows = [["ID", "Kernel Name", "gpu__time_duration.sum", "sm__cycles_elapsed.max"], ["", "", "us", "cycle"],
            ["0", "bwd_preprocess", "61.2", "108,000"], ["1", "bwd_main<...>", "1,858", "3,299,000"]]
    path = tmp_path / "k.raw.csv"
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows(rows)
    kernels = ncu_summary.read_all(path)
    assert kernels[0] == ncu_summary.read_raw(path)
    assert ncu_summary.per_kernel(kernels, ["sm__cycles_elapsed.max", "dram__bytes.sum"]) == [
        "bwd_preprocess sm__cycles_elapsed.max=108,000 dram__bytes.sum=-",
        "bwd_main<...> sm__cycles_elapsed.max=3,299,000 dram__bytes.sum=-"]
