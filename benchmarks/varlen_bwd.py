"""Varlen backward on the H200: throughput of cupy_dash.attention_backward_varlen on packed batches of 16k tokens
(16 heads of 128, fp16) in 1 to 64 sequences, against the fixed-length backward of the same tokens where the
lengths are equal, and the host time of one call with device cu_seqlens (a device-to-host copy and a wait) and
with host cu_seqlens (no wait). TFLOP/s with FA3's convention per sequence (bwd = 2.5 x 4 Sq Sk H D, x 1/2
causal), CUDA events, median of --repeats after 3 warm-up calls. Each call is timed alone (the varlen side's
host work after its `cu_seqlens` read-back inside: the GPU idles then) and queued, ten calls with host
`cu_seqlens` back to back between the events (the kernels' time where the host keeps up).

    python benchmarks/varlen_bwd.py [--repeats 20] [--json out.json] [--profile] [--kinds equal] [--seqs 4 16]
                                    [--schedules auto]

``--json``: {"meta": date, command, GPU, kernels' digest; "rows": one per line printed}.
``--profile``: instead, a cProfile of 200 host-cu_seqlens calls at 64 equal sequences (where the call's host
time shows most), the 25 functions with the most cumulative time.
"""
from __future__ import annotations

import argparse
import cProfile
import datetime
import io
import json
import pstats
import shlex
import statistics
import sys
import time

import cupy
import numpy as np

import cupy_dash

TOKENS, H, D = 16384, 16, 128


