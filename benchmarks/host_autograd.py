"""Where the host time of an eager training step through ``cupy_dash.torch.attention`` goes: forward + backward
through autograd split into the forward call, ``torch.autograd.grad``, the time inside the autograd.Function's
backward and inside ``cupy_dash.attention_backward`` (and which thread runs them); a do-nothing autograd.Function on
the same CUDA tensors and torch SDPA as the yardsticks; every path also with the autograd engine's worker threads
off (``torch.autograd.set_multithreading_enabled(False)``: the backward then runs in the calling thread). Tiny shape
(B=1, H=1, S=128, D=64), µs per call, medians of ``--calls`` single calls (host_overhead.per_call_us).

``--torch-profile``: then torch.profiler's CPU table (self time, every thread) of 300 training steps of each, ours and
SDPA's.

    python benchmarks/host_autograd.py [--calls 2000] [--json out.json] [--torch-profile]
"""
from __future__ import annotations

import argparse
import statistics
import threading
import time

import torch
import torch.nn.functional as F

import cupy_dash
import cupy_dash.torch
from cupy_dash.torch import ops as torch_ops
from host_overhead import per_call_us, report


class _Identity(torch.autograd.Function):
    """out = q (a view), gradient passed through: torch's own cost of a Python autograd.Function step."""

    @staticmethod
    def forward(ctx, q, k, v):
        return q.view_as(q)

    @staticmethod
    def backward(ctx, dout):
        return dout, None, None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--json", default=None)
    ap.add_argument("--torch-profile", action="store_true")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    q, k, v, dout = (torch.randn(1, 128, 1, 64, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    qg, kg, vg = (x.detach().requires_grad_(True) for x in (q, k, v))
    inside = {"Function.backward": [], "attention_backward": []}
    threads = set()
    backward, api_backward = torch_ops._Eager.backward, cupy_dash.attention_backward

    def timed_api_backward(*a, **kw):
        t0 = time.perf_counter_ns()
        try:
            return api_backward(*a, **kw)
        finally:
            inside["attention_backward"].append((time.perf_counter_ns() - t0) / 1e3)

    def timed_backward(ctx, dout_, dlse):
        threads.add(threading.get_ident())
        ctx.fns = (ctx.fns[0], timed_api_backward)
        t0 = time.perf_counter_ns()
        try:
            return backward(ctx, dout_, dlse)
        finally:
            inside["Function.backward"].append((time.perf_counter_ns() - t0) / 1e3)

    torch_ops._Eager.backward = staticmethod(timed_backward)
    tq, tk, tv = (x.detach().transpose(1, 2).requires_grad_(True) for x in (q, k, v))
    tdout = dout.transpose(1, 2)
    paths = {
        "attention() forward": lambda: cupy_dash.torch.attention(qg, kg, vg),
        "attention() fwd+bwd": lambda: torch.autograd.grad(cupy_dash.torch.attention(qg, kg, vg), (qg, kg, vg), dout),
        "identity Function fwd+bwd": lambda: torch.autograd.grad(_Identity.apply(qg, kg, vg), (qg,), dout),
        "api forward + backward": lambda: cupy_dash.attention_backward(dout, q, k, v,
                                                                       *cupy_dash.attention_forward(q, k, v)),
        "torch SDPA fwd+bwd": lambda: torch.autograd.grad(F.scaled_dot_product_attention(tq, tk, tv), (tq, tk, tv),
                                                           tdout),
    }
    res = {}
    for threaded in (True, False):
        torch.autograd.set_multithreading_enabled(threaded)
        tag = "" if threaded else ", backward in the calling thread"
        for name, fn in paths.items():
            for values in inside.values():
                values.clear()
            res[name + tag] = per_call_us(fn, args.calls)
            if name == "attention() fwd+bwd":
                for part, values in inside.items():
                    res[f"  inside {part}{tag}"] = dict(median=statistics.median(values), p10=sorted(values)[
                        len(values) // 10], p90=sorted(values)[9 * len(values) // 10])
                res[f"  threads running the backward{tag}"] = dict(median=len(threads), p10=0, p90=0)
                threads.clear()
    torch.autograd.set_multithreading_enabled(True)
    cupy_dash.check_errors()
    report(res, args.calls, args.json, width=58, note=f"; main thread {threading.get_ident()}")
    if args.torch_profile:
        from torch.profiler import ProfilerActivity, profile
        for name in ("attention() fwd+bwd", "torch SDPA fwd+bwd"):
            for _ in range(50):
                paths[name]()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for i in range(300):
                    paths[name]()
                    if i % 100 == 99:
                        torch.cuda.synchronize()
            print(f"--- torch.profiler, 300 steps of {name} ---")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=28, max_name_column_width=60))


if __name__ == "__main__":
    main()
