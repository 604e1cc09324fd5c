"""Host time per call (µs) of the forward and the backward with torch tensors: each call timed alone on the host
(GPU work excluded: kernels run asynchronously, and the device is drained every 100 calls outside the timed
region so the launch queue never pushes back), median over >= 1000 calls, tiny shape (B=1, H=1, S=128, D=64).
Paths: the functional API (cupy_dash.attention_forward / attention_backward on torch tensors, and on CuPy arrays
with the fast path on and off: ``CUPY_DASH_FASTPATH``), the torch ops
(torch.ops.cupy_dash.*), a training step's forward + backward through cupy_dash.torch.attention (eager: a plain
autograd.Function) and through the forward op with its registered autograd, and torch SDPA (FlashAttention-2) for
scale; then a cProfile of each cupy_dash path. ``--fold-ab``: the functional backward with three launches
(CUPY_DASH_FOLD=0) and folded into one (CUPY_DASH_FOLD=1), and the forward as a control, measured interleaved in
blocks of 100 calls, so that the VM's changing speed affects both alike.

    python benchmarks/host_overhead.py [--calls 2000] [--profile] [--fold-ab] [--json out.json]
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

import torch

import cupy_dash


def per_call_us(fn, calls, warmup=50):
    """Median and 10th / 90th percentiles of the host time of single calls, in µs."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for i in range(calls):
        if i % 100 == 0:
            torch.cuda.synchronize()
        t0 = time.perf_counter_ns()
        fn()
        times.append((time.perf_counter_ns() - t0) / 1e3)
    torch.cuda.synchronize()
    times.sort()
    return dict(median=statistics.median(times), p10=times[len(times) // 10], p90=times[9 * len(times) // 10])


def report(res, calls, json_path=None, width=24, note=""):
    """Print ``res`` ({name: per_call_us's dict}) as a table of medians (p10 / p90), and write it to ``json_path``."""
    print(f"host µs per call, median of {calls} (p10 / p90), torch {torch.__version__}{note}:")
    for name, r in res.items():
        print(f"  {name:{width}s} {r['median']:7.1f}   ({r['p10']:.1f} / {r['p90']:.1f})")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(dict(calls=calls, torch=torch.__version__, results=res), f, indent=1)


def interleaved_us(fns, calls, block=100, warmup=50):
    """``{name: (fn, environment)}``: per name, the median, p10 and p90 host time of single calls in µs, the names
    taking turns in blocks of ``block`` calls, each block under its environment (set outside the timed calls)."""
    times = {name: [] for name in fns}
    saved = {k: os.environ.get(k) for _, env in fns.values() for k in env}
    try:
        for start in range(0, calls + warmup, block):
            for name, (fn, env) in fns.items():
                os.environ.update(env)
                torch.cuda.synchronize()
                for _ in range(block):
                    t0 = time.perf_counter_ns()
                    fn()
                    times[name].append((time.perf_counter_ns() - t0) / 1e3)
        torch.cuda.synchronize()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    res = {}
    for name, t in times.items():
        t = sorted(t[warmup:])
        res[name] = dict(median=statistics.median(t), p10=t[len(t) // 10], p90=t[9 * len(t) // 10])
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--profile", action="store_true", help="print a cProfile of the cupy_dash paths")
    ap.add_argument("--fold-ab", action="store_true", help="the backward folded and not, interleaved (only)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import cupy_dash.torch  # noqa: F401  (registers the ops)
    torch.manual_seed(0)
    q, k, v, dout = (torch.randn(1, 128, 1, 64, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    out, lse = cupy_dash.attention_forward(q, k, v)
    ops = torch.ops.cupy_dash
    import cupy
    cq, ck, cv, cdout = (cupy.from_dlpack(x) for x in (q, k, v, dout))
    cout, clse = cupy_dash.attention_forward(cq, ck, cv)
    paths = {
        "api forward": lambda: cupy_dash.attention_forward(q, k, v),
        "api backward": lambda: cupy_dash.attention_backward(dout, q, k, v, out, lse),
        "cupy api forward": lambda: cupy_dash.attention_forward(cq, ck, cv),
        "cupy api backward": lambda: cupy_dash.attention_backward(cdout, cq, ck, cv, cout, clse),
        "op forward": lambda: ops.attention_forward(q, k, v, False, None, "auto", True),
        "op backward": lambda: ops.attention_backward(dout, q, k, v, out, lse, False, None, "auto", True),
    }
    if args.fold_ab:
        res = interleaved_us({
            "api forward": (paths["api forward"], {}),
            "api backward, 3 launches": (paths["api backward"], {"CUPY_DASH_FOLD": "0"}),
            "api backward, folded": (paths["api backward"], {"CUPY_DASH_FOLD": "1"})}, args.calls)
        cupy_dash.check_errors()
        print(f"host µs per call, median of {args.calls}, interleaved in blocks of 100 (p10 / p90):")
        for name, r in res.items():
            print(f"  {name:26s} {r['median']:7.1f}   ({r['p10']:.1f} / {r['p90']:.1f})")
        return
    qg, kg, vg = (x.detach().requires_grad_(True) for x in (q, k, v))

    def train_step(attend):
        return lambda: torch.autograd.grad(attend(qg, kg, vg), (qg, kg, vg), dout)
    # what a training step runs: cupy_dash.torch.attention (eager: a plain autograd.Function) and the op it
    # replaces in eager calls (register_autograd), forward then backward, one call each
    paths["attention() fwd+bwd"] = train_step(cupy_dash.torch.attention)
    paths["op fwd+bwd (autograd)"] = train_step(lambda a, b, c: ops.attention_forward(a, b, c, False, None, "auto",
                                                                                    True)[0])
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    tq, tk, tv = (x.transpose(1, 2) for x in (q, k, v))
    leaves = [x.detach().requires_grad_(True) for x in (tq, tk, tv)]
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        o = F.scaled_dot_product_attention(*leaves)

        def sdpa_fwd():
            with torch.no_grad():
                F.scaled_dot_product_attention(tq, tk, tv)
        paths["torch SDPA forward"] = sdpa_fwd
        paths["torch SDPA backward"] = lambda: torch.autograd.grad(o, leaves, dout.transpose(1, 2), retain_graph=True)
        paths["torch SDPA fwd+bwd"] = lambda: torch.autograd.grad(F.scaled_dot_product_attention(*leaves), leaves,
                                                                  dout.transpose(1, 2))
        res = {name: per_call_us(fn, args.calls) for name, fn in paths.items()}
        os.environ["CUPY_DASH_FASTPATH"] = "0"             # the CuPy paths without the fast path, for scale
        for name in ("cupy api forward", "cupy api backward"):
            res[name + " (no fast path)"] = per_call_us(paths[name], args.calls)
        del os.environ["CUPY_DASH_FASTPATH"]
    cupy_dash.check_errors()
    report(res, args.calls, args.json)
    if args.profile:
        for name in ("api forward", "api backward", "op backward"):
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(500):
                paths[name]()
            prof.disable()
            torch.cuda.synchronize()
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(18)
            print(f"--- cProfile, 500 calls of {name} ---")
            print(buf.getvalue())


if __name__ == "__main__":
    main()
