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


def _steady(date, impls, softcap=0.0, group=1):
    loop = dict(ms=1.0, sm_mhz=1700.0, power_w=690.0, mcycles=1.7)
    summary = dict(ms_median=1.0, ms_min=1.0, ms_max=1.0, tflops=500.0, sm_mhz_median=1700.0, power_w_median=690.0,
                   mcycles_median=1.7, rel_diff_vs_ours=0.0, valid=True)
    shape = dict(shape=dict(name="full:3840", hdim=128, group=group), loops={n: [loop] for n in impls},
                 summary={n: summary for n in impls}, ratios={})
    return dict(meta=dict(date=date, command=f"steady {date}", commit="abc", kernels_sha256="0" * 64, gpu="H200",
                          rounds=1, loop_s=0.4, softcap=softcap, group=group), shapes=[shape])


def test_steady_reports_with_and_without_fa3_or_a_cap_are_separate_sections(tmp_path, monkeypatch):
    """A later report of ours alone (another card, other shapes), of capped calls or of a GQA group must not
    replace the newest report beside FA3 (or of ours alone) as its head dim's section."""
    results = tmp_path / "benchmarks" / "results"
    results.mkdir(parents=True)
    reports = {"beside.json": _steady("2026-01-01T00:00:00", ["dash_det", "fa3_nondet"]),
               "alone.json": _steady("2026-02-01T00:00:00", ["dash_det"]),
               "capped.json": _steady("2026-03-01T00:00:00", ["dash_det", "dash_nocap"], softcap=50.0),
               "gqa.json": _steady("2026-04-01T00:00:00", ["dash_det", "dash_shift"], group=2)}
    for name, report in reports.items():
        (results / name).write_text(json.dumps(report))
    monkeypatch.setattr(performance_page, "ROOT", tmp_path)
    page = performance_page.render(results)
    sections = {s.split("\n")[0]: s for s in page.split("\n## ")[1:]}
    assert "beside.json" in sections["Backward, head dim 128, at a steady clock"]
    assert "alone.json" in sections["Backward, head dim 128, cupy_dash alone, at a steady clock"]
    assert "capped.json" in sections["Backward, head dim 128, soft-capped (50) beside the same call uncapped, at a "
                                     "steady clock"]
    gqa = sections["Backward, head dim 128, cupy_dash alone, GQA group 2, at a steady clock"]
    assert "gqa.json" in gqa and "GQA group 2; " in gqa
    assert "gqa.json" not in sections["Backward, head dim 128, cupy_dash alone, at a steady clock"]
