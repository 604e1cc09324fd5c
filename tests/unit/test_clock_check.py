"""benchmarks/clock_check.py reads the SM clock from a timeline build's own stamps: per CTA, %clock64 against
%globaltimer between its first and last visit (CTAs with one visit left out). CPU only."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

import clock_check  # noqa: E402


def test_clock_per_cta_from_its_first_and_last_visit():
    stamps = np.zeros((6, 24), dtype=np.int64)
    # CTA 0: visits 0..2 at 1,500 MHz; CTA 1: visit 3 alone (no span); CTA 2: visits 4..5 at 1,800 MHz
    stamps[[0, 1, 2], clock_check.KSTART_COL] = [1_000, 1_400, 3_000]
    stamps[[0, 1, 2], clock_check.KWG_TOP_COL] = [10_000, 99, 10_000 + 3_000]
    stamps[[4, 5], clock_check.KSTART_COL] = [500, 1_500]
    stamps[[4, 5], clock_check.KWG_TOP_COL] = [7, 7 + 1_800]
    mhz = clock_check.cta_clocks_mhz(stamps, np.array([0, 3, 4, 6]))
    np.testing.assert_allclose(mhz, [1_500.0, 1_800.0])


def test_idle_share_counts_each_cta_before_its_first_visit_and_after_its_last():
    stamps = np.zeros((5, 24), dtype=np.int64)
    # CTA 0: visits 0..2 from 0 to 1,000 ns; CTA 1: no visits; CTA 2: visits 3..4 from 100 to 800 ns
    stamps[[0, 3], clock_check.KSTART_COL] = [0, 100]
    stamps[[2, 4], clock_check.KLAST_COL] = [1_000, 800]
    share = clock_check.idle_share(stamps, np.array([0, 3, 3, 5]))
    assert share == (0 + 0 + 100 + 200) / 2 / 1_000
