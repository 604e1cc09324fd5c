"""docs/performance.md from the benchmark reports in benchmarks/results/ (every ``**/*.json`` written by
benchmarks/bench.py: ``{"meta": {date, command, ...}, "configs": [{hdim, causal, seqlen, ..., results}]}``).

One table per (head dim, mask, GQA group) from the newest report that measured it, with that report's date and
command, then the earlier reports of the same configuration and every source. The page is generated, never edited:
tests/unit/test_performance_page.py checks that regenerating it gives the committed file.

    python benchmarks/performance_page.py            # writes docs/performance.md
    python benchmarks/performance_page.py --check    # exit 1 if docs/performance.md is not current
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import bench_report
import steady_bench

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "performance.md"
COMMAND = "python benchmarks/performance_page.py"


def load_reports(results: Path = RESULTS) -> list:
    """Every benchmark report under ``results`` as ``(path relative to the repository, report)``, oldest first
    (by the report's own date, then path); other JSON files (training runs, host overhead) are skipped."""
    reports = []
    for path in sorted(results.rglob("*.json")):
        report = json.loads(path.read_text())
        if isinstance(report, dict) and "meta" in report and "configs" in report:
            reports.append((path.relative_to(ROOT).as_posix(), report))
    return sorted(reports, key=lambda r: (r[1]["meta"].get("date", ""), r[0]))


def _group(cfg) -> int:
    return cfg["heads"] // cfg["heads_kv"] if cfg.get("heads_kv") else 1


def load_steady(results: Path = RESULTS) -> dict:
    """The reports of benchmarks/steady_bench.py outside experiments/ per configuration, oldest first (by the
    report's date, then path): {(forward, hdim, soft-capped, without a peer, dtype, with cuDNN, GQA group): [(path,
    report), ...]}; a report that timed FA3 beside ours, one that timed cuDNN and one that timed ours alone (another
    card, other shapes) are separate configurations."""
    found = {}
    for path in sorted(results.rglob("*.json")):
        report = json.loads(path.read_text())
        if not (isinstance(report, dict) and "meta" in report and report.get("shapes")
                and "ratios" in report["shapes"][0]):        # steady_bench's (fwd_order.py's have no ratios)
            continue
        rel = path.relative_to(ROOT).as_posix()
        if f"/{EXPERIMENTS}/" in f"/{rel}":
            continue
        impls = {impl for shape in report["shapes"] for impl in shape["loops"]}
        key = (bool(report["meta"].get("forward")), report["shapes"][0]["shape"]["hdim"],
               bool(report["meta"].get("softcap")), all(impl.startswith("dash_") for impl in impls),
               report["meta"].get("dtype", "bf16"), any(impl.startswith("cudnn_") for impl in impls),
               report["shapes"][0]["shape"].get("group", 1))
        found.setdefault(key, []).append((rel, report))
    return {key: sorted(reports, key=lambda r: (r[1]["meta"]["date"], r[0])) for key, reports in found.items()}


def _steady_sections(results: Path) -> list:
    """One section per configuration (:func:`load_steady`): the newest report's tables and chart, then its earlier
    reports (each on its own card and call: the ratios to FA3 move with the card, docs/decisions/bwd-engine.md)."""
    lines = []
    for (forward, hdim, capped, alone, dtype, cudnn, group), reports in sorted(load_steady(results).items()):
        path, report = reports[-1]
        what = "Forward" if forward else "Backward"
        how = (f", soft-capped ({report['meta']['softcap']:g}) beside the same call uncapped" if capped else "") + \
            (", cupy_dash alone" if alone and not capped else "") + (", beside cuDNN" if cudnn else "") + \
            (f", {dtype}" if dtype != "bf16" else "") + (f", GQA group {group}" if group > 1 else "")
        lines += [f"## {what}, head dim {hdim}{how}, at a steady clock", "",
                  f"{_link(path)}, {report['meta']['date']}.", ""]
        lines += steady_bench.markdown(report, title=False).splitlines() + [""]
        if hdim != 128 and any(impl.startswith("fa3") for shape in report["shapes"] for impl in shape["loops"]):
            lines += [FA3_PADDED.format(hdim=hdim), ""]
        png = (ROOT / path).with_suffix(".png")
        if png.exists():
            rel = png.relative_to(ROOT).as_posix()
            lines += [f"![{rel}](../{rel})", ""]
        if len(reports) > 1:
            lines += ["Earlier steady reports of this configuration:", ""]
            for old_path, old in reversed(reports[:-1]):
                meta = old["meta"]
                impls = sorted({impl for shape in old["shapes"] for impl in shape["loops"]})
                lines.append(f"- {meta['date']}, {_link(old_path)}: {meta.get('gpu', '?')}, commit "
                             f"{meta.get('commit') or '?'}; {', '.join(impls)}{_ratio_range(old)}")
            lines.append("")
    return lines


def _ratio_range(report) -> str:
    """``"; ours / FA3 non-deterministic 0.93-1.00"`` (the range over the report's shapes of the median ratios of
    its first ours-against-FA3 ratio: dash_det / fa3_nondet, dash_fwd / fa3_fwd), or "" without one."""
    names = [n for n in report["shapes"][0]["ratios"] if n.startswith("dash_") and "_vs_fa3_" in n]
    if not names:
        return ""
    medians = [shape["ratios"][names[0]]["median"] for shape in report["shapes"] if names[0] in shape["ratios"]]
    peer = "FA3 non-deterministic" if names[0].endswith("_nondet") else "FA3"
    return f"; ours / {peer} {min(medians):.2f}-{max(medians):.2f}"


def _key(cfg) -> tuple:
    return cfg["hdim"], bool(cfg["causal"]), _group(cfg), cfg["heads"] * cfg["hdim"], cfg.get("hdim_v") or cfg["hdim"]


def _title(key) -> str:
    hdim, causal, group, hidden, hdim_v = key
    value = f", value head dim {hdim_v}" if hdim_v != hdim else ""
    gqa = f", GQA {group} query heads per KV head" if group > 1 else ""
    width = f", H·D = {hidden}" if hidden != 2048 else ""
    return f"Head dim {hdim}{value}, {'causal' if causal else 'full'} mask{gqa}{width}"


def _measurement(meta) -> str:
    parts = [f"{meta.get('gpu', '?')} ({meta.get('sms', '?')} SMs)", meta.get("dtype", "?")]
    if "tokens" in meta and "hidden" in meta:
        parts.append(f"{meta['tokens']} tokens per batch, H·D = {meta['hidden']}")
    if "repeats" in meta:
        parts.append(f"median of {meta['repeats']} after {meta.get('warmup', '?')} warm-up calls")
    if meta.get("commit"):
        parts.append(f"kernels of commit {meta['commit']}")
    return ", ".join(parts)


def _table(cfgs) -> list:
    cfgs = sorted(cfgs, key=lambda c: c["seqlen"])
    lines = ["| TFLOP/s | " + " | ".join(bench_report._seq_label(c["seqlen"]) for c in cfgs) + " |",
             "|" + "---|" * (len(cfgs) + 1)]
    for name in bench_report._row_keys(cfgs):
        cells = [bench_report._fmt_tflops(c["results"].get(name)) for c in cfgs]
        lines.append(f"| {bench_report._label(name)} | " + " | ".join(cells) + " |")
    return lines


PEERS = {"dash": "cupy_dash", "torch": "torch SDPA FA2", "fa3": "FA3", "cudnn": "cuDNN (torch SDPA)"}

FA3_PADDED = ("FA3 here is the flash-attn3-jax wheel, whose library has head-dim-128 kernels only: at head dim {hdim} "
              "its calls run a head-dim-128 kernel on zero-padded columns, so the ratio to FA3 in this table is not "
              "a comparison with an FA3 kernel built for head dim {hdim}.")


def _measured(names) -> str:
    """What a report measured, in short: ``cupy_dash: fwd, bwd auto, bwd atomic; FA3: fwd, bwd det``."""
    groups = {}
    for name in names:
        who, _, what = name.partition("_")
        groups.setdefault(PEERS.get(who, who), []).append(what.replace("_", " ", 1))
    return "; ".join(f"{who}: {', '.join(whats)}" for who, whats in groups.items())


def _link(path: str) -> str:
    """A Markdown link from docs/ to a file of the repository."""
    return f"[{path}](../{path})"


def _experiment(report) -> dict:
    """What a report ran with beyond the default: its non-default CUPY_DASH_* settings (meta "env") and a logit
    cap (meta "softcap"); empty for the default build and calls."""
    meta = report["meta"]
    extra = {"--softcap": meta["softcap"]} if meta.get("softcap") else {}
    return dict(meta.get("env") or {}, **extra)


EXPERIMENTS = "experiments"   # benchmarks/results/experiments/: A/B legs, the default leg too (evidence, not tables)


def _is_experiment(path: str, report) -> bool:
    return bool(_experiment(report)) or f"/{EXPERIMENTS}/" in f"/{path}"


def render(results: Path = RESULTS) -> str:
    reports = load_reports(results)
    experiments = [(p, r) for p, r in reports if _is_experiment(p, r)]
    reports = [(p, r) for p, r in reports if not _is_experiment(p, r)]
    newest, earlier = {}, {}
    for path, report in reports:                  # oldest first: later reports replace earlier ones
        for key in {_key(c) for c in report["configs"]}:
            if key in newest:
                earlier.setdefault(key, []).append(newest[key])
            newest[key] = (path, report)
    lines = ["# Performance", "",
             f"Generated by `{COMMAND}` from the benchmark reports in {_link('benchmarks/results/')}; do not edit "
             "(`tests/unit/test_performance_page.py` checks that the page is current). A report is what "
             "`benchmarks/bench.py` writes: TFLOP/s with the FlashAttention-3 convention (forward 4·B·H·Sq·Sk·D, "
             "halved for causal; backward 2.5x the forward), GPU time from CUDA events around each call; FA3 "
             "(flash-attn3-jax) is timed by wall clock over back-to-back calls. Peers in a table ran in the same "
             "process as cupy_dash. `cupy_dash bwd auto` and the named schedules are deterministic; `atomic` is "
             "the non-deterministic backward (atomic dQ adds, same kernels).", "",
             "Each table is the newest report that measured its configuration; earlier reports are listed under it "
             "(their own tables, where written, are the `.md` files next to the JSON). The reports of 2026-11-30 "
             "measured the first (mma.sync) kernels. Commits are in the file names of "
             "`benchmarks/results/engine_20261201/`; what each change was: "
             "[decisions/bwd-engine.md](decisions/bwd-engine.md). Commands are as recorded: "
             "`python -m cupy_dash bench` is now `python benchmarks/bench.py`, with the same options.", "",
             "The first sections come from `benchmarks/steady_bench.py`: each implementation timed in loops of "
             "back-to-back calls at the steady (power-limited) clock, interleaved in one process with the order "
             "rotated every round, so that the ratios to FA3 do not depend on which ran after an idle GPU. They "
             "are the engine's comparison with FA3; the bench.py tables below time each implementation once after "
             "its own warm-up and move by up to ~10 % between calls at short shapes.", ""]
    lines += _steady_sections(results)
    for key in sorted(newest, key=lambda k: (-k[0], k[1], k[2], -k[3])):
        path, report = newest[key]
        meta = report["meta"]
        lines += [f"## {_title(key)}", "",
                  f"{_link(path)}, {meta.get('date', '?')}: `{meta.get('command', '?')}`. "
                  f"{_measurement(meta)}.", ""]
        lines += _table([c for c in report["configs"] if _key(c) == key]) + [""]
        png = (ROOT / path).with_suffix(".png")
        if png.exists():
            rel = png.relative_to(ROOT).as_posix()
            lines += [f"![{rel}](../{rel})", ""]
        if key in earlier:
            lines += ["Earlier reports of this configuration:", ""]
            for old_path, old in reversed(earlier[key]):
                seqlens = sorted({c["seqlen"] for c in old["configs"] if _key(c) == key})
                names = bench_report._row_keys([c for c in old["configs"] if _key(c) == key])
                lines.append(f"- {old['meta'].get('date', '?')}, {_link(old_path)}: S = "
                             f"{', '.join(bench_report._seq_label(s) for s in seqlens)}; {_measured(names)}")
            lines.append("")
    if experiments:
        lines += ["## Experiments", "",
                  "Reports measured with a non-default setting (`docs/configuration.md`), and the legs of A/B "
                  f"comparisons kept in `benchmarks/results/{EXPERIMENTS}/` (the default leg too): the evidence of "
                  "the decision records, not the tables above.", "",
                  "| report | date | settings | measured |", "|---|---|---|---|"]
        for path, report in reversed(experiments):
            settings = ", ".join(f"`{k}={v}`" for k, v in sorted(_experiment(report).items())) or "default"
            names = bench_report._row_keys(report["configs"])
            lines.append(f"| {_link(path)} | {report['meta'].get('date', '?')} | {settings} | {_measured(names)} |")
        lines.append("")
    lines += ["## Sources", "", "| report | date | command |", "|---|---|---|"]
    for path, report in reversed(reports):
        meta = report["meta"]
        lines.append(f"| {_link(path)} | {meta.get('date', '?')} | `{meta.get('command', '?')}` |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the page is not current; write nothing")
    opts = ap.parse_args(argv)
    text = render()
    if opts.check:
        current = PAGE.exists() and PAGE.read_text() == text
        print(f"{PAGE.relative_to(ROOT)} is {'current' if current else 'out of date: run ' + COMMAND}")
        return 0 if current else 1
    PAGE.write_text(text)
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
