"""benchmarks/sass_ops.py: executed instructions per MMA-warp visit by opcode, from an ncu source page (CSV, gzip
or plain). No GPU needed: synthetic pages in ncu's layout (a kernel-name row, then the header)."""
from __future__ import annotations

import csv
import gzip
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

import sass_ops  # noqa: E402

HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Warp Stall Sampling (Not-issued Samples)",
          "# Samples", "Instructions Executed"]


def _page(path: Path, rows, compress: bool) -> str:
    opener = gzip.open if compress else open
    with opener(path, "wt", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Kernel Name", "k"])
        w.writerow(HEADER)
        for i, (sass, samples, executed) in enumerate(rows):
            w.writerow([hex(16 * i), f"      {sass}", samples, samples, samples, executed])
    return str(path)


def test_counts_are_per_visit_of_the_most_executed_hgmma(tmp_path):
    rows = [("LDC R1, c[0x0][0x28]", 1, 8),                      # prologue: below 1 % of the loop, left out
            ("HGMMA.64x64x16.F32.BF16 R184, gdesc[UR4], RZ, !UPT", 10, 1000),
            ("HGMMA.64x64x16.F32.BF16 R184, gdesc[UR4], R184, gsb0", 5, 1000),
            ("@!P0 LOP3.LUT R7, R7, 0x38, RZ, 0xc0, !PT", 3, 2000),  # twice a visit, predicate dropped
            ("@P1 BRA 0x7f00", 7, 500)]                             # every other visit
    counts, samples = sass_ops.per_visit(sass_ops.load(_page(tmp_path / "a.csv.gz", rows, True)))
    assert dict(counts) == {"HGMMA": 2.0, "LOP3": 2.0, "BRA": 0.5}
    assert samples["HGMMA"] == 15 and "LDC" not in samples


def test_main_prints_the_difference(tmp_path, capsys):
    loop = [("HGMMA.64x64x16.F32.BF16 R1, gdesc[UR4], R1", 0, 100)]
    first = _page(tmp_path / "first.csv", loop + [("FSEL R1, R2, RZ, P0", 0, 100)], False)
    second = _page(tmp_path / "second.csv", loop + [("IMAD.U32 R1, R2, 0x10000, RZ", 0, 300)], False)
    sass_ops.main([first, second, "--min-diff", "0.5"])
    out = capsys.readouterr().out
    assert "IMAD" in out and "FSEL" in out
    assert out.splitlines()[-1].split()[1:] == ["2.0", "4.0", "2.0"]
