"""Per-call overhead of cupy_dash with JAX arrays: eager (DLPack functional API, and cupy_dash.jax called eagerly)
against ``jax.jit`` programs, on a tiny shape (B=1, H=1, S=128, D=64) where the kernels take a few µs.

Two numbers per path, in µs: *host* is the median time one call takes to return (the device is drained every 100
calls outside the timed region); *steady* is the wall time per call of 1000 back-to-back calls followed by one
``block_until_ready`` (what a loop of steps pays when the host is the bottleneck). A jitted ``x * 2`` gives the
floor of one XLA dispatch. The jitted paths run with both mechanisms of cupy_dash.jax: the Python
``buffer_callback`` and the C FFI handler (``CUPY_DASH_JAX_FFI=1`` while they are traced; skipped if the extension
is not built). ``--command-buffers`` sets ``XLA_FLAGS=--xla_gpu_enable_command_buffer=FUSION,
CUSTOM_CALL --xla_gpu_graph_min_graph_size=1`` before JAX starts (XLA then replays recorded launches; the
Python callback runs only when it records) and reports how often the callbacks ran.

    python benchmarks/jax_overhead.py [--calls 2000] [--command-buffers] [--json out.json]
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--command-buffers", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    if args.command_buffers:
        if "jax" in sys.modules:
            raise SystemExit("--command-buffers must be set before JAX is imported")
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_gpu_enable_command_buffer=FUSION,"
                                   "CUSTOM_CALL --xla_gpu_graph_min_graph_size=1").strip()
    import jax
    import ml_dtypes
    import numpy as np

    import cupy_dash
    import cupy_dash.jax as cj

    dev = jax.devices("gpu")[0]
    rng = np.random.default_rng(0)
    q, k, v, dout = (jax.device_put(rng.standard_normal((1, 128, 1, 64), dtype=np.float32)
                                    .astype(ml_dtypes.bfloat16), dev) for _ in range(4))
    out, lse = cj.attention_forward(q, k, v)
    jit_floor = jax.jit(lambda x: x * 2)
    paths = {"jit x * 2 (one XLA op)": lambda: jit_floor(q)}
    mechanisms = ["callback"]
    try:
        import cupy_dash.jax._xla_ffi  # noqa: F401
        mechanisms.append("ffi")
    except ImportError:
        print("cupy_dash.jax._xla_ffi is not built: the C handler is skipped")
    for mechanism in mechanisms:
        os.environ["CUPY_DASH_JAX_FFI"] = "1" if mechanism == "ffi" else "0"
        jit_fwd = jax.jit(lambda q, k, v: cj.attention_forward(q, k, v))
        jit_bwd = jax.jit(lambda *a: cj.attention_backward(*a))
        jit_vjp = jax.jit(lambda q, k, v, do: jax.vjp(cj.attention, q, k, v)[1](do))
        for fn, fn_args in ((jit_fwd, (q, k, v)), (jit_bwd, (dout, q, k, v, out, lse)),
                            (jit_vjp, (q, k, v, dout))):
            jax.block_until_ready(fn(*fn_args))               # traced now, with this mechanism
        paths.update({
            f"jit forward [{mechanism}]": functools.partial(jit_fwd, q, k, v),
            f"jit backward [{mechanism}]": functools.partial(jit_bwd, dout, q, k, v, out, lse),
            f"jit forward + backward (vjp) [{mechanism}]": functools.partial(jit_vjp, q, k, v, dout),
        })
    os.environ.pop("CUPY_DASH_JAX_FFI")
    paths.update({
        "cupy_dash.jax.attention_forward, eager": lambda: cj.attention_forward(q, k, v),
        "cupy_dash.attention_forward (DLPack), eager": lambda: cupy_dash.attention_forward(q, k, v),
        "cupy_dash.attention_backward (DLPack), eager": lambda: cupy_dash.attention_backward(dout, q, k, v, out,
                                                                                             lse),
    })
    results = {}
    print(f"jax {jax.__version__}, {dev.device_kind}, command buffers: {args.command_buffers}")
    print(f"{'path':52s} {'host µs':>9s} {'p10':>7s} {'p90':>7s} {'steady µs':>10s} {'callbacks':>10s}")
    for name, fn in paths.items():
        runs0 = sum(cj.callback_runs.values())
        host = per_call_us(jax, fn, args.calls)
        steady = steady_us(jax, fn, 1000)
        runs = sum(cj.callback_runs.values()) - runs0
        results[name] = dict(host=host, steady_us=steady, callback_runs=runs, calls=50 + 1 + args.calls + 1 + 1000)
        print(f"{name:52s} {host['median']:9.1f} {host['p10']:7.1f} {host['p90']:7.1f} {steady:10.1f} {runs:10d}")
    cupy_dash.check_errors()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(jax=jax.__version__, device=dev.device_kind, command_buffers=args.command_buffers,
                           calls=args.calls, results=results), f, indent=1)
    return 0


def per_call_us(jax, fn, calls, warmup=50):
    """Median and 10th / 90th percentiles of the host time of single calls, in µs."""
    for _ in range(warmup):
        fn()
    jax.block_until_ready(fn())
    times = []
    last = None
    for i in range(calls):
        if i % 100 == 0 and last is not None:
            jax.block_until_ready(last)
        t0 = time.perf_counter_ns()
        last = fn()
        times.append((time.perf_counter_ns() - t0) / 1e3)
    jax.block_until_ready(last)
    times.sort()
    return dict(median=statistics.median(times), p10=times[len(times) // 10], p90=times[9 * len(times) // 10])


def steady_us(jax, fn, calls) -> float:
    """Wall time per call of ``calls`` back-to-back calls and one final wait, in µs."""
    jax.block_until_ready(fn())
    t0 = time.perf_counter()
    for _ in range(calls):
        last = fn()
    jax.block_until_ready(last)
    return (time.perf_counter() - t0) / calls * 1e6


if __name__ == "__main__":
    raise SystemExit(main())
