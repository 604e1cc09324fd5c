"""The backward beside FlashAttention-3's at a steady clock: one process, the same inputs, interleaved loops.

bench.py times each implementation once, right after its own warm-up: on the H200 the SM clock then depends on
what ran just before (the power limit takes it from 1980 to ~1700-1850 MHz within ~0.1 s of load, and how far
depends on the kernel's power; timing_modes.py, docs/decisions/bwd-engine.md "The clock under load"). Here each
shape runs ``--rounds`` rounds; every round times each implementation for ``--loop-s`` seconds of back-to-back
calls (two in flight, so the queue never drains and host time is hidden), in an order rotated by one every round,
so that none always follows the same neighbour; ``--rounds`` is rounded up to a multiple of the number of
implementations (rotated_orders), so that each takes every place in the order equally often. Per loop: ms per
call (wall time between two completed calls), the SM clock and power (nvidia-smi, 20 ms samples over the loop) and
their product, Mcycles per call.

Implementations (backward): ``dash_det`` (cupy_dash deterministic, ``schedule="auto"``), ``dash_atomic``, and with the
flash-attn3-jax wheel importable ``fa3_nondet`` and ``fa3_det`` (bench_peers.Fa3Peer, on our forward's out / lse);
``--schedules a b`` adds deterministic legs ``dash_a``, ``dash_b`` with that schedule instead of ``auto``;
``--env-legs name:VAR=VALUE`` a deterministic ``auto`` leg ``dash_name`` whose calls run with the environment
variable VAR set to VALUE (a knob A/B in one process, e.g. ``w1:CUPY_DASH_BWD_DQ_WRITERS=1``).
Before timing, FA3's dq, dk, dv are compared with ours (max |diff| over max |ours| per tensor; a peer above
``--tolerance`` is marked invalid and left out of the ratios), and each deterministic implementation is run twice
on the same inputs and its bits compared. ``--forward``: the forwards instead (``dash_fwd``, ``fa3_fwd``, FA3's
public ``flash_mha``), outputs compared. ``--cudnn``: torch SDPA's cuDNN backend too (``cudnn_nondet``,
``cudnn_fwd``), the Hopper-native peer at head dims other than 128 (the FA3 wheel builds head dim 128 only).

    python benchmarks/steady_bench.py --shapes full:1280 full:3840 full:15360 causal:2048 causal:8192 \\
        causal:16384 --rounds 5 --loop-s 1 --json steady.json --md steady.md

Shapes ``mask:S`` (``--dtype``, bf16 by default; B = tokens // S with ``--tokens`` 15360 for full masks and 16384
for causal ones, as the engine issue's table; ``mask:S:tokens`` overrides), H = ``--hidden`` // ``--hdim``.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure  # noqa: E402  (beside this script)


def parse_shape(spec, hidden, hdim, group=1):
    mask, S, *rest = spec.split(":")
    S = int(S)
    tokens = int(rest[0]) if rest else (15360 if mask == "full" else 16384)
    heads = hidden // hdim
    if group < 1 or heads % group:
        raise ValueError(f"--group {group} must divide the {heads} query heads (--hidden {hidden} // --hdim {hdim})")
    return dict(name=spec, causal=mask == "causal", batch=tokens // S, seqlen=S, heads=heads, hdim=hdim,
                group=group)


def pipelined_loop(call, done, loop_s, warm_s=0.2):
    """Back-to-back calls for ``warm_s`` then ``loop_s`` seconds, at most two in flight: ``call()`` enqueues one
    and returns a handle, ``done(handle)`` waits for it. Returns (ms per call over the timed part, its calls,
    wall start, wall end) with the timed part between two completed calls."""
    handles = [call(), call()]
    t0 = time.perf_counter()
    start = None
    n = 0
    while True:
        done(handles.pop(0))
        now = time.perf_counter()
        if start is None and now - t0 >= warm_s:
            start, wall0 = now, _dt.datetime.now()
        elif start is not None:
            n += 1
            if now - start >= loop_s:
                done(handles.pop(0))
                return (now - start) / n * 1e3, n, wall0, _dt.datetime.now()
        handles.append(call())


class Smi:
    """nvidia-smi's SM clock, power and temperature, sampled every 20 ms in the background; each sample is parsed
    once, when a window first reads past it."""

    def __init__(self):
        self.trace = tempfile.NamedTemporaryFile("w+", suffix=".csv", delete=False)
        self.proc = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu",
                                      "--format=csv,noheader", "-lms", "20"], stdout=self.trace,
                                     stderr=subprocess.DEVNULL)
        self.samples, self._raw, self._pos = [], [], 0   # (datetime, MHz, W); raw lines; bytes read so far

    def _read(self):
        self.trace.flush()
        with open(self.trace.name) as f:
            f.seek(self._pos)
            text = f.read()
        complete = text[:text.rfind("\n") + 1]           # a line nvidia-smi is still writing waits for the next read
        self._pos += len(complete.encode())
        for line in complete.splitlines():
            self._raw.append(line)
            parts = [x.strip() for x in line.split(",")]
            try:
                when = _dt.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f")
                self.samples.append((when, float(parts[1].split()[0]), float(parts[2].split()[0])))
            except (ValueError, IndexError):
                continue

    def window(self, wall0, wall1):
        """(median MHz, median W, samples) between two datetimes."""
        self._read()
        inside = [(mhz, watt) for when, mhz, watt in self.samples if wall0 <= when <= wall1]
        med = statistics.median
        return (med([m for m, _ in inside]) if inside else None, med([w for _, w in inside]) if inside else None,
                len(inside))

    def lines(self):
        """Every line nvidia-smi wrote so far (timestamp, MHz, W, degrees C)."""
        self._read()
        return list(self._raw)

    def close(self):
        self.proc.terminate()
        self.proc.wait()


def implementations(shape, fa3, forward=False, schedules=(), env_legs=(), softcap=0.0, dtype="bf16",
                    cudnn=False):
    """{name: (call, done, result)} on one seeded input set; ``result()`` returns the outputs compared between
    implementations as CuPy arrays: (dq, dk, dv), or (out,) with ``forward``. ``env_legs``: (name, variable,
    value) of deterministic legs run with that variable set. ``softcap`` > 0: every cupy_dash leg caps its scores
    (out and lse of a capped forward), and ``dash_nocap`` is the deterministic ``auto`` call without the cap on the
    same q, k, v, do (its own uncapped out and lse): the cap's cost in the same process. ``cudnn``: torch SDPA's
    cuDNN backend beside them (``cudnn_nondet`` or ``cudnn_fwd``, :func:`cudnn_legs`). ``shape["group"]`` > 1
    (GQA): k and v have heads // group heads, and no peer runs."""
    import cupy

    import cupy_dash
    from cupy_dash.cli.measure import random_tensor
    B, S, H, D = shape["batch"], shape["seqlen"], shape["heads"], shape["hdim"]
    causal, group = shape["causal"], shape.get("group", 1)
    t = {n: random_tensor((B, S, H // group if n in ("k", "v") else H, D), dtype, seed=j)
         for j, n in enumerate(("q", "k", "v", "do"))}
    t["out"], t["lse"] = cupy_dash.attention_forward(t["q"], t["k"], t["v"], causal=causal, softcap=softcap)
    names = ("q", "k", "v") if forward else ("do", "q", "k", "v", "out", "lse")
    operands = tuple(t[n] for n in names)
    uncapped = operands
    if softcap and not forward:
        uncapped = operands[:4] + cupy_dash.attention_forward(t["q"], t["k"], t["v"], causal=causal)

    def ours(det, schedule="auto", env=None, cap=softcap):
        args = operands if cap else uncapped
        if forward:
            return (cupy_dash.attention_forward(*args, causal=causal, softcap=cap)[0],)
        with contextlib.nullcontext() if env is None else mock.patch.dict(os.environ, {env[0]: env[1]}):
            return cupy_dash.attention_backward(*args, causal=causal, schedule=schedule, deterministic=det,
                                                softcap=cap)

    def enqueue(det, schedule="auto", env=None, cap=softcap):
        ours(det, schedule, env, cap)
        ev = cupy.cuda.Event(disable_timing=True)
        ev.record()
        return ev
    kinds = ((True, "dash_fwd", "auto", None),) if forward else ((True, "dash_det", "auto", None),
                                                                  (False, "dash_atomic", "auto", None))
    kinds += tuple((True, f"dash_{name}", name, None) for name in schedules)
    kinds += tuple((True, f"dash_{name}", "auto", (var, value)) for name, var, value in env_legs)
    impls = {name: (lambda d=det, s=sched, e=env: enqueue(d, s, e), lambda ev: ev.synchronize(),
                    lambda d=det, s=sched, e=env: ours(d, s, e)) for det, name, sched, env in kinds}
    if softcap:
        impls["dash_nocap"] = (lambda: enqueue(True, cap=0.0), lambda ev: ev.synchronize(),
                               lambda: ours(True, cap=0.0))
    if fa3 is not None and group == 1:
        jax = fa3.jax
        cupy.cuda.Device().synchronize()
        jargs = tuple(jax.dlpack.from_dlpack(x) for x in operands)
        if forward:
            from flash_attn3_jax import flash_mha
            peers = (("fa3_fwd", jax.jit(lambda q, k, v: flash_mha(q, k, v, is_causal=causal))),)
        else:
            peers = (("fa3_nondet", fa3._bwd_fn(causal, False)), ("fa3_det", fa3._bwd_fn(causal, True)))
        for name, fn in peers:
            def result(fn=fn):
                res = jax.block_until_ready(fn(*jargs))
                return tuple(cupy.from_dlpack(x) for x in (res if isinstance(res, (tuple, list)) else (res,)))
            impls[name] = (lambda fn=fn: fn(*jargs), jax.block_until_ready, result)
    if cudnn and not softcap and group == 1:           # SDPA has no cap: beside uncapped calls only
        try:
            impls.update(cudnn_legs(t, causal, forward))
        except RuntimeError as exc:                    # e.g. no cuDNN kernel for this head dim
            print(f"cuDNN left out at {shape['name']}: {str(exc).splitlines()[0]}", file=sys.stderr)
    return impls


def cudnn_legs(t, causal, forward):
    """{name: (call, done, result)} of torch's scaled_dot_product_attention with the cuDNN backend on the tensors
    ``t`` (q, k, v, do: (B, S, H, D) CuPy arrays, viewed as (B, H, S, D) through DLPack, no copy): ``cudnn_fwd``, or
    ``cudnn_nondet``, the backward of one forward graph kept alive (``retain_graph``), so a call times the backward
    alone. cuDNN's backward is not deterministic (torch refuses it under ``use_deterministic_algorithms``). A
    Hopper-native yardstick at head dims FA3's wheel does not build (its kernels are head dim 128 only)."""
    import cupy
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    cupy.cuda.Device().synchronize()
    leaves = [torch.from_dlpack(t[n]).detach().requires_grad_(not forward) for n in ("q", "k", "v")]

    def sdpa():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in leaves), is_causal=causal)

    def enqueue(run):
        run()
        ev = torch.cuda.Event()
        ev.record()
        return ev

    def as_cupy(xs):
        torch.cuda.synchronize()
        return tuple(cupy.from_dlpack(x.detach()) for x in xs)
    if forward:
        def fwd():
            with torch.no_grad():
                return sdpa()
        as_cupy((fwd(),))                              # here, so that a shape cuDNN refuses raises at once
        return {"cudnn_fwd": (lambda: enqueue(fwd), lambda ev: ev.synchronize(),
                              lambda: as_cupy((fwd().transpose(1, 2),)))}
    out, do = sdpa(), torch.from_dlpack(t["do"]).transpose(1, 2)

    def grads():
        return torch.autograd.grad(out, leaves, do, retain_graph=True)
    as_cupy(grads())
    return {"cudnn_nondet": (lambda: enqueue(grads), lambda ev: ev.synchronize(), lambda: as_cupy(grads()))}


