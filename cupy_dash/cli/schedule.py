"""``python -m cupy_dash schedule``: compare the schedules of one problem in the paper's DAG model or in the
engine model of our Hopper kernel (no GPU)."""
from __future__ import annotations

import argparse
import math
import os
import sys

import numpy as np

from .. import schedule
from ..schedule import compact
from .compact import (CLI_MAX_SIMULATED_VISITS, POLICY_ORDER, analyse_compact, auto_line, print_compact,
                      problem_text)

COLOURS = {"idle": "#ffffff", "compute": "#4c72b0", "reduce": "#55a868", "wait": "#c44e52"}


def analyse(*, seqlen_q, seqlen_k, block_m, block_n, heads, causal, num_sms, c=1.0, r=0.25, model="dag",
            group_size=1, window=(-1, -1)):
    """Build, validate and simulate every policy; returns a list of dicts (one per policy). ``wait`` sums, over
    the visits, the time from a visit's dQ being ready to its reduction starting. heads counts (batch, query head)
    pairs, group_size query heads per KV head (GQA), window the sliding window (left, right)."""
    rows = []
    for policy in POLICY_ORDER:
        plan = schedule.build(policy, seqlen_q=seqlen_q, seqlen_k=seqlen_k, block_m=block_m, block_n=block_n,
                              num_heads=heads, causal=causal, num_sms=num_sms, group_size=group_size,
                              window=window).validate()
        tl = schedule.timeline(plan, c, r, model)
        wait = float(np.sum(tl["reduce_start"] - tl["compute_start"] - c))
        bound = schedule.lower_bound(plan, c, r, model)
        rows.append({"policy": policy, "plan": plan, "timeline": tl, "makespan": tl["makespan"], "bound": bound,
                     "wait": wait})
    return rows


def print_analysis(rows, *, c, r, model, auto):
    """Print the simulated makespan of every policy (``rows``: :func:`analyse`'s) relative to the lower bound
    max(work / SMs, longest chain), then ``auto``: the :func:`cupy_dash.cli.compact.auto_line` of the problem."""
    name = "DAG model" if model == "dag" else "engine model"
    print(f"Schedule analysis ({name}: compute c={c:g}, reduce r={r:g} per visit): {problem_text(rows[0]['plan'])}")
    print(f"{'policy':<16} {'CTAs':>5} {'visits':>10} {'makespan':>11} {'/ bound':>8} {'wait / work':>12}")
    for row in rows:
        p = row["plan"]
        work = p.num_visits * (c + r if model == "dag" else c)
        print(f"{row['policy']:<16} {p.num_ctas:>5} {p.num_visits:>10} {row['makespan']:>11.2f} "
              f"{row['makespan'] / row['bound']:>8.3f} {row['wait'] / work:>12.3%}")
    print(f"lower bound {rows[0]['bound']:.2f}")
    print(auto)


def plot_gantt(rows, path, *, c=1.0, r=0.25, bins=1500):
    """Per-CTA simulated timeline of every policy (compute / reduce / wait / idle), one panel each."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    horizon = max(row["makespan"] for row in rows)
    t = (np.arange(bins) + 0.5) * horizon / bins
    cmap = ListedColormap([COLOURS[k] for k in ("idle", "compute", "reduce", "wait")])
    fig, axes = plt.subplots(len(rows), 1, figsize=(11, 2.2 * len(rows) + 0.8), sharex=True, squeeze=False)
    for ax, row in zip(axes[:, 0], rows):
        plan, tl = row["plan"], row["timeline"]
        image = np.zeros((plan.num_ctas, bins), dtype=np.int8)
        for cta in range(plan.num_ctas):
            lo, hi = plan.cta_start[cta], plan.cta_start[cta + 1]
            cs, rs = tl["compute_start"][lo:hi], tl["reduce_start"][lo:hi]
            i = np.searchsorted(cs, t, side="right") - 1
            valid = i >= 0
            ii = np.where(valid, i, 0)
            state = np.where(t < cs[ii] + c, 1, np.where(t < rs[ii], 3, np.where(t < rs[ii] + r, 2, 0)))
            image[cta] = np.where(valid, state, 0)
        ax.imshow(image, aspect="auto", interpolation="nearest", cmap=cmap, vmin=0, vmax=3,
                  extent=(0, horizon, plan.num_ctas, 0))
        ax.set_ylabel("CTA")
        ax.set_title(f"{row['policy']}: makespan {row['makespan']:.1f} "
                     f"({row['makespan'] / row['bound']:.3f} x lower bound)", fontsize=10, loc="left")
    axes[-1, 0].set_xlabel("simulated time (one visit computes for c)")
    fig.legend(handles=[Patch(color=COLOURS[k], label=k) for k in ("compute", "reduce", "wait", "idle")],
               loc="upper right", ncol=4, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _error(message, status=2) -> int:
    """Print ``message`` as the command's error; return the exit ``status``."""
    print(f"cupy_dash schedule: error: {message}", file=sys.stderr)
    return status


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise SystemExit(_error(message))


