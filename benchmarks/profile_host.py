"""Host overhead per call (µs, tiny shape, back-to-back calls) for CuPy and torch inputs, and a cProfile of the
backward's Python path: where the host time goes.  Run on a GPU machine: python benchmarks/profile_host.py"""
import cProfile
import io
import pstats
import time

import cupy

import cupy_dash
from cupy_dash.cli.measure import random_tensor


def per_call(fn, calls=1000, warmup=50):
    for _ in range(warmup):
        fn()
    cupy.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    cupy.cuda.Device().synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def main():
    shape = (1, 128, 1, 64)
    q, k, v, do = (random_tensor(shape, "bf16", seed=i) for i in range(4))
    out, lse = cupy_dash.attention_forward(q, k, v)
    inputs = {"cupy": (q, k, v, do, out, lse)}
    try:
        import torch
        inputs["torch"] = tuple(torch.from_dlpack(x) for x in (q, k, v, do, out, lse))
    except ImportError:
        pass
    for name, (q_, k_, v_, do_, out_, lse_) in inputs.items():
        fwd = per_call(lambda: cupy_dash.attention_forward(q_, k_, v_))
        bwd = per_call(lambda: cupy_dash.attention_backward(do_, q_, k_, v_, out_, lse_))
        print(f"{name:>6} inputs: forward {fwd:7.1f} µs/call, backward {bwd:7.1f} µs/call")
    cupy_dash.check_errors()
    q_, k_, v_, do_, out_, lse_ = inputs.get("torch", inputs["cupy"])
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(300):
        cupy_dash.attention_backward(do_, q_, k_, v_, out_, lse_)
    prof.disable()
    cupy.cuda.Device().synchronize()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
    print(buf.getvalue())


if __name__ == "__main__":
    main()