def agreement(ours, theirs):
    """max |theirs - ours| / max |ours| over dq, dk, dv (the worst of the three)."""
    import cupy
    worst = 0.0
    for a, b in zip(ours, theirs):
        a, b = a.astype(cupy.float32), b.astype(cupy.float32)
        worst = max(worst, float(cupy.abs(b - a).max()) / max(float(cupy.abs(a).max()), 1e-30))
    return worst


def rotated_orders(names: list, rounds: int) -> list:
    """The order of the legs ``names`` in each round: rotated by one every round, for ``rounds`` rounded up to a
    multiple of the number of legs, so that every leg runs in every place of the order equally often."""
    # NOTES: a loop's clock at the 700 W limit depends on what ran just before it, so one leg's readings differ by
    # place in the order: up to 5 % on an H100 (three rounds of two legs gave one of them the first place twice;
    # docs/decisions/softcap.md, "Every head dim, capped against uncapped").
    n = len(names)
    return [names[r % n:] + names[:r % n] for r in range(-(-rounds // n) * n)]


def rounds_run(report) -> int:
    """The rounds a report's loops ran (``--rounds`` rounded up by rotated_orders; older reports: meta's)."""
    shapes, meta = report["shapes"], report["meta"]
    return shapes[0].get("rounds", meta["rounds"]) if shapes else meta["rounds"]


def run_shape(shape, opts, fa3, smi):
    from bench_peers import same_bits
    from cupy_dash.cli.measure import attention_flops
    extra = () if opts.forward else (*opts.schedules, *(name for name, _, _ in opts.env_legs))
    extra += ("nocap",) if opts.softcap else ()
    impls = implementations(shape, fa3, opts.forward, () if opts.forward else opts.schedules,
                            () if opts.forward else opts.env_legs, opts.softcap, opts.dtype, opts.cudnn)
    ours = "dash_fwd" if opts.forward else "dash_det"
    if opts.impls:
        impls = {n: impls[n] for n in impls if n in opts.impls or n == ours or n in (f"dash_{x}" for x in extra)}
    flops = attention_flops(shape["batch"], shape["heads"], shape["seqlen"], shape["seqlen"], shape["hdim"],
                            shape["causal"], "fwd" if opts.forward else "bwd")
    ref = impls[ours][2]()                             # the reference every other result is compared with
    checks = {}
    for name, (_, _, result) in impls.items():
        first = result()
        entry = dict(rel_diff_vs_ours=agreement(ref, first))
        if name.endswith("det"):
            entry["repeats_bits"] = same_bits(first, result())
        entry["valid"] = entry["rel_diff_vs_ours"] <= opts.tolerance
        entry["valid"] = entry["valid"] or name == "dash_nocap"   # another function: its speed, not its values
        checks[name] = entry
    names = list(impls)
    loops = {n: [] for n in names}
    orders = rotated_orders(names, opts.rounds)
    for r, order in enumerate(orders):
        for name in order:
            call, done, _ = impls[name]
            ms, n, wall0, wall1 = pipelined_loop(call, done, opts.loop_s)
            mhz, watt, samples = smi.window(wall0, wall1)
            loops[name].append(dict(round=r, position=order.index(name), ms=ms, calls=n, sm_mhz=mhz, power_w=watt,
                                    smi_samples=samples, mcycles=ms * mhz / 1e3 if mhz else None))
    med = statistics.median
    summary = {}
    for name in names:
        ms = [x["ms"] for x in loops[name]]
        cyc = [x["mcycles"] for x in loops[name] if x["mcycles"] is not None]
        summary[name] = dict(ms_median=med(ms), ms_min=min(ms), ms_max=max(ms), tflops=flops / med(ms) / 1e9,
                             sm_mhz_median=med([x["sm_mhz"] for x in loops[name] if x["sm_mhz"]] or [0]),
                             power_w_median=med([x["power_w"] for x in loops[name] if x["power_w"]] or [0]),
                             mcycles_median=med(cyc) if cyc else None, **checks[name])
    ratios = {}
    for peer in ("fa3_fwd", "fa3_nondet", "fa3_det", "cudnn_fwd", "cudnn_nondet", "dash_atomic",
                 *(f"dash_{x}" for x in extra)):
        if peer in loops and checks[peer]["valid"]:
            per_round = [p["ms"] / d["ms"] for p, d in zip(loops[peer], loops[ours])]
            ratios[f"{ours}_speed_vs_{peer}"] = dict(median=med(per_round), min=min(per_round), max=max(per_round))
    return dict(shape=shape, flops=flops, rounds=len(orders), loops=loops, summary=summary, ratios=ratios)


RATIO_COLUMNS = (("dash_det_speed_vs_fa3_nondet", "ours det / FA3 non-det"), ("dash_det_speed_vs_fa3_det",
                 "ours det / FA3 det"), ("dash_det_speed_vs_dash_atomic", "ours det / ours atomic"),
                 ("dash_fwd_speed_vs_fa3_fwd", "our forward / FA3's"),
                 ("dash_det_speed_vs_cudnn_nondet", "ours det / cuDNN non-det"),
                 ("dash_fwd_speed_vs_cudnn_fwd", "our forward / cuDNN's"))


def markdown(report, title=True):
    """The report as Markdown: one row per shape and implementation, then the ratios that were measured."""
    meta = report["meta"]
    what = "Forward" if meta.get("forward") else "Backward"
    lines = [f"# {what} at a steady clock, interleaved loops ({meta['date']})", ""] if title else []
    lines += [f"Command: `{meta['command']}`", "",
              f"GPU {meta.get('gpu', '?')}; " + (f"{meta['dtype']}; " if "dtype" in meta else "") +
              (f"GQA group {meta['group']}; " if meta.get("group", 1) > 1 else "") +
              f"commit {meta['commit']}; kernels sha256 {meta['kernels_sha256'][:12]}. "
              f"TFLOP/s from the median ms per call of {rounds_run(report)} loops of {meta['loop_s']} s (order "
              "rotated every round); a ratio is the median over rounds of the other's ms over ours in the same "
              "round.", "",
              "| shape | impl | TFLOP/s | ms (min-max) | MHz | W | Mcycles | rel diff | bits repeat |",
              "|---|---|---|---|---|---|---|---|---|"]
    for s in report["shapes"]:
        for name, x in s["summary"].items():
            cyc = f"{x['mcycles_median']:.2f}" if x["mcycles_median"] else "-"
            valid = "" if x["valid"] else " (invalid)"
            lines.append(f"| {s['shape']['name']} | {name}{valid} | {x['tflops']:.0f} | {x['ms_median']:.3f} "
                         f"({x['ms_min']:.3f}-{x['ms_max']:.3f}) | {x['sm_mhz_median']:.0f} | "
                         f"{x['power_w_median']:.0f} | {cyc} | "
                         f"{x.get('rel_diff_vs_ours', x.get('rel_diff_vs_dash_det')):.1e} | "
                         f"{x.get('repeats_bits', '-')} |")
    extra = sorted({k for s in report["shapes"] for k in s["ratios"]} - {k for k, _ in RATIO_COLUMNS})
    columns = [(k, label) for k, label in RATIO_COLUMNS if any(k in s["ratios"] for s in report["shapes"])]
    columns += [(k, "capped / uncapped" if k.endswith("_vs_dash_nocap") else "auto / " + k.rsplit("_vs_dash_", 1)[1])
                for k in extra if "_vs_dash_" in k]
    if columns:
        lines += ["", "| shape | " + " | ".join(label for _, label in columns) + " |",
                  "|---|" + "---|" * len(columns)]
        for s in report["shapes"]:
            cells = []
            for key, _ in columns:
                r = s["ratios"].get(key)
                cells.append(f"{r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f})" if r else "-")
            lines.append(f"| {s['shape']['name']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


LABELS = {"dash_det": "cupy_dash deterministic", "dash_atomic": "cupy_dash atomic", "fa3_nondet":
          "FA3 non-deterministic", "fa3_det": "FA3 deterministic", "dash_fwd": "cupy_dash", "fa3_fwd": "FA3",
          "cudnn_nondet": "cuDNN non-deterministic (torch SDPA)", "cudnn_fwd": "cuDNN (torch SDPA)"}


def plot(report, path):
    """PNG: TFLOP/s per shape, one bar per implementation, each bar's whisker the range over the rounds."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    shapes = report["shapes"]
    names = list(shapes[0]["summary"])
    width = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(1.6 * len(shapes) + 2, 4.2))
    for i, name in enumerate(names):
        xs = [k + (i - (len(names) - 1) / 2) * width for k in range(len(shapes))]
        ys = [s["flops"] / s["summary"][name]["ms_median"] / 1e9 for s in shapes]
        lo = [y - s["flops"] / s["summary"][name]["ms_max"] / 1e9 for s, y in zip(shapes, ys)]
        hi = [s["flops"] / s["summary"][name]["ms_min"] / 1e9 - y for s, y in zip(shapes, ys)]
        ax.bar(xs, ys, width, yerr=[lo, hi], label=LABELS.get(name, name), capsize=2)
    ax.set_xticks(range(len(shapes)), [s["shape"]["name"].replace(":", " ") for s in shapes])
    what = "forward" if report["meta"].get("forward") else "backward"
    hdim = shapes[0]["shape"]["hdim"]
    ax.set_ylabel("TFLOP/s")
    group = f", GQA group {report['meta']['group']}" if report["meta"].get("group", 1) > 1 else ""
    ax.set_title(f"{what}, head dim {hdim}{group}, bf16, steady clock, interleaved "
                 f"({report['meta']['date'][:10]}, {report['meta']['gpu']})", fontsize=9)
    top = max(s["flops"] / min(x["ms_min"] for x in s["summary"].values()) / 1e9 for s in shapes)
    ax.set_ylim(0, top * 1.2)
    ax.legend(fontsize=8, ncol=len(names), loc="upper left")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _text(name):
    return name.decode() if isinstance(name, bytes) else str(name)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", nargs="+", default=["full:1280", "full:3840", "full:15360", "causal:2048",
                                                     "causal:8192", "causal:16384"])
    ap.add_argument("--hdim", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--group", type=int, default=1,
                    help="query heads per KV head (GQA: k, v get --hidden // --hdim // G heads; peers left out)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--loop-s", type=float, default=1.0)
    ap.add_argument("--tolerance", type=float, default=2e-2, help="max |FA3 - ours| / max |ours| (default 2e-2)")
    ap.add_argument("--no-fa3", action="store_true")
    ap.add_argument("--cudnn", action="store_true",
                    help="torch SDPA's cuDNN backend beside ours (cudnn_nondet / cudnn_fwd; any head dim it takes)")
    ap.add_argument("--forward", action="store_true", help="the forward (dash_fwd, fa3_fwd) instead")
    ap.add_argument("--impls", nargs="+", default=None,
                    help="a subset of dash_det dash_atomic fa3_nondet fa3_det cudnn_nondet, or with --forward "
                         "dash_fwd fa3_fwd cudnn_fwd (default: all available)")
    ap.add_argument("--schedules", nargs="+", default=[],
                    help="deterministic legs with these schedules (dash_<name>), each against dash_det (auto)")
    ap.add_argument("--env-legs", nargs="+", default=[], type=_env_leg, metavar="NAME:VAR=VALUE",
                    help="deterministic auto legs dash_NAME run with VAR=VALUE, each against dash_det")
    ap.add_argument("--softcap", type=float, default=0.0,
                    help="cap every cupy_dash leg's scores (FA3 left out) and add dash_nocap, the same call uncapped")
    ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16",
                    help="q, k, v, dO (default bf16; FA3 is left out with fp16)")
    ap.add_argument("--json", required=True, help="the report to write (with --replot: to read)")
    ap.add_argument("--md", default=None)
    ap.add_argument("--png", default=None, help="a bar chart of the report (needs matplotlib)")
    ap.add_argument("--replot", action="store_true", help="write --md / --png from an existing --json; no GPU")
    opts = ap.parse_args()
    if opts.replot:
        with open(opts.json) as f:
            report = json.load(f)
        _write_views(report, opts)
        return

    import cupy
    from bench import _kernels_digest
    fa3 = None
    try:                                               # checked before anything runs
        shapes = [parse_shape(spec, opts.hidden, opts.hdim, opts.group) for spec in opts.shapes]
    except ValueError as exc:
        ap.error(str(exc))
    if not opts.no_fa3 and not opts.softcap and opts.dtype == "bf16" and opts.group == 1:   # bf16, uncapped, MHA
        try:
            from bench_peers import Fa3Peer
            fa3 = Fa3Peer()
        except ImportError as exc:
            print(f"FA3 left out: {exc}", file=sys.stderr)
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    commit = measure.commit()
    report = dict(meta=dict(date=_dt.datetime.now().isoformat(timespec="seconds"),
                            command=" ".join(shlex.quote(a) for a in ["python", *sys.argv]), commit=commit,
                            kernels_sha256=_kernels_digest(), gpu=_text(props["name"]), rounds=opts.rounds,
                            loop_s=opts.loop_s, fa3=getattr(fa3, "version", None), forward=opts.forward,
                            softcap=opts.softcap, dtype=opts.dtype, group=opts.group),
                  shapes=[])
    smi = Smi()
    try:
        for shape in shapes:
            report["shapes"].append(run_shape(shape, opts, fa3, smi))
            s = report["shapes"][-1]
            print(shape["name"], {n: round(x["tflops"]) for n, x in s["summary"].items()},
                  {k: round(v["median"], 3) for k, v in s["ratios"].items()}, flush=True)
            with open(opts.json, "w") as f:
                json.dump(report, f, indent=1)
    finally:
        smi.close()
    _write_views(report, opts)


def _env_leg(text):
    """``name:VAR=VALUE`` -> (name, VAR, VALUE)."""
    name, sep, assignment = text.partition(":")
    var, eq, value = assignment.partition("=")
    if not (sep and eq and name and var):
        raise argparse.ArgumentTypeError(f"expected NAME:VAR=VALUE, got {text!r}")
    return name, var, value


def _write_views(report, opts):
    if opts.md:
        with open(opts.md, "w") as f:
            f.write(markdown(report))
    if opts.png:
        plot(report, opts.png)


if __name__ == "__main__":
    main()