def _int_at_least(minimum):
    """argparse type: an integer >= minimum."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {text!r}")
        return value
    return parse


def _cost(zero_ok):
    """argparse type: a finite float > 0 (>= 0 with zero_ok); rejects inf and nan, which make every makespan
    infinite or nan."""
    def parse(text):
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
            raise argparse.ArgumentTypeError(f"must be a finite number {'>=' if zero_ok else '>'} 0, got {text!r}")
        return value
    return parse


def check_plot_path(path) -> str | None:
    """Why ``path`` cannot take the ``--plot`` chart (one line), or None if it can: its extension must be one
    matplotlib writes (less pgf), and the file must be writable. Checked by opening it for appending; a file
    created by the check is removed again."""
    try:
        from matplotlib.backend_bases import FigureCanvasBase
        formats = dict(FigureCanvasBase.get_supported_filetypes())      # extension -> description
    except ImportError as exc:
        return (f"--plot needs matplotlib, an optional dependency ({exc}): pip install matplotlib, or install "
                f"cupy_dash with its plot extra (pip install \"cupy_dash[plot]\"; from a checkout: pip install -e "
                f"\".[plot]\")")
    formats.pop("pgf", None)            # LaTeX source, which needs a TeX installation to write
    ext = os.path.splitext(path)[1].lower().lstrip(".")
    if ext not in formats:
        what = f"unsupported file extension {'.' + ext!r}" if ext else "no file extension"
        return f"--plot {path}: {what}; use one of {', '.join('.' + f for f in sorted(formats))}"
    existed = os.path.lexists(path)
    try:
        with open(path, "ab"):
            pass
    except OSError as exc:
        return f"--plot {path}: cannot write it: {exc.strerror or exc}"
    if not existed:
        os.unlink(path)
    return None


def _parser():
    p = _Parser(prog="python -m cupy_dash schedule",
                description="Simulate every schedule of one problem in the paper's DAG model (default) or in the "
                            "engine model of the Hopper kernel (--model engine); no GPU needed.")
    positive = _int_at_least(1)
    p.add_argument("--seqlen-q", type=positive, default=8192)
    p.add_argument("--seqlen-k", type=positive, default=None, help="defaults to --seqlen-q")
    p.add_argument("--block-m", type=positive, default=64)
    p.add_argument("--block-n", type=positive, default=128)
    p.add_argument("--heads", type=positive, default=16, help="number of (batch, query head) pairs")
    p.add_argument("--group-size", type=positive, default=1, help="query heads per KV head (GQA: H / Hkv)")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--window", nargs=2, type=_int_at_least(-1), default=(-1, -1), metavar=("LEFT", "RIGHT"),
                   help="sliding window: query i sees keys i + Sk - Sq - LEFT .. i + Sk - Sq + RIGHT; -1 leaves a "
                   "side unbounded (with --causal, RIGHT is 0)")
    p.add_argument("--num-sms", type=positive, default=132)
    p.add_argument("--c", type=_cost(zero_ok=False), default=1.0, help="compute cost of one visit (> 0)")
    p.add_argument("--r", type=_cost(zero_ok=True), default=0.25, help="reduction cost of one visit (>= 0)")
    p.add_argument("--model", choices=schedule.MODELS, default="dag",
                   help="dag: the paper's model (compute then reduce, serially); engine: the Hopper kernel's "
                   "pipeline (auto's model, with --r 0.8)")
    p.add_argument("--compact", action="store_true", help="analyse compact (per-column) records with the column "
                   "model, in O(columns) time and memory, instead of simulating every visit (automatic above "
                   f"{CLI_MAX_SIMULATED_VISITS} visits per table)")
    p.add_argument("--plot", metavar="PATH", help="write a Gantt chart of the simulated per-CTA timelines (DAG "
                   "model) to PATH (.png, .pdf, .svg, ...: any format matplotlib writes)")
    return p


def main(argv=None):
    args = _parser().parse_args(argv)
    seqlen_k = args.seqlen_q if args.seqlen_k is None else args.seqlen_k
    if args.plot is not None:
        if args.model != "dag":
            return _error("--plot draws the DAG model's timelines only")
        problem = check_plot_path(args.plot)     # before the analysis, which can take a while
        if problem:
            return _error(problem)
    try:
        args.window = schedule.canonical_window(tuple(args.window), args.seqlen_q, seqlen_k, args.causal)
        visits = compact.num_visits(args.seqlen_q, seqlen_k, args.block_m, args.block_n, args.heads, args.causal,
                                    args.window)
    except (ValueError, TypeError) as exc:
        return _error(exc)
    kw = dict(seqlen_q=args.seqlen_q, seqlen_k=seqlen_k, block_m=args.block_m, block_n=args.block_n, heads=args.heads,
              causal=args.causal, num_sms=args.num_sms, c=args.c, r=args.r, model=args.model,
              group_size=args.group_size, window=args.window)
    if args.compact or visits > CLI_MAX_SIMULATED_VISITS:
        if args.plot is not None:
            return _error(f"--plot needs the per-visit simulation (problems up to {CLI_MAX_SIMULATED_VISITS} "
                          f"visits, without --compact)")
        reason = "--compact" if args.compact else f"{visits} visits per table > {CLI_MAX_SIMULATED_VISITS}"
        try:
            rows = analyse_compact(**kw)
        except (ValueError, TypeError) as exc:
            return _error(exc)
        print_compact(rows, c=args.c, r=args.r, model=args.model, reason=reason)
        return 0
    try:
        rows = analyse(**kw)
        auto = auto_line(rows[0]["plan"])      # in the try, as the analysis: auto's choice can raise too
    except (ValueError, TypeError) as exc:
        return _error(exc)
    print_analysis(rows, c=args.c, r=args.r, model=args.model, auto=auto)
    if args.plot is not None:
        try:
            plot_gantt(rows, args.plot, c=args.c, r=args.r)
        except OSError as exc:                   # e.g. the disk filled up since the check
            return _error(f"--plot {args.plot}: cannot write it: {exc.strerror or exc}", 1)
        print(f"wrote {args.plot}")
    return 0