def _median_ms(fn, repeats, calls=1):
    """GPU time per call, median of `repeats` after 3 warm-up calls, with `calls` calls back to back between the
    events: one call alone (the GPU idles while the host prepares it), or queued (calls > 1: the host's work for a
    call overlaps the GPU's for the one before, so this is the kernels' time where the host keeps up)."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        a, b = cupy.cuda.Event(), cupy.cuda.Event()
        a.record()
        for _ in range(calls):
            fn()
        b.record()
        b.synchronize()
        times.append(cupy.cuda.get_elapsed_time(a, b) / calls)
    return statistics.median(times)


def _host_us(fn, calls=100):
    fn()
    cupy.cuda.Device().synchronize()
    times = []
    for i in range(calls):
        if i % 20 == 0:
            cupy.cuda.Device().synchronize()
        t0 = time.perf_counter_ns()
        fn()
        times.append((time.perf_counter_ns() - t0) / 1e3)
    cupy.cuda.Device().synchronize()
    return statistics.median(times)


def _flops(lengths, causal):
    return sum(2.5 * 4 * s * s * H * D * (0.5 if causal else 1.0) for s in lengths)


def _lengths(kind, n, rng):
    if kind == "equal":
        return [TOKENS // n] * n
    cuts = np.sort(rng.choice(np.arange(1, TOKENS), size=n - 1, replace=False))
    return [int(x) for x in np.diff(np.concatenate([[0], cuts, [TOKENS]]))]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--json")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--kinds", nargs="+", default=["equal", "random"], choices=["equal", "random"])
    ap.add_argument("--seqs", nargs="+", type=int, default=[1, 4, 16, 64])
    ap.add_argument("--schedules", nargs="+", default=["auto", "descending"])
    args = ap.parse_args(argv)
    if args.profile:
        return _profile()
    rng = np.random.default_rng(0)
    rows = []
    gpu = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    print(f"varlen backward, {TOKENS} tokens, H={H}, D={D}, fp16 ({gpu})")
    print(f"{'lengths':8s} {'seqs':>4s} {'mask':6s} {'schedule':16s} {'varlen ms':>9s} {'TFLOP/s':>8s} "
          f"{'fixed ms':>8s} {'TFLOP/s':>8s} {'queued varlen / fixed ms':>24s} {'host us dev-cu':>14s} "
          f"{'host us host-cu':>15s}")
    for kind in args.kinds:
        for n in args.seqs:
            lengths = _lengths(kind, n, rng)
            cu_h = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
            cu = cupy.asarray(cu_h)
            q, k, v, do = (cupy.random.standard_normal((TOKENS, H, D), dtype=cupy.float32).astype(cupy.float16)
                           for _ in range(4))
            for causal in (False, True):
                out, lse = cupy_dash.attention_forward_varlen(q, k, v, cu, cu, max(lengths), max(lengths),
                                                              causal=causal)
                for schedule in args.schedules:
                    def bwd(cu_q=cu, cu_k=cu):
                        return cupy_dash.attention_backward_varlen(do, q, k, v, out, lse, cu_q, cu_k, max(lengths),
                                                                   max(lengths), causal=causal, schedule=schedule)
                    ms = _median_ms(bwd, args.repeats)
                    host_dev = _host_us(bwd)
                    host_host = _host_us(lambda: bwd(cu_h, cu_h))
                    queued = _median_ms(lambda: bwd(cu_h, cu_h), args.repeats, calls=10)
                    fixed_ms = fixed_queued = float("nan")
                    if kind == "equal":
                        S = lengths[0]
                        shp = (n, S, H, D)
                        q4, k4, v4, do4, o4 = (x.reshape(shp) for x in (q, k, v, do, out))
                        lse4 = cupy.ascontiguousarray(lse.reshape(H, n, S).transpose(1, 0, 2))
                        def fixed():
                            return cupy_dash.attention_backward(do4, q4, k4, v4, o4, lse4, causal=causal,
                                                                schedule=schedule)
                        fixed_ms = _median_ms(fixed, args.repeats)
                        fixed_queued = _median_ms(fixed, args.repeats, calls=10)
                    f = _flops(lengths, causal)
                    row = dict(kind=kind, seqs=n, causal=causal, schedule=schedule, ms=ms, tflops=f / ms / 1e9,
                               fixed_ms=fixed_ms, fixed_tflops=f / fixed_ms / 1e9, queued_ms=queued,
                               fixed_queued_ms=fixed_queued, host_us_device_cu=host_dev,
                               host_us_host_cu=host_host, lengths=lengths)
                    rows.append(row)
                    print(f"{kind:8s} {n:4d} {'causal' if causal else 'full':6s} {schedule:16s} {ms:9.3f} "
                          f"{row['tflops']:8.1f} {fixed_ms:8.3f} {row['fixed_tflops']:8.1f} "
                          f"{queued:11.3f} / {fixed_queued:10.3f} {host_dev:14.1f} "
                          f"{host_host:15.1f}", flush=True)
    cupy_dash.check_errors()
    if args.json:
        from cupy_dash.cuda import jit
        meta = dict(date=datetime.datetime.now().isoformat(timespec="seconds"),
                    command=" ".join(["python benchmarks/varlen_bwd.py"] + [shlex.quote(a) for a in sys.argv[1:]]),
                    gpu=gpu, kernels_sha256=jit.source_tree_digest(jit.kernel_dir()))
        with open(args.json, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)


def _profile():
    lengths = [TOKENS // 64] * 64
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    q, k, v, do = (cupy.random.standard_normal((TOKENS, H, D), dtype=cupy.float32).astype(cupy.float16)
                   for _ in range(4))
    out, lse = cupy_dash.attention_forward_varlen(q, k, v, cupy.asarray(cu), cupy.asarray(cu), lengths[0], lengths[0],
                                                  causal=True)

    def call():
        return cupy_dash.attention_backward_varlen(do, q, k, v, out, lse, cu, cu, lengths[0], lengths[0],
                                                   causal=True)
    for _ in range(5):
        call()
    cupy.cuda.Device().synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for i in range(200):
        call()
        if i % 20 == 19:
            cupy.cuda.Device().synchronize()
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(25)
    print(text.getvalue())


if __name__ == "__main__":
    main()
