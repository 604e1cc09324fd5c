"""benchmarks/grid_ab.py's tables (persistent CTAs against one CTA per KV column): every leg covers the same visits,
passes the kernel's table checks, and the reordered legs put their columns in the order they name. No GPU needed."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from cupy_dash import schedule

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

import grid_ab  # noqa: E402


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_every_leg_covers_the_same_visits_once(causal):
    S, H, bm, bn = 1000, 3, 64, 128
    legs = grid_ab.legs(S, causal, H, 132, bm, bn)
    assert len(legs) == (4 if causal else 3)
    n_blocks, m_blocks = -(-S // bn), -(-S // bm)
    ref = None
    for name, plan in legs.items():
        visits, rank, cta_start, num_ctas = schedule.check_plan(plan, H, n_blocks, m_blocks)
        assert num_ctas == (min(132, H * n_blocks) if name.startswith("persistent") else H * n_blocks), name
        assert (np.diff(cta_start) > 0).all() and cta_start[-1] == len(visits)
        for c in range(num_ctas):                       # rows grouped by CTA, each CTA one column per leg
            rows = visits[cta_start[c]:cta_start[c + 1]]
            assert (rows[:, 0] == c).all()
            if not name.startswith("persistent"):
                assert len({(int(h), int(n)) for h, n in rows[:, 1:3]}) == 1
        key = sorted(map(tuple, visits[:, 1:].tolist()))
        assert ref is None or key == ref, name
        ref = key


def test_longest_and_shortest_first_orders():
    legs = grid_ab.legs(2048, True, 2, 132, 64, 128)
    for name, sign in (("per column, longest first", -1), ("per column, shortest first", 1)):
        lens = np.diff(np.asarray(legs[name].cta_start))
        assert (np.diff(lens) * sign >= 0).all(), name


def test_uploaded_once_memoizes_the_upload_per_plan(monkeypatch):
    from cupy_dash.cuda import device_tables
    calls = []
    monkeypatch.setattr(device_tables, "upload", lambda plan, *args, checked=None: calls.append(plan) or object())
    p1, p2 = object(), object()
    with grid_ab.uploaded_once():
        a, b, c = (device_tables.upload(p, 3, checked=None) for p in (p1, p1, p2))
    assert a is b and a is not c and calls == [p1, p2]
    device_tables.upload(p1, 3)                         # restored on exit: uploads again
    assert calls == [p1, p2, p1]
