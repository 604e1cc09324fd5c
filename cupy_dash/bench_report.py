"""Markdown tables of a :mod:`cupy_dash.bench` report (TFLOP/s and milliseconds per configuration, host
overhead, compile times)."""
from __future__ import annotations

ATOMIC = "atomic"                      # deterministic=False
SCHEDULES = ("fa3", "descending", "shift", "symmetric_shift", "auto")

LABELS = {
    "dash_fwd": "cupy_dash fwd",
    "torch_fwd": "torch SDPA FA2 fwd",
    "torch_bwd_det": "torch SDPA FA2 det bwd",
    "torch_bwd_nondet": "torch SDPA FA2 non-det bwd",
}


def _label(key):
    if key in LABELS:
        return LABELS[key]
    if key.startswith("dash_bwd_"):
        s = key[len("dash_bwd_"):]
        return f"cupy_dash bwd {s}" + (" (non-det)" if s == ATOMIC else "")
    return key


def _seq_label(s):
    return f"{s // 1024}k" if s >= 1024 and s % 1024 == 0 else str(s)


def _fmt_tflops(entry):
    if entry is None:
        return "-"
    if "error" in entry:
        return "err"
    t = entry["tflops"]
    return f"{t:.0f}" if t >= 100 else f"{t:.1f}"


def _fmt_ms(entry):
    if entry is None:
        return "-"
    if "error" in entry:
        return "err"
    return f"{entry['median_ms']:.3f}"


def _row_keys(configs):
    keys = []
    for cfg in configs:
        for k in cfg["results"]:
            if k not in keys:
                keys.append(k)
    order = ["dash_fwd"] + [f"dash_bwd_{s}" for s in SCHEDULES + (ATOMIC,)] + \
        ["torch_fwd", "torch_bwd_det", "torch_bwd_nondet"]
    return [k for k in order if k in keys] + [k for k in keys if k not in order]


def markdown_report(report):
    meta = report["meta"]
    lines = [f"# cupy_dash benchmark, {meta['date']}", "",
             f"GPU: {meta.get('gpu', '?')} ({meta.get('sms', '?')} SMs); cupy {meta.get('cupy')}, "
             f"torch {meta.get('torch') or 'not used'}, cupy_dash {meta.get('cupy_dash')}.",
             f"Command: `{meta['command']}`", "",
             f"{meta['dtype']}, {meta['tokens']} tokens per batch (B = {meta['tokens']} / S), H·D = "
             f"{meta['hidden']}. TFLOP/s with the FA3 convention (fwd 4·B·H·S²·D, ×½ causal; bwd 2.5× fwd); "
             f"CUDA events, median of {meta['repeats']} after {meta['warmup']} warm-up calls, rotating over "
             f"{meta['input_sets']} input sets" + (", L2 flushed before every call" if meta["flush_l2"] else "")
             + ". Backward = the backward call alone.", ""]
    configs = report["configs"]
    groups = []
    for cfg in configs:
        g = (cfg["hdim"], cfg["causal"])
        if g not in groups:
            groups.append(g)
    for unit, fmt in (("TFLOP/s", _fmt_tflops), ("median ms", _fmt_ms)):
        lines += [f"## {unit}", ""]
        for hdim, causal in groups:
            cfgs = sorted((c for c in configs if (c["hdim"], c["causal"]) == (hdim, causal)),
                          key=lambda c: c["seqlen"])
            head = f"| head dim {hdim}, {'causal' if causal else 'full'} | " + \
                " | ".join(_seq_label(c["seqlen"]) for c in cfgs) + " |"
            lines += [head, "|" + "---|" * (len(cfgs) + 1)]
            for key in _row_keys(cfgs):
                lines.append(f"| {_label(key)} | " + " | ".join(fmt(c["results"].get(key)) for c in cfgs) + " |")
            if unit == "TFLOP/s":
                det = []
                for c in cfgs:
                    a, b = c["results"].get("dash_bwd_auto"), c["results"].get(f"dash_bwd_{ATOMIC}")
                    ok = a and b and "error" not in a and "error" not in b
                    det.append(f"{100.0 * b['median_ms'] / a['median_ms']:.0f}%" if ok else "-")
                if any(d != "-" for d in det):
                    lines.append("| cupy_dash det (auto) speed vs atomic | " + " | ".join(det) + " |")
            lines.append("")
    errors = [(c, k, r["error"]) for c in configs for k, r in c["results"].items() if "error" in r]
    if errors:
        lines += ["## Failed measurements", ""]
        lines += [f"- d{c['hdim']} {'causal' if c['causal'] else 'full'} S={c['seqlen']}, {_label(k)}: {e}"
                  for c, k, e in errors]
        lines.append("")
    ov = report.get("host_overhead")
    if ov:
        lines += ["## Host overhead per call", ""]
        if "error" in ov:
            lines.append(f"failed: {ov['error']}")
        else:
            lines.append(f"B=1, H=1, S=128, D=64, {ov['calls']} calls back to back, one synchronization at the "
                         "end (µs per call):")
            lines.append("")
            lines += ["| | forward | backward |", "|---|---|---|",
                      f"| cupy_dash | {ov['dash_fwd_us']:.1f} | {ov['dash_bwd_us']:.1f} |"]
            if "torch_fwd_us" in ov:
                lines.append(f"| torch SDPA FA2 | {ov['torch_fwd_us']:.1f} | {ov['torch_bwd_us']:.1f} |")
        lines.append("")
    ct = report.get("compile")
    if ct:
        sh = ct.get("shape", {})
        lines += ["## Compile time (first forward + backward in a fresh process)", "",
                  f"d{sh.get('hdim')} {'causal' if sh.get('causal') else 'full'} {sh.get('dtype')}; cold = empty "
                  "CUPY_DASH_CACHE_DIR and CUPY_CACHE_DIR, warm = the same directories in a new process.", "",
                  "| | first fwd (s) | first bwd (s) | second fwd+bwd (s) | import (s) | process (s) |",
                  "|---|---|---|---|---|---|"]
        for phase in ("cold", "warm"):
            r = ct.get(phase)
            if not r:
                continue
            if "error" in r:
                lines.append(f"| {phase} | failed: {r['error']} | | | | |")
            else:
                lines.append(f"| {phase} | {r['first_fwd_s']:.2f} | {r['first_bwd_s']:.2f} | "
                             f"{r['second_fwd_bwd_s']:.3f} | {r['import_s']:.2f} | {r['process_wall_s']:.1f} |")
        lines.append("")
    return "\n".join(lines)
