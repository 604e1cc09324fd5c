"""benchmarks/timeline_phases.py: the warpgroup phases and the no-GEMM-in-flight share from synthetic stamps of the
timeline build (kernels_src/bwd/timeline.cuh). No GPU needed."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from cupy_dash.cuda.params import CONSTANTS

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

import timeline_phases as tp  # noqa: E402


def _visit(t0, offsets, waits=(0, 0)):
    """One warpgroup's 9 phase stamps: the Q and dO waits ``waits`` before S^T and dP^T are issued, t0 the S^T
    issue, then t0 + the cumulative ``offsets`` (S^T done, dP^T done, dV issued, barrier, dQ done, dK done)."""
    q_wait, do_wait = waits
    after = t0 + np.cumsum(offsets)
    return np.concatenate([[t0 - q_wait, t0, t0 + do_wait], after])


def _stamps(rows):
    """rows: per visit, (wg0 stamps, wg1 stamps), each 7 values."""
    out = np.zeros((len(rows), CONSTANTS.kTimelineCols), dtype=np.int64)
    for v, (w0, w1) in enumerate(rows):
        out[v, tp.WG_BASE:tp.WG_BASE + 9] = w0
        out[v, tp.WG_BASE + tp.WG_STAMPS:tp.WG_BASE + tp.WG_STAMPS + 9] = w1
    return out


def test_columns_match_the_kernel_header():
    assert tp.PROD_DO + 1 == CONSTANTS.kTimelineCols
    header = (BENCHMARKS.parent / "kernels_src" / "bwd" / "timeline.cuh").read_text()
    for name, value in (("kWgTop", tp.TOP), ("kWgSIssue", tp.S_ISSUE), ("kWgDpIssue", tp.DP_ISSUE),
                        ("kWgSDone", tp.S_DONE), ("kWgDpDone", tp.DP_DONE), ("kWgDvIssued", tp.DV_ISSUED),
                        ("kWgBarrier", tp.BARRIER), ("kWgDqDone", tp.DQ_DONE), ("kWgDkDone", tp.DK_DONE),
                        ("kWgSm", tp.SM), ("kWgStamps", tp.WG_STAMPS),
                        ("kProdQIssued", tp.PROD_Q - tp.WG_BASE - 2 * tp.WG_STAMPS),
                        ("kProdDoIssued", tp.PROD_DO - tp.WG_BASE - 2 * tp.WG_STAMPS)):
        assert f"{name} = {value}" in header


def test_phases_and_idle_share_of_two_visits_in_one_cta():
    # wg 0: S 100, P 50, dS 30, barrier 10, dQ 40, dK 20 -> in flight [0, 150] and [180, 250]; the next visit
    # begins 25 cycles after its end and waits 5 for Q. wg 1 runs the same 60 cycles later: in flight [60, 210],
    # [240, 310]. The dO wait (2 cycles) lies inside the in-flight S^T.
    offs = [100, 50, 30, 10, 40, 20]
    waits = (5, 2)
    rows = [(_visit(0, offs, waits), _visit(60, offs, waits)), (_visit(280, offs, waits), _visit(340, offs, waits))]
    rep = tp.phase_report(_stamps(rows), np.array([0, 2]))
    assert rep["phases"]["S^T wait"] == [98, 98] and rep["phases"]["dQ wait"] == [40, 40]
    assert rep["phases"]["Q wait"] == [5, 5] and rep["phases"]["dO wait"] == [2, 2]
    assert rep["phases"]["between visits"] == [25, 25]
    # union of in-flight intervals: [0, 310] and [280, 590] -> [0, 590] with no gap; span 0..590
    assert rep["cycles"] == 590 and rep["tensor_idle"] == pytest.approx(0.0)
    assert rep["cycles_per_visit"] == pytest.approx(590 / 2)
    text = tp.format_report(rep)
    assert "dS^T barrier" in text and "0.0 %" in text and "cycles per visit" in text and " 295" in text


def test_idle_share_counts_cycles_with_no_gemm_in_either_warpgroup():
    # both warpgroups in lockstep: in flight [0, 150] and [180, 250] each -> idle 30 of 250 cycles
    offs = [100, 50, 30, 10, 40, 20]
    rep = tp.phase_report(_stamps([(_visit(0, offs), _visit(0, offs))]), np.array([0, 1]))
    assert rep["tensor_idle"] == pytest.approx(30 / 250)
    # two CTAs: the shares add over the CTAs' cycles
    rows = [(_visit(0, offs), _visit(0, offs)), (_visit(1000, offs), _visit(1060, offs))]
    rep2 = tp.phase_report(_stamps(rows), np.array([0, 1, 2]))
    assert rep2["cycles"] == 250 + 310 and rep2["tensor_idle"] == pytest.approx(30 / 560)


def test_union_length_of_nested_overlapping_and_disjoint_intervals():
    iv = np.array([[10, 20], [0, 5], [12, 15], [18, 30], [40, 41], [3, 4]])
    assert tp._union_length(iv) == 5 + 20 + 1               # [0, 5], [10, 30], [40, 41]
    assert tp._union_length(np.zeros((0, 2), dtype=np.int64)) == 0


def test_idle_gaps_are_attributed_to_the_phases_both_warpgroups_are_in():
    # lockstep, two visits 25 cycles apart after a 5-cycle Q wait: idle [150, 180] in "dS^T, dV issue" for both,
    # [250, 280] "between visits" then "Q wait" (midpoint 265: between visits), [430, 460] dS^T again
    offs = [100, 50, 30, 10, 40, 20]
    rows = [(_visit(t0, offs, (5, 0)), _visit(t0, offs, (5, 0))) for t0 in (0, 280)]
    rep = tp.phase_report(_stamps(rows), np.array([0, 2]))
    assert rep["idle_by_phase"] == pytest.approx({"dS^T, dV issue | dS^T, dV issue": 60 / 530,
                                                 "between visits | between visits": 30 / 530})
    assert rep["quantiles"]["S^T wait"][0] == (100.0, 100.0, 100.0)
    assert "between visits | between visits" in tp.format_report(rep)


def test_union_gaps_lie_between_covered_stretches():
    iv = np.array([[10, 20], [0, 5], [12, 15], [18, 30], [40, 41]])
    assert tp._union_gaps(iv).tolist() == [[5, 10], [30, 40]]


def test_load_report_times_the_producer_against_the_stage_release_and_the_issues():
    offs = [100, 50, 30, 10, 40, 20]
    rows = [(_visit(300 * i, offs, (5, 7)), _visit(300 * i + 10, offs, (5, 7))) for i in range(4)]
    t = _stamps(rows)
    assert tp.load_report(t, np.array([0, 4])) == {}                  # no producer stamps: nothing to report
    t[:, tp.PROD_Q] = 300 * np.arange(4) - 40                          # Q issued 40 before wg 0's S^T issue
    t[:, tp.PROD_DO] = 300 * np.arange(4) - 20
    rep = tp.load_report(t, np.array([0, 4]))
    # visit i's stage was freed by visit i - 2's later dK done: 300 (i - 2) + 10 + 250
    assert rep["Q issued after release"] == (300 * 2 - 40 - 260,) * 3
    assert rep["Q issued -> S^T issued"] == (40.0, 40.0, 40.0)
    assert rep["dO issued -> dP^T issued"] == (27.0, 27.0, 27.0)


def test_switch_report_separates_a_kv_tile_change_from_the_visits_within_a_tile():
    # one CTA, visits 300 cycles apart with a 5-cycle Q wait, but the third visit (the first of KV tile 1) begins
    # 700 cycles later: end of visit (S^T issue + 250) -> next S^T issue is 50 within the tile, 750 at the switch
    offs = [100, 50, 30, 10, 40, 20]
    starts = (0, 300, 1300, 1600)
    rows = [(_visit(t0, offs, (5, 0)), _visit(t0, offs, (5, 0))) for t0 in starts]
    visits = np.array([[0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 1, 0], [0, 0, 1, 1]], dtype=np.int32)
    rep = tp.switch_report(_stamps(rows), visits, np.array([0, 4]))
    assert rep["switches"] == 1
    assert rep["switch"] == [(750.0, 750.0)] * 2 and rep["within"] == [(50.0, 50.0)] * 2
    assert rep["excess"] == pytest.approx(700 / 1850)                # CTA cycles: S^T issue 0 .. dK done 1850
    assert rep["switch_parts"] == [{"end -> top": 745.0, "top -> S^T": 5.0}] * 2    # the 5-cycle Q wait after it
    assert "KV-tile switches 1" in tp.format_switch_report(rep)
    # the same tile in another head is a switch too; a new CTA is not (nothing ran before it there)
    visits[2:, 1] = 1
    visits[2:, 2] = 0
    assert tp.switch_report(_stamps(rows), visits, np.array([0, 4]))["switches"] == 1
    rep2 = tp.switch_report(_stamps(rows), visits, np.array([0, 2, 4]))
    assert rep2["switches"] == 0 and rep2["excess"] == 0.0
    # GQA: heads 0 and 1 of one group share their KV tiles, so the head change alone is no switch
    assert tp.switch_report(_stamps(rows), visits, np.array([0, 4]), group=2)["switches"] == 0


def test_gemm_order_report_names_the_order_of_the_four_completions():
    # wg 0 issues S^T at 0 and dP^T at 2, wg 1 at 10 and 12; S^T done at 100 / 110, dP^T at 150 / 160: both S^T
    # complete before either dP^T ("S0 S1 dP0 dP1"). A second visit with wg 1 first and the GEMMs one warpgroup
    # after the other: wg 1's S^T and dP^T complete at 100 / 150, wg 0's at 210 / 260 ("S1 dP1 S0 dP0").
    offs = [100, 50, 30, 10, 40, 20]
    rows = [(_visit(0, offs, (0, 2)), _visit(10, offs, (0, 2))),
            (_visit(1110, offs, (0, 2)), _visit(1000, offs, (0, 2)))]
    rep = tp.gemm_order_report(_stamps(rows))
    assert rep["orders"] == {"S0 S1 dP0 dP1": 0.5, "S1 dP1 S0 dP0": 0.5}
    assert rep["after_issue"]["S0 issue"] == pytest.approx((0 + 110) / 2)
    assert rep["after_issue"]["dP1 done"] == pytest.approx((160 + 150) / 2)
    text = tp.format_report(tp.phase_report(_stamps(rows[:1]), np.array([0, 1])))
    assert "S0 S1 dP0 dP1 100.0" in text and "dP1 done 160" in text
