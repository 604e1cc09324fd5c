"""benchmarks/ncu_segments.py: an ncu source page cut into stretches at the waits and GEMM groups, with their stall
samples and reasons. No GPU needed: a synthetic page in ncu's layout (a kernel-name row, then the header)."""
from __future__ import annotations

import csv
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

import ncu_segments  # noqa: E402

HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed", "stall_barrier",
          "stall_long_sb", "stall_barrier (Not Issued)"]


def _page(path: Path, rows) -> str:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Kernel Name", "k"])
        w.writerow(HEADER)
        for i, (sass, barrier, long_sb) in enumerate(rows):
            w.writerow([hex(16 * i), f"      {sass}", barrier + long_sb, 100, barrier, long_sb, barrier])
    return str(path)


def test_cuts_at_waits_and_group_starts_and_merges_small_stretches(tmp_path):
    rows = [("LDC R1, c[0x0][0x28]", 0, 1),
            ("SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR15+0x38520], R9", 0, 40),
            ("HGMMA.64x80x16.F32.BF16 R192, gdesc[UR8], RZ, !UPT", 0, 0),
            ("HGMMA.64x80x16.F32.BF16 R192, gdesc[UR20], R192, gsb0", 0, 0),
            ("FFMA R9, R193, UR8, -R11", 0, 9),
            ("WARPGROUP.DEPBAR.LE gsb0, 0x1", 50, 0),
            ("@!P3 BAR.SYNC.DEFER_BLOCKING 0x4, 0xa0", 1, 0)]     # 1 % of the samples: merged into the wait before
    instructions = ncu_segments.load(_page(tmp_path / "p.csv", rows))
    assert instructions[5][4] == {"barrier": 50, "long_sb": 0}    # the "(Not Issued)" columns are not reasons
    segs = ncu_segments.segments(instructions, min_share=2.0)
    assert [(first, last, samples) for first, last, samples, _ in segs] == [(0, 0, 1), (1, 1, 40), (2, 4, 9),
                                                                            (5, 6, 51)]
    assert segs[3][3]["barrier"] == 51
