#!/usr/bin/env python
"""Benchmarks of cupy_dash against torch SDPA (FlashAttention-2 backend), in one process and one GPU run.

    python benchmarks/bench.py --quick            # about 2 minutes
    python benchmarks/bench.py                     # every seqlen, head dim 64 and 128, both masks
    python benchmarks/bench.py --seqlens 2048 8192 --hdims 128 --masks causal --no-torch

Writes benchmarks/results/bench_<time>.json, .md and .png (or the path given with --out) and prints the table.
The modules beside it: bench_peers.py (torch SDPA, FlashAttention-3), bench_host.py (host overhead, compile
time), bench_report.py (Markdown and PNG; the PNG needs matplotlib: ``pip install matplotlib``).

Conventions (DESIGN.md, "Measuring"; the FA3 paper's):

* FLOPs: forward ``4 * B * H * Sq * Sk * D`` (halved for causal), backward 2.5x the forward.
* Shapes: ``tokens = B * S = 16384`` and ``hidden = H * D = 2048``; S in 512 ... 16384; head dim 64 and 128;
  full and causal; bf16. Every tensor of every shape has the same number of elements, so one pool of random
  buffers serves every configuration (reshaped per shape).
* Timing: CUDA events around each call on the stream the call runs on, after warm-up (``warmup`` calls, then more
  until ``warmup_s`` seconds have passed, 0.5 by default: the H200 lowers its SM clock at its power limit
  within ~0.1 s of load, and the calls timed before that ran ~12 % faster at 15k tokens); the median over
  ``repeats`` (>= 20) calls; the calls rotate over ``input_sets`` (>= 2) independent input sets, each larger than
  the L2 cache (optionally, ``flush_l2`` also writes a 256 MiB buffer before every timed call).
* Backward timing is the backward call alone: q, k, v, dO, out and lse are computed beforehand; for torch the
  graph is built once per input set and ``torch.autograd.grad(..., retain_graph=True)`` is timed.
* Torch SDPA is measured under ``sdpa_kernel(SDPBackend.FLASH_ATTENTION)`` with layout (B, H, S, D) (a
  transposed view of the same (B, S, H, D) buffers), its backward both with ``torch.use_deterministic_algorithms
  (True)`` (FA2's deterministic backward) and without.

Also measured: host overhead per call (a tiny shape, 1000 back-to-back calls, one synchronization at the end)
and compile time (a cold process with empty caches, then a warm process with the disk cache filled), both in
subprocesses so in-process memoization cannot hide anything.

Run ``python benchmarks/bench.py --help``.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import shlex
import statistics
import sys
import time

from cupy_dash.cli.measure import ATOMIC, SCHEDULES, attention_flops, random_tensor
from cupy_dash.cuda import kernels

# the modules beside this script (its folder is first on sys.path when it runs as `python benchmarks/bench.py`)
from bench_host import measure_compile_times, measure_host_overhead
from bench_peers import Fa3Peer, fa3_subprocess, load_peers, same_bits
from bench_report import _label, markdown_report, plot_report
from measure import CupyEvents, commit, time_calls

__all__ = ["main", "run", "parse_args", "DEFAULT_SEQLENS"]

TOKENS = 16384
HIDDEN = 2048
DEFAULT_SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
DEFAULT_HDIMS = (64, 128)
DEFAULT_MASKS = ("full", "causal")
DEFAULT_REPEATS = 30
QUICK = dict(seqlens=(1024, 4096), hdims=(128,), masks=("full", "causal"), repeats=20, warmup=3,
             overhead_calls=1000)
FLUSH_BYTES = 256 << 20
PROG = "python benchmarks/bench.py"


def _log(msg):
    print(msg, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------------------------
# timing
# ----------------------------------------------------------------------------------------------------------------
def _summary(times_ms, flops):
    med = statistics.median(times_ms)
    q = sorted(times_ms)
    return dict(median_ms=med, min_ms=q[0], max_ms=q[-1], p20_ms=q[int(0.2 * (len(q) - 1))],
                p80_ms=q[int(0.8 * (len(q) - 1))], n=len(q), tflops=flops / (med * 1e-3) / 1e12)


# ----------------------------------------------------------------------------------------------------------------
# one configuration
# ----------------------------------------------------------------------------------------------------------------
def _measure(results, key, fn):
    """Run ``fn() -> summary dict`` and store it (or the error) under ``key``."""
    try:
        results[key] = fn()
        _log(f"    {_label(key):34s} {results[key]['median_ms']:9.3f} ms  {results[key]['tflops']:7.1f} TFLOP/s")
    except Exception as exc:  # a failing variant must not stop the benchmark
        results[key] = dict(error=f"{type(exc).__name__}: {exc}")
        _log(f"    {_label(key):34s} FAILED: {results[key]['error']}")


class _ForwardOnly(Exception):
    """--fwd-only: no forward outputs are kept for a backward."""


def bench_config(cfg, buffers, opts, peers=(), fa3=False):
    """Measure one (hdim, mask, seqlen) configuration; ``buffers`` is a list of input sets, each a dict of flat
    CuPy arrays q, k, v, do of ``tokens * hidden`` elements; ``peers`` from :func:`bench_peers.load_peers`;
    ``fa3``: also measure FlashAttention-3 (head dim 128) in a subprocess on the same seeded inputs."""
    import cupy
    import cupy_dash

    B, S, H, D, causal = cfg["batch"], cfg["seqlen"], cfg["heads"], cfg["hdim"], cfg["causal"]
    Hkv, Dv = cfg.get("heads_kv", H), cfg.get("hdim_v") or cfg["hdim"]
    cap = dict(softcap=opts["softcap"]) if opts.get("softcap") else {}
    shapes = dict(q=(B, S, H, D), k=(B, S, Hkv, D), v=(B, S, Hkv, Dv), do=(B, S, H, Dv))
    sets = [{n: buf[n][:math.prod(shape)].reshape(shape) for n, shape in shapes.items()} for buf in buffers]
    f_fwd = attention_flops(B, H, S, S, D, causal, "fwd", Dv)
    f_bwd = attention_flops(B, H, S, S, D, causal, "bwd", Dv)
    results = {}
    ev = CupyEvents()
    flush = None
    if opts["flush_l2"]:
        scratch = cupy.empty(FLUSH_BYTES, dtype=cupy.uint8)

        def flush():
            scratch.fill(1)
    timing = dict(warmup=opts["warmup"], repeats=opts["repeats"], warmup_s=opts.get("warmup_s", 0.0))

    def measure(key, fn):
        _measure(results, key, fn)

    def fwd():
        calls = [lambda s=s: cupy_dash.attention_forward(s["q"], s["k"], s["v"], causal=causal, **cap) for s in sets]
        return _summary(time_calls(calls, events=ev, flush=flush, **timing), f_fwd)

    measure("dash_fwd", fwd)
    fwd_only = opts.get("fwd_only", False)
    try:
        if fwd_only:
            raise _ForwardOnly()
        for s in sets:
            s["out"], s["lse"] = cupy_dash.attention_forward(s["q"], s["k"], s["v"], causal=causal, **cap)
        cupy.cuda.get_current_stream().synchronize()
        have_fwd = True
    except _ForwardOnly:
        have_fwd = False
    except Exception as exc:
        have_fwd = False
        _log(f"    forward failed, skipping the cupy_dash backward: {exc}")

    for sched in () if fwd_only else opts["schedules"]:
        key = f"dash_bwd_{sched}"
        if not have_fwd:
            results[key] = dict(error="forward failed")
            continue
        kw = dict(schedule="auto", deterministic=False) if sched == ATOMIC else dict(schedule=sched,
                                                                                     deterministic=True)

        def bwd(kw=kw):
            calls = [lambda s=s: cupy_dash.attention_backward(s["do"], s["q"], s["k"], s["v"], s["out"], s["lse"],
                                                              causal=causal, **cap, **kw) for s in sets]
            t = time_calls(calls, events=ev, flush=flush, **timing)
            res = _summary(t, f_bwd)
            if kw["deterministic"]:
                res["repeats_bits"] = same_bits(calls[0](), calls[0]())
            cupy_dash.check_errors()
            return res

        measure(key, bwd)

    flops = dict(fwd=f_fwd, bwd=f_bwd)
    if Hkv != H or cap or Dv != D:  # the peers here take H == Hkv, no logit cap and one head dim: cupy_dash alone
        peers, fa3 = (), False
    for peer in peers:
        peer.measure(sets, causal, flops, measure, time_calls, _summary, flush, timing, fwd_only=fwd_only)
    if fa3 and D in Fa3Peer.HEAD_DIMS:
        for key, res in fa3_subprocess(cfg, opts).items():
            results[key] = res
            _log(f"    {_label(key):34s} " + (f"{res['median_ms']:9.3f} ms  {res['tflops']:7.1f} TFLOP/s"
                                               if "error" not in res else f"FAILED: {res['error']}"))
    for s in sets:
        s.pop("out", None)
        s.pop("lse", None)
    return dict(cfg, flops_fwd=f_fwd, flops_bwd=f_bwd, results=results)


def _output_paths(out, stamp):
    if out.endswith(".json") or out.endswith(".md"):
        base = out.rsplit(".", 1)[0]
    else:
        base = os.path.join(out, f"bench_{stamp}")
    d = os.path.dirname(base)
    if d:
        os.makedirs(d, exist_ok=True)
    return base + ".json", base + ".md"


def knobs_set() -> dict:
    """The CUPY_DASH_* settings of this process that change what runs ({name: value}): a report measured with
    any of them is an experiment (benchmarks/performance_page.py lists it apart)."""
    from cupy_dash import config
    return {k.name: os.environ[k.name] for k in config.KNOBS
            if k.name.startswith("CUPY_DASH_") and k.name not in EXPERIMENT_NEUTRAL and os.environ.get(k.name)}


# Knobs that do not change what runs (where kernels are cached, what is printed).
EXPERIMENT_NEUTRAL = ("CUPY_DASH_CACHE_DIR", "CUPY_DASH_JIT_VERBOSE")


def _kernels_digest():
    """sha256 of the kernel sources this process compiles (with_kernels.py's directory when it runs under it):
    names the kernels measured even where the device's git checkout does not match its files."""
    from cupy_dash.cuda import jit
    return jit.source_tree_digest(jit.kernel_dir())


def _meta(opts, argv):
    import cupy
    import cupy_dash
    meta = dict(date=_dt.datetime.now().isoformat(timespec="seconds"),
                command=" ".join([opts.get("prog") or PROG] + [shlex.quote(a) for a in argv]),
                dtype=opts["dtype"], tokens=opts["tokens"], hidden=opts["hidden"], repeats=opts["repeats"],
                warmup=opts["warmup"], warmup_s=opts.get("warmup_s", 0.0), input_sets=opts["input_sets"],
                flush_l2=opts["flush_l2"], group=opts["group"], softcap=opts.get("softcap", 0.0),
                quick=opts["quick"], python=platform.python_version(), cupy=cupy.__version__,
                cupy_dash=getattr(cupy_dash, "__version__", "?"), torch=None, env=knobs_set(),
                commit=commit(), kernels_sha256=_kernels_digest())
    try:
        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
        name = props["name"]
        meta.update(gpu=name.decode() if isinstance(name, bytes) else str(name),
                    sms=int(props["multiProcessorCount"]), l2_bytes=int(props.get("l2CacheSize", 0)),
                    compute_capability=cupy.cuda.Device().compute_capability,
                    driver=cupy.cuda.runtime.driverGetVersion(), cuda_runtime=cupy.cuda.runtime.runtimeGetVersion())
    except Exception as exc:
        meta["gpu_error"] = repr(exc)
    return meta


# ----------------------------------------------------------------------------------------------------------------
# command line
# ----------------------------------------------------------------------------------------------------------------
def _int_list(values):
    out = []
    for v in values:
        out += [int(x) for x in str(v).replace(",", " ").split()]
    return tuple(out)


def _str_list(values):
    out = []
    for v in values:
        out += [x for x in str(v).replace(",", " ").split()]
    return tuple(out)


def build_parser(prog=None):
    p = argparse.ArgumentParser(
        prog=prog, description="Benchmark cupy_dash attention (forward, backward per schedule, atomic backward) "
        "against torch SDPA's FlashAttention-2 backend and FlashAttention-3 (flash-attn3-jax, when importable). "
        "16k tokens per batch, H*D = 2048, bf16.")
    p.add_argument("--seqlens", nargs="+", default=None, help=f"sequence lengths (default {DEFAULT_SEQLENS})")
    p.add_argument("--hdims", nargs="+", default=None, help="head dims (default 64 128)")
    p.add_argument("--hdim-v", type=int, default=None,
                   help="v's head dim where it differs from --hdims' (kernels.VALUE_HEAD_DIMS: 128 with 192)")
    p.add_argument("--masks", nargs="+", default=None, help="full and/or causal (default both)")
    p.add_argument("--schedules", nargs="+", default=None,
                   help=f"backward schedules; '{ATOMIC}' = deterministic=False (default: all of "
                   f"{', '.join(SCHEDULES)}, {ATOMIC})")
    p.add_argument("--repeats", type=int, default=None, help=f"timed calls per measurement (default "
                   f"{DEFAULT_REPEATS}; the median is reported)")
    p.add_argument("--warmup", type=int, default=None, help="untimed calls before timing (default 5)")
    p.add_argument("--warmup-s", type=float, default=0.5,
                   help="then more untimed calls until this many seconds have passed (default 0.5: a steady clock)")
    p.add_argument("--input-sets", type=int, default=2, help="input sets rotated between calls (default 2)")
    p.add_argument("--flush-l2", action="store_true", help="also write a 256 MiB buffer before every timed call")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    p.add_argument("--tokens", type=int, default=None,
                   help="B*S (default: 16384, or the largest multiple of every --seqlens below it, e.g. 15360 for "
                   "1280 3840 15360)")
    p.add_argument("--hidden", type=int, default=HIDDEN, help="H*D (default 2048)")
    p.add_argument("--quick", action="store_true",
                   help="about 2 minutes: S in {1024, 4096}, head dim 128, both masks, 20 repeats")
    p.add_argument("--fwd-only", action="store_true", help="forward passes only (ours, torch, FA3)")
    p.add_argument("--pending-head-dims", action="store_true",
                   help="also run the backward head dims built but not yet shipped (kernels.BWD_PENDING_HEAD_DIMS)")
    p.add_argument("--group", type=int, default=1,
                   help="query heads per KV head (GQA; default 1). With a group > 1 the peers are skipped")
    p.add_argument("--softcap", type=float, default=0.0,
                   help="logit soft-capping of cupy_dash's calls (default 0: none); peers are skipped with a cap")
    p.add_argument("--no-torch", action="store_true", help="skip torch SDPA")
    p.add_argument("--no-fa3", action="store_true", help="skip FlashAttention-3 (flash-attn3-jax)")
    p.add_argument("--no-overhead", action="store_true", help="skip the host-overhead measurement")
    p.add_argument("--overhead-calls", type=int, default=None, help="calls for the host overhead (default 1000)")
    p.add_argument("--no-compile", action="store_true", help="skip the cold/warm compile-time subprocesses")
    p.add_argument("--out", default=os.path.join("benchmarks", "results"),
                   help="output directory (bench_<time>.json/.md inside) or a .json/.md file path "
                   "(default benchmarks/results/)")
    return p


def default_tokens(seqlens) -> int:
    """TOKENS, or the largest multiple of every sequence length not above it (at least the least common multiple,
    so that every length divides the batch): 15360 for 1280 / 3840 / 15360."""
    lcm = math.lcm(*seqlens)
    return TOKENS if TOKENS % lcm == 0 else max(lcm, TOKENS // lcm * lcm)


def parse_args(argv=None, prog=None):
    args = build_parser(prog).parse_args(argv)
    q = QUICK if args.quick else {}
    opts = dict(
        seqlens=_int_list(args.seqlens) if args.seqlens else q.get("seqlens", DEFAULT_SEQLENS),
        hdims=_int_list(args.hdims) if args.hdims else q.get("hdims", DEFAULT_HDIMS),
        masks=_str_list(args.masks) if args.masks else q.get("masks", DEFAULT_MASKS),
        schedules=_str_list(args.schedules) if args.schedules else SCHEDULES + (ATOMIC,),
        repeats=args.repeats if args.repeats is not None else q.get("repeats", DEFAULT_REPEATS),
        warmup=args.warmup if args.warmup is not None else q.get("warmup", 5), warmup_s=args.warmup_s,
        overhead_calls=args.overhead_calls if args.overhead_calls is not None else q.get("overhead_calls", 1000),
        input_sets=max(1, args.input_sets), flush_l2=args.flush_l2, dtype=args.dtype, tokens=args.tokens,
        hidden=args.hidden, quick=args.quick, torch=not args.no_torch, fa3=not args.no_fa3,
        overhead=not args.no_overhead, fwd_only=args.fwd_only, group=args.group, softcap=args.softcap,
        compile=not args.no_compile, out=args.out, prog=prog, pending_head_dims=args.pending_head_dims,
        hdim_v=args.hdim_v)
    for m in opts["masks"]:
        if m not in ("full", "causal"):
            raise SystemExit(f"--masks: expected full and/or causal, got {m!r}")
    for s in opts["schedules"]:
        if s not in SCHEDULES + (ATOMIC,):
            raise SystemExit(f"--schedules: unknown schedule {s!r} (known: {', '.join(SCHEDULES + (ATOMIC,))})")
    if opts["repeats"] < 1:
        raise SystemExit("--repeats must be >= 1")
    if opts["repeats"] < 20:
        _log(f"note: --repeats {opts['repeats']} is below the 20 the measuring rules ask for")
    if opts["tokens"] is None:
        opts["tokens"] = default_tokens(opts["seqlens"])
        if opts["tokens"] != TOKENS:
            _log(f"note: {opts['tokens']} tokens per batch, the largest multiple of every --seqlens up to {TOKENS}")
    for s in opts["seqlens"]:
        if opts["tokens"] % s:
            raise SystemExit(f"--seqlens: {s} does not divide the {opts['tokens']} tokens per batch")
    for d in opts["hdims"]:
        if opts["hdim_v"] is not None and opts["hdim_v"] not in kernels.value_head_dims(d):
            raise SystemExit(f"--hdim-v: {opts['hdim_v']} is not a value head dim of head dim {d} "
                             f"(kernels.VALUE_HEAD_DIMS: {kernels.VALUE_HEAD_DIMS})")
        if opts["hidden"] % d:
            raise SystemExit(f"--hdims: {d} does not divide the hidden size {opts['hidden']}")
        if opts["group"] < 1 or (opts["hidden"] // d) % opts["group"]:
            raise SystemExit(f"--group: {opts['group']} must be >= 1 and divide the {opts['hidden'] // d} heads "
                             f"of head dim {d}")
    return opts


def run(opts, argv=(), checkpoint=None):
    """Run the benchmark described by ``opts`` (from :func:`parse_args`); return the report dict."""
    import cupy

    if opts.get("pending_head_dims"):
        kernels.BWD_HEAD_DIMS = kernels.BWD_BUILT_HEAD_DIMS
    peers, missing, fa3 = load_peers(opts["torch"], opts["fa3"], _log)
    torch_mod = next((p.torch for p in peers if p.name == "torch"), None)
    meta = _meta(opts, argv)
    meta["peers"] = {p.name: p.version for p in peers}
    if fa3:
        meta["peers"]["fa3"] = "flash-attn3-jax (subprocess per configuration)"
    meta["missing_peers"] = missing
    if torch_mod is not None:
        meta["torch"] = torch_mod.__version__
    report = dict(meta=meta, configs=[])
    _log(f"cupy_dash bench on {meta.get('gpu', '?')}: seqlens {opts['seqlens']}, hdims {opts['hdims']}, "
         f"masks {opts['masks']}, schedules {opts['schedules']}, {opts['repeats']} repeats")

    n = opts["tokens"] * opts["hidden"]
    buffers = [{name: random_tensor((n,), opts["dtype"], seed=10 * i + j)
                for j, name in enumerate(("q", "k", "v", "do"))} for i in range(opts["input_sets"])]
    cupy.cuda.get_current_stream().synchronize()
    for hdim in opts["hdims"]:
        for mask in opts["masks"]:
            for S in opts["seqlens"]:
                cfg = dict(hdim=hdim, causal=mask == "causal", seqlen=S, batch=opts["tokens"] // S,
                           heads=opts["hidden"] // hdim)
                if opts.get("hdim_v") not in (None, hdim):
                    cfg["hdim_v"] = opts["hdim_v"]
                cfg["heads_kv"] = cfg["heads"] // opts.get("group", 1)
                _log(f"  d{hdim} {mask} S={S} B={cfg['batch']} H={cfg['heads']} Hkv={cfg['heads_kv']}")
                report["configs"].append(bench_config(cfg, buffers, opts, peers, fa3))
                cupy.get_default_memory_pool().free_all_blocks()
                if checkpoint is not None:
                    checkpoint(report)
    del buffers
    cupy.get_default_memory_pool().free_all_blocks()

    if opts["overhead"]:
        _log("  host overhead per call")
        try:
            report["host_overhead"] = measure_host_overhead(opts["overhead_calls"], dtype=opts["dtype"],
                                                            torch_mod=torch_mod)
        except Exception as exc:
            report["host_overhead"] = dict(error=f"{type(exc).__name__}: {exc}")
    if opts["compile"]:
        _log("  compile time (subprocesses)")
        report["compile"] = measure_compile_times(hdim=max(opts["hdims"]), causal=True, dtype=opts["dtype"])
    return report


def main(argv=None, prog=PROG):
    argv = list(sys.argv[1:] if argv is None else argv)
    opts = parse_args(argv, prog=prog)
    try:
        import cupy
        if not cupy.cuda.is_available():
            print("No CUDA GPU found: nothing to benchmark.", file=sys.stderr)
            return 1
        cc = cupy.cuda.Device().compute_capability
    except Exception as exc:
        print(f"No usable CUDA GPU ({exc}): nothing to benchmark.", file=sys.stderr)
        return 1
    if cc != "90":
        print(f"cupy_dash needs a Hopper GPU (sm_90); this one is sm_{cc}.", file=sys.stderr)
        return 1
    t0 = time.perf_counter()
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    json_path, md_path = _output_paths(opts["out"], stamp)

    def checkpoint(partial):
        """The report so far, marked partial: a run killed by an outer timeout keeps its finished configs."""
        with open(json_path, "w") as f:
            json.dump(dict(partial, meta=dict(partial["meta"], partial=True)), f, indent=1)

    report = run(opts, argv, checkpoint)
    report["meta"]["wall_s"] = time.perf_counter() - t0
    md = markdown_report(report)
    print(md)
    with open(json_path, "w") as f:
        json.dump(report, f, indent=1)
    with open(md_path, "w") as f:
        f.write(md + "\n")
    png_path = md_path[:-3] + ".png"
    try:
        plot_report(report, png_path)
    except Exception as exc:  # the plot must not lose the measurements
        _log(f"plot failed: {type(exc).__name__}: {exc}")
        png_path = "(no plot)"
    _log(f"wrote {json_path}, {md_path} and {png_path} ({report['meta']['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
