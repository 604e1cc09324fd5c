"""Varlen training steps with a new packing at every call, on the GPU: what a step pays for its schedule table.

16,384 tokens cut at random into B sequences (a new cut per call, seed 0), 16 heads of 128, fp16, causal,
host cu_seqlens. Per call: the host time of ``attention_backward_varlen`` (median, µs: validation, the table
built for the new lengths, its upload enqueued from pinned memory, three launches; the GPU is drained every 10
calls outside the timed region), the same with a repeated packing (cached table), the difference (what a new
packing costs the host), and the GPU time of the call (CUDA events, median, ms). Per-visit tables expanded on the
host (``CUPY_DASH_VARLEN_EXPAND=host``), compact records (``CUPY_DASH_COMPACT_TABLES=1``) and per-visit tables
expanded on the GPU from compact records (the default).

    python benchmarks/varlen_step.py [--calls 40] [--json out.json] [--profile B] [--torch] [--parts]

``--torch``: the tensors are torch tensors (the host fast path's new-packing plans, cupy_dash.core.fastpath_varlen,
serve the calls after the first); without it CuPy arrays, which take the full path every call.

Two more columns split a new packing's host cost: the median µs of the host build (``varlen_launch._tables``: the
schedule, its records packed for the upload) and of the upload (``varlen_device.device``: the copy enqueued,
for the GPU expansion also its kernel) of the new-packing calls.

``--parts``: also the median µs (and calls per new packing) of each step of a new packing (:func:`_fine_parts`),
timed by wrappers (which add ~0.3 µs each).

``--profile B``: instead, a cProfile of the new-packing calls at B sequences, per kind of table (top 25 by
cumulative time, then by own time).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import time

import cupy
import numpy as np

import cupy_dash

TOKENS, H, D = 16384, 16, 128


def _packing(rng, b):
    cuts = np.sort(rng.choice(np.arange(1, TOKENS), size=b - 1, replace=False)) if b > 1 else np.zeros(0, int)
    return np.concatenate([[0], cuts, [TOKENS]]).astype(np.int32)


def _fine_parts():
    """(module, attribute, label) of the steps of a new packing timed by ``--parts``."""
    import cupyx
    from cupy_dash.core import fastpath, fastpath_varlen, varlen_launch
    from cupy_dash.cuda import device_tables, executor, kernels, varlen_device
    return [(varlen_launch, "checked_cu_seqlens", "check lengths"), (varlen_device, "plan", "plan (host build)"),
            (kernels, "bwd_entry", "bwd_entry"), (device_tables, "_upload", "_upload"),
            (cupyx, "empty_pinned", "empty_pinned"), (cupy.cuda, "alloc", "cupy.cuda.alloc"),
            (executor, "patched_block", "patched_block"), (executor, "launch", "cuLaunchKernel (expand)"),
            (device_tables, "keep_alive", "keep_alive (tables)"), (device_tables, "_release_after", "release"),
            (device_tables, "_defer_release", "defer release"),
            (fastpath, "rebased_plan", "rebased_plan"), (fastpath_varlen, "_store", "store plan"),
            (fastpath, "run_backward", "run_backward"), (fastpath_varlen, "key", "signature")]


class _Parts:
    """Host ns of every call of the build (varlen_launch._tables) and of the upload (varlen_device.device), and with
    ``fine`` of each step of :func:`_fine_parts`, by wrapping them in their modules while the benchmark runs."""

    def __init__(self, fine=False):
        from cupy_dash.core import varlen_launch
        from cupy_dash.cuda import varlen_device
        self.times = {"build": [], "upload": []}
        self._undo = []
        self._wrap(varlen_launch, "_tables", "build")
        self._wrap(varlen_device, "device", "upload")
        for mod, name, label in _fine_parts() if fine else ():
            self.times[label] = []
            self._wrap(mod, name, label)

    def _wrap(self, mod, name, part):
        fn, times = getattr(mod, name), self.times[part]

        def timed(*a, **kw):
            t0 = time.perf_counter_ns()
            try:
                return fn(*a, **kw)
            finally:
                times.append(time.perf_counter_ns() - t0)
        setattr(mod, name, timed)
        self._undo.append((mod, name, fn))

    def medians(self):
        for mod, name, fn in reversed(self._undo):
            setattr(mod, name, fn)
        return {k: statistics.median(v) / 1e3 if v else float("nan") for k, v in self.times.items()}

    def counts(self):
        return {k: len(v) for k, v in self.times.items()}


def _run(q, k, v, do, steps):
    """``steps``: (cu_seqlens, out, lse) per call. Median host µs and GPU ms of the backward calls."""
    host, gpu = [], []
    for i, (cu, out, lse) in enumerate(steps):
        if i % 10 == 0:
            cupy.cuda.Device().synchronize()
        m = int(np.diff(cu).max())
        a, b = cupy.cuda.Event(), cupy.cuda.Event()
        a.record()
        t0 = time.perf_counter_ns()
        cupy_dash.attention_backward_varlen(do, q, k, v, out, lse, cu, cu, m, m, causal=True)
        host.append((time.perf_counter_ns() - t0) / 1e3)
        b.record()
        gpu.append((a, b))
    cupy.cuda.Device().synchronize()
    cupy_dash.check_errors()
    return statistics.median(host), statistics.median(cupy.cuda.get_elapsed_time(a, b) for a, b in gpu)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--json", default=None)
    ap.add_argument("--profile", type=int, default=None, metavar="B")
    ap.add_argument("--torch", action="store_true", help="torch tensors instead of CuPy arrays")
    ap.add_argument("--parts", action="store_true", help="also time each step of a new packing (median us, calls)")
    args = ap.parse_args(argv)
    if args.profile:
        args.batches = [args.profile]
    rng = np.random.default_rng(0)
    q, k, v, do = (cupy.asarray(rng.standard_normal((TOKENS, H, D), dtype=np.float32).astype(np.float16))
                   for _ in range(4))
    if args.torch:
        import torch
        q, k, v, do = (torch.from_dlpack(x) for x in (q, k, v, do))
    rows = []
    print(f"varlen steps, {TOKENS} tokens, H={H}, D={D}, fp16, causal, host cu_seqlens, {args.calls} calls, "
          f"{'torch' if args.torch else 'CuPy'} "
          f"({cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()})")
    print("tables     B  new packing host us  repeated host us  new - repeated us  GPU ms (new)  build us  upload us")
    modes = {"per-visit": {"CUPY_DASH_VARLEN_EXPAND": "host"}, "compact": {"CUPY_DASH_COMPACT_TABLES": "1"},
             "gpu-expand": {}}
    for kind, env in modes.items():
        for name in ("CUPY_DASH_COMPACT_TABLES", "CUPY_DASH_VARLEN_EXPAND"):
            os.environ.pop(name, None)
        os.environ.update(env)
        for b in args.batches:
            steps = []
            for cu in (_packing(rng, b) for _ in range(args.calls)):
                m = int(np.diff(cu).max())
                steps.append((cu, *cupy_dash.attention_forward_varlen(q, k, v, cupy.asarray(cu), cupy.asarray(cu),
                                                                      m, m, causal=True)))
            if args.profile:
                _run(q, k, v, do, steps[:5])                 # warm: kernels, pools
                prof = cProfile.Profile()
                prof.enable()
                _run(q, k, v, do, steps[5:])
                prof.disable()
                buf = io.StringIO()
                pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(25)
                pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
                print(f"--- cProfile, {len(steps) - 5} new packings, B={b}, {kind} ---\n{buf.getvalue()}")
                continue
            parts = _Parts(args.parts)
            fresh_host, fresh_gpu = _run(q, k, v, do, steps)
            counts, parts = parts.counts(), parts.medians()
            if args.parts:
                print(f"  {kind} B={b}, per new-packing call ({args.calls} calls): " + ", ".join(
                    f"{label} {parts[label]:.1f} us x{counts[label] / args.calls:.1f}" for label in counts))
            same_host, _ = _run(q, k, v, do, [steps[0]] * args.calls)
            rows.append(dict(tables=kind, batch=b, new_host_us=fresh_host, repeated_host_us=same_host,
                             gpu_ms=fresh_gpu, build_us=parts["build"], upload_us=parts["upload"]))
            print(f"{kind:10s} {b:3d}  {fresh_host:19.1f}  {same_host:16.1f}  {fresh_host - same_host:17.1f}  "
                  f"{fresh_gpu:12.3f}  {parts['build']:8.1f}  {parts['upload']:9.1f}")
    for name in ("CUPY_DASH_COMPACT_TABLES", "CUPY_DASH_VARLEN_EXPAND"):
        os.environ.pop(name, None)
    if args.torch:
        from cupy_dash.core import fastpath_varlen
        print("torch fast path:", fastpath_varlen.stats())
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
