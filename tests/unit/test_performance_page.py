"""docs/performance.md is what benchmarks/performance_page.py makes of benchmarks/results/ (so it stays current),
and the page takes the newest report of each configuration. CPU only."""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))      # the scripts import their siblings by name, as `python SCRIPT` does

import performance_page  # noqa: E402


def test_the_committed_page_is_current():
    assert (ROOT / "docs" / "performance.md").read_text() == performance_page.render(), \
        "docs/performance.md is out of date: run python benchmarks/performance_page.py"


def _report(date, hdim, causal, tflops, heads_kv=None):
    cfg = dict(hdim=hdim, causal=causal, seqlen=4096, batch=4, heads=16,
               results={"dash_bwd_auto": dict(tflops=tflops, median_ms=1.0)})
    if heads_kv:
        cfg["heads_kv"] = heads_kv
    return dict(meta=dict(date=date, command=f"bench {date}", gpu="H200", dtype="bf16"), configs=[cfg])


def test_newest_report_per_configuration(tmp_path, monkeypatch):
    results = tmp_path / "benchmarks" / "results"
    (results / "sub").mkdir(parents=True)
    reports = {"old.json": _report("2026-01-01T00:00:00", 128, True, 111.0),
               "sub/new.json": _report("2026-02-01T00:00:00", 128, True, 222.0),
               "full.json": _report("2026-01-15T00:00:00", 128, False, 333.0),
               "gqa.json": _report("2026-01-20T00:00:00", 128, True, 444.0, heads_kv=2)}
    for name, report in reports.items():
        (results / name).write_text(json.dumps(report))
    (results / "train.json").write_text(json.dumps({"steps": 3}))          # not a benchmark report: skipped
    monkeypatch.setattr(performance_page, "ROOT", tmp_path)
    page = performance_page.render(results)
    causal = page.split("## Head dim 128, causal mask\n")[1].split("\n## ")[0]
    assert "| 222 |" in causal and "| 111 |" not in causal
    assert "benchmarks/results/old.json" in causal            # listed as an earlier report
    assert "| 333 |" in page.split("## Head dim 128, full mask\n")[1].split("\n## ")[0]
    assert "| 444 |" in page.split("GQA 8 query heads per KV head\n")[1]
    sources = page.split("## Sources\n")[1]
    assert sources.index("sub/new.json") < sources.index("gqa.json") < sources.index("old.json")
    assert "train.json" not in page
