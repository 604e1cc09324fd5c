"""benchmarks/steady_ab_summary.py reads a steady_ab run's reports: medians per leg over every process's rounds, and
the per-round speed against FA3 paired by round. CPU only."""
from __future__ import annotations

import json
import sys
import tarfile
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _report(path: Path, det_ms: list, fa3_ms: list):
    loops = {impl: [{"ms": ms, "mcycles": ms * 1.5, "sm_mhz": 1500.0} for ms in times]
             for impl, times in (("dash_det", det_ms), ("fa3_nondet", fa3_ms))}
    path.write_text(json.dumps({"meta": {}, "shapes": [{"shape": {"name": "causal:8192"}, "loops": loops}]}))


def test_summary_pairs_rounds_and_pools_processes(tmp_path):
    _report(tmp_path / "tree_1.json", [2.0, 2.2], [2.0, 1.1])
    _report(tmp_path / "tree_2.json", [4.0], [2.0])
    _report(tmp_path / "old_tree_1.json", [1.0], [1.0])
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import steady_ab_summary
    finally:
        sys.path.remove(str(BENCHMARKS))
    loops = steady_ab_summary.load(tmp_path)
    assert len(loops[("tree", "causal:8192", "dash_det")]) == 3
    assert ("old_tree", "causal:8192", "dash_det") in loops    # the leg name keeps its underscores
    lines = steady_ab_summary.summary(loops)
    tree = next(line for line in lines if " tree " in line)
    assert "dash_det 2.2000" in tree and "vs FA3 0.500" in tree    # ratios 1.0, 0.5, 0.5
    with tarfile.open(tmp_path / "steady_ab.tgz", "w:gz") as tar:
        tar.add(tmp_path / "tree_1.json", arcname="tree_1.json")
    assert steady_ab_summary.load(tmp_path)    # the folder still loads beside its tgz
