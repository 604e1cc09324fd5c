"""Markdown tables (TFLOP/s and milliseconds per configuration, bitwise repeatability of the deterministic
backward passes, host overhead, compile times) and a PNG plot of a report of benchmarks/bench.py (the plot
needs matplotlib)."""
from __future__ import annotations

from cupy_dash.cli.measure import ATOMIC, SCHEDULES

LABELS = {
    "dash_fwd": "cupy_dash fwd",
    "torch_fwd": "torch SDPA FA2 fwd",
    "fa3_fwd": "FA3 fwd",
    "torch_bwd_det": "torch SDPA FA2 det bwd",
    "torch_bwd_nondet": "torch SDPA FA2 non-det bwd",
    "fa3_bwd_det": "FA3 det bwd",
    "fa3_bwd_nondet": "FA3 non-det bwd",
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
        ["torch_fwd", "fa3_fwd", "torch_bwd_det", "torch_bwd_nondet", "fa3_bwd_det", "fa3_bwd_nondet"]
    return [k for k in order if k in keys] + [k for k in keys if k not in order]


def _dims(cfg) -> tuple:
    """(head dim, value head dim) of a configuration (bench.py's ``hdim_v`` where v's head dim differs)."""
    return cfg["hdim"], cfg.get("hdim_v") or cfg["hdim"]


def _dims_label(dims) -> str:
    hdim, hdim_v = dims
    return f"head dim {hdim}" + (f", value head dim {hdim_v}" if hdim_v != hdim else "")


def _best_det(results):
    """The fastest deterministic cupy_dash schedule of one configuration: (key, entry) or (None, None)."""
    best = (None, None)
    for s in SCHEDULES:
        e = results.get(f"dash_bwd_{s}")
        if e and "error" not in e and (best[1] is None or e["median_ms"] < best[1]["median_ms"]):
            best = (f"dash_bwd_{s}", e)
    return best


def _repeat_table(configs, groups):
    """Whether two deterministic backward calls on the same inputs gave identical dq, dk, dv bytes."""
    keys = [k for k in _row_keys(configs) if any("repeats_bits" in (c["results"].get(k) or {}) for c in configs)]
    if not keys:
        return []
    lines = ["## Deterministic backward: identical bits on a second call?", ""]
    for dims, causal in groups:
        cfgs = sorted((c for c in configs if (_dims(c), c["causal"]) == (dims, causal)), key=lambda c: c["seqlen"])
        lines += [f"| {_dims_label(dims)}, {'causal' if causal else 'full'} | " +
                  " | ".join(_seq_label(c["seqlen"]) for c in cfgs) + " |", "|" + "---|" * (len(cfgs) + 1)]
        for key in keys:
            cells = []
            for c in cfgs:
                r = c["results"].get(key) or {}
                cells.append("-" if "repeats_bits" not in r else ("yes" if r["repeats_bits"] else "**no**"))
            lines.append(f"| {_label(key)} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def plot_report(report, path):
    """PNG: TFLOP/s against S, one panel per (pass, head dim, mask): a row of forward panels and a row of
    backward panels per head dim, one line per implementation."""
    try:
        import matplotlib
    except ImportError as exc:
        raise ImportError(f"the benchmark's PNG needs matplotlib: pip install matplotlib ({exc})") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = report["configs"]
    hdims = sorted({_dims(c) for c in configs})
    masks = [m for m in (False, True) if any(c["causal"] == m for c in configs)]
    rows = [(kind, hdim) for hdim in hdims for kind in ("fwd", "bwd")
            if any(kind in k for c in configs if _dims(c) == hdim for k in c["results"])]
    fig, axes = plt.subplots(len(rows), len(masks), figsize=(6.5 * len(masks), 4.2 * len(rows)), squeeze=False)
    styles = {"dash": dict(lw=2), "torch": dict(ls="--"), "fa3": dict(ls=":", lw=2)}
    for r, (kind, hdim) in enumerate(rows):
        for col, causal in enumerate(masks):
            ax = axes[r][col]
            cfgs = sorted((c for c in configs if _dims(c) == hdim and c["causal"] == causal),
                          key=lambda c: c["seqlen"])
            for key in _row_keys(cfgs):
                if kind not in key:
                    continue
                pts = [(c["seqlen"], c["results"][key]["tflops"]) for c in cfgs
                       if key in c["results"] and "error" not in c["results"][key]]
                if pts:
                    xs, ys = zip(*pts)
                    ax.plot(xs, ys, marker="o", ms=3, label=_label(key), **styles.get(key.split("_")[0], {}))
            ax.set_xscale("log", base=2)
            ax.set_xticks([c["seqlen"] for c in cfgs], [_seq_label(c["seqlen"]) for c in cfgs])
            name = "forward" if kind == "fwd" else "backward"
            ax.set_title(f"{name}, {_dims_label(hdim)}, {'causal' if causal else 'full'}")
            ax.set_xlabel("sequence length (16k tokens per batch)")
            ax.set_ylabel("TFLOP/s")
            ax.grid(alpha=0.3)
            ax.set_ylim(bottom=0)
    legend = {}
    for ax in axes.flat:
        for h, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, h)
    fig.legend(list(legend.values()), list(legend), loc="lower center", ncol=4, fontsize=8, frameon=False)
    meta = report["meta"]
    fig.suptitle(f"{meta.get('gpu', '?')}, {meta['dtype']}, {meta['date']}")
    fig.tight_layout(rect=(0, 0.04 + 0.04 / len(rows), 1, 0.97))
    fig.savefig(path, dpi=110)
    plt.close(fig)


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
             + ". Backward = the backward call alone. FA3 (flash-attn3-jax) is timed by wall clock over back-to-back "
             "calls (no CUDA events in JAX), on the same inputs and cupy_dash's forward out / lse.", ""]
    missing = meta.get("missing_peers") or {}
    if missing:
        lines += ["Missing peers: " + "; ".join(f"{k}: {v}" for k, v in missing.items()), ""]
    configs = report["configs"]
    groups = []
    for cfg in configs:
        g = (_dims(cfg), cfg["causal"])
        if g not in groups:
            groups.append(g)
    for unit, fmt in (("TFLOP/s", _fmt_tflops), ("median ms", _fmt_ms)):
        lines += [f"## {unit}", ""]
        for dims, causal in groups:
            cfgs = sorted((c for c in configs if (_dims(c), c["causal"]) == (dims, causal)),
                          key=lambda c: c["seqlen"])
            head = f"| {_dims_label(dims)}, {'causal' if causal else 'full'} | " + \
                " | ".join(_seq_label(c["seqlen"]) for c in cfgs) + " |"
            lines += [head, "|" + "---|" * (len(cfgs) + 1)]
            for key in _row_keys(cfgs):
                lines.append(f"| {_label(key)} | " + " | ".join(fmt(c["results"].get(key)) for c in cfgs) + " |")
            if unit == "TFLOP/s":
                for name, ref in (("our atomic", f"dash_bwd_{ATOMIC}"), ("torch FA2 det", "torch_bwd_det"),
                                  ("FA3 det", "fa3_bwd_det")):
                    cells = []
                    for c in cfgs:
                        _, best = _best_det(c["results"])
                        other = c["results"].get(ref)
                        ok = best is not None and other and "error" not in other
                        cells.append(f"{other['median_ms'] / best['median_ms']:.2f}" if ok else "-")
                    if any(x != "-" for x in cells):
                        lines.append(f"| best cupy_dash det / {name} (speed) | " + " | ".join(cells) + " |")
                for name, ref in (("torch FA2 fwd", "torch_fwd"), ("FA3 fwd", "fa3_fwd")):
                    cells = []
                    for c in cfgs:
                        ours, other = c["results"].get("dash_fwd"), c["results"].get(ref)
                        ok = ours and other and "error" not in ours and "error" not in other
                        cells.append(f"{other['median_ms'] / ours['median_ms']:.2f}" if ok else "-")
                    if any(x != "-" for x in cells):
                        lines.append(f"| cupy_dash fwd / {name} (speed) | " + " | ".join(cells) + " |")
            lines.append("")
    lines += _repeat_table(configs, groups)
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
