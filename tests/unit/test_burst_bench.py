"""benchmarks/burst_bench.py's ratios: per round other / ours in the bursts and in the steady loops, their medians,
and what the power limit adds (steady over burst). CPU only."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

import burst_bench  # noqa: E402


def test_ratios_are_per_round_medians_and_their_quotient():
    runs = {"dash_det": dict(burst=[1.0, 2.0, 1.0], steady=[2.0, 2.0, 4.0]),
            "fa3_nondet": dict(burst=[0.95, 1.9, 1.0], steady=[1.8, 1.9, 3.6])}
    r = burst_bench.ratios(runs)["fa3_nondet"]
    assert r["burst"] == pytest.approx(0.95)
    assert r["steady"] == pytest.approx(0.9)
    assert r["limit_share"] == pytest.approx(0.9 / 0.95)
    assert "dash_det" not in burst_bench.ratios(runs)
