"""Why a torch new-packing backward costs more host time than build + upload (measured 2026-12-01; raw log in git
history, ``git show ee9a198:benchmarks/NOTES.md``):
the host time of a *repeated* varlen backward call (the torch fast path, cached table) and of its
``fastpath.run_backward``, right after different parts of a new packing's work on the same stream. 16,384 tokens
in 16 sequences, 16 heads of 128, fp16, causal; median µs over --calls calls per condition, the GPU drained every
10 calls outside the timed region.

    python benchmarks/new_packing_probe.py [--calls 60]

Conditions (each precedes the timed repeated call):
  plain      nothing
  h2d        a 64 KB copy from pinned memory to the device on the same stream (the upload's copy alone)
  build      the host build of a new packing (varlen_launch._tables: no upload)
  upload     a new packing's build, upload and expansion launch (varlen_launch.packing_launch), as a new-packing call
  new        (not a repeated call) the new-packing call itself, for reference (forwards run before the loop)

Each row also gives the mean µs, per timed call, of the steps inside ``run_backward`` (wrapped while timed:
~0.3 µs each): the gradients' and scratch allocations, the error slot, the block patch, the launches.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import cupy
import numpy as np
import torch

import cupy_dash
from cupy_dash.core import fastpath, fastpath_varlen, varlen_launch
from cupy_dash.cuda import errors, launchers, plans

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from varlen_step import _Parts  # noqa: E402

TOKENS, H, D, B = 16384, 16, 128, 16


def _packing(rng):
    cuts = np.sort(rng.choice(np.arange(1, TOKENS), size=B - 1, replace=False))
    return np.concatenate([[0], cuts, [TOKENS]]).astype(np.int32)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=60)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    q, k, v, do = (torch.randn(TOKENS, H, D, device="cuda", dtype=torch.float16) for _ in range(4))
    cus = [_packing(rng) for _ in range(args.calls * 6 + 1)]    # one per call, one repeated
    fwd = {}

    def outputs(cu):
        if cu.tobytes() not in fwd:
            m = int(np.diff(cu).max())
            fwd[cu.tobytes()] = cupy_dash.attention_forward_varlen(q, k, v, torch.from_numpy(cu).cuda(),
                                                                   torch.from_numpy(cu).cuda(), m, m, causal=True)
        return fwd[cu.tobytes()]

    def bwd(cu):
        out, lse = outputs(cu)
        m = int(np.diff(cu).max())
        cupy_dash.attention_backward_varlen(do, q, k, v, out, lse, cu, cu, m, m, causal=True)

    cu0 = cus.pop()
    for _ in range(3):
        bwd(cu0)
    torch.cuda.synchronize()
    timer = _Parts()                     # also times varlen_launch._tables and varlen_device.device (not printed)
    for mod, name, label in ((fastpath, "run_backward", "run_backward"),
                             (fastpath._torch, "empty_like", "empty_like x3"), (fastpath._torch, "empty", "empty"),
                             (errors, "poll_errors", "poll_errors"), (errors, "acquire_slot", "acquire slot"),
                             (plans, "rebased", "plans.rebased"),
                             (launchers, "enqueue_backward", "enqueue_backward")):
        timer.times[label] = []
        timer._wrap(mod, name, label)
    parts = timer.times

    base = next(iter(fastpath_varlen._templates.values()))
    c0, dev = base.c, base.device_index
    stream = base.stream
    pinned = cupy.cuda.alloc_pinned_memory(64 << 10)
    dst = cupy.cuda.alloc(64 << 10)

    def h2d(_cu):
        cupy.cuda.runtime.memcpyAsync(dst.ptr, pinned.ptr, 64 << 10, cupy.cuda.runtime.memcpyHostToDevice,
                                      stream.ptr)

    def build(cu):
        lens = np.diff(cu).astype(np.int64)
        varlen_launch._tables(dev, c0.p.dtype, D, True, "auto", lens, lens, H, H, c0.window)

    def upload(cu):
        m = int(np.diff(cu).max())
        varlen_launch.packing_launch(dev, c0.p, True, True, "auto", c0.window, c0.spin_timeout_ns, (cu, cu), m,
                              base.stream)

    print(f"repeated varlen backward after part of a new packing's work, {TOKENS} tokens in {B} sequences, "
          f"H={H}, D={D}, fp16, causal, torch, {args.calls} calls (NVIDIA H200)")
    new_cus = [cus.pop() for _ in range(args.calls)]
    for cu in new_cus:
        outputs(cu)
    torch.cuda.synchronize()
    print("condition  call us (median)  run_backward us (median)  inside run_backward (mean us per call)")
    for name, before in (("plain", None), ("h2d", h2d), ("build", build), ("upload", upload), ("new", None),
                         ("plain", None)):
        calls, inside, rb = [], dict.fromkeys(parts, 0), []
        for i in range(args.calls):
            if i % 10 == 0:
                torch.cuda.synchronize()
            cu = new_cus.pop() if name == "new" else cus.pop()
            if before is not None:
                before(cu)
            target = cu if name == "new" else cu0
            marks = {label: len(times) for label, times in parts.items()}
            t0 = time.perf_counter_ns()
            bwd(target)
            calls.append(time.perf_counter_ns() - t0)
            for label, times in parts.items():         # only what ran inside the timed call
                inside[label] += sum(times[marks[label]:])
            rb.append(sum(parts["run_backward"][marks["run_backward"]:]))
        torch.cuda.synchronize()
        per_call = {label: ns / len(calls) / 1e3 for label, ns in inside.items()
                    if label not in ("run_backward", "build", "upload")}
        print(f"{name:9s}  {statistics.median(calls) / 1e3:16.1f}  {statistics.median(rb) / 1e3:24.1f}  "
              + ", ".join(f"{label} {us:.1f}" for label, us in per_call.items()))
    timer.medians()                      # puts the wrapped functions back
    cupy_dash.check_errors()
    print("torch fast path:", fastpath_varlen.stats())


if __name__ == "__main__":
    main()
