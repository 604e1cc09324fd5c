"""Host overhead per call and compile times, measured by benchmarks/bench.py (see its docstring)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time


def _log(msg):
    print(msg, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------------------------
def measure_host_overhead(calls=1000, warmup=20, dtype="bf16", torch_mod=None):
    """Average wall-clock µs per call for a tiny shape (B=1, H=1, S=128, D=64), ``calls`` calls back to back
    with a single synchronization at the end (first-call compilation excluded by the warm-up)."""
    import cupy
    import cupy_dash
    from cupy_dash.cli.measure import random_tensor

    shape = (1, 128, 1, 64)
    q, k, v, do = (random_tensor(shape, dtype, seed=i) for i in range(4))
    out, lse = cupy_dash.attention_forward(q, k, v)
    stream = cupy.cuda.get_current_stream()
    res = {}

    def per_call(fn):
        for _ in range(warmup):
            fn()
        stream.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        stream.synchronize()
        return (time.perf_counter() - t0) / calls * 1e6

    res["dash_fwd_us"] = per_call(lambda: cupy_dash.attention_forward(q, k, v))
    res["dash_bwd_us"] = per_call(lambda: cupy_dash.attention_backward(do, q, k, v, out, lse))
    cupy_dash.check_errors()
    if torch_mod is not None:
        torch = torch_mod
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
        tq, tk, tv, tdo = (torch.from_dlpack(x).transpose(1, 2) for x in (q, k, v, do))
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            with torch.no_grad():
                res["torch_fwd_us"] = per_call(lambda: F.scaled_dot_product_attention(tq, tk, tv))
            leaves = [x.detach().requires_grad_(True) for x in (tq, tk, tv)]
            o = F.scaled_dot_product_attention(*leaves)
            res["torch_bwd_us"] = per_call(lambda: torch.autograd.grad(o, leaves, tdo, retain_graph=True))
        torch.cuda.synchronize()
    res["calls"] = calls
    res["shape"] = dict(batch=1, heads=1, seqlen=128, hdim=64, dtype=dtype)
    return res


_COMPILE_SCRIPT = r"""
import json, sys, time
t0 = time.perf_counter()
import cupy
import cupy_dash
from cupy_dash.cli.measure import random_tensor
t_import = time.perf_counter() - t0
p = json.loads(sys.argv[1])
dev = cupy.cuda.Device(0)
cupy.zeros(1)
dev.synchronize()
shape = (p["batch"], p["seqlen"], p["heads"], p["hdim"])
q, k, v, do = (random_tensor(shape, p["dtype"], seed=i) for i in range(4))
dev.synchronize()
t = time.perf_counter()
out, lse = cupy_dash.attention_forward(q, k, v, causal=p["causal"])
dev.synchronize()
t_fwd = time.perf_counter() - t
t = time.perf_counter()
cupy_dash.attention_backward(do, q, k, v, out, lse, causal=p["causal"])
cupy_dash.check_errors()
t_bwd = time.perf_counter() - t
t = time.perf_counter()
out, lse = cupy_dash.attention_forward(q, k, v, causal=p["causal"])
cupy_dash.attention_backward(do, q, k, v, out, lse, causal=p["causal"])
cupy_dash.check_errors()
t_again = time.perf_counter() - t
print("@@RESULT@@" + json.dumps(dict(import_s=t_import, first_fwd_s=t_fwd, first_bwd_s=t_bwd,
                                     first_total_s=t_fwd + t_bwd, second_fwd_bwd_s=t_again)))
"""


def _run_compile_probe(params, cache_dir, cupy_cache_dir, timeout=900):
    env = dict(os.environ)
    env["CUPY_DASH_CACHE_DIR"] = cache_dir
    env["CUPY_CACHE_DIR"] = cupy_cache_dir
    import cupy_dash
    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(cupy_dash.__file__)))
    env["PYTHONPATH"] = pkg_parent + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _COMPILE_SCRIPT, json.dumps(params)], env=env,
                          capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t
    for line in proc.stdout.splitlines():
        if line.startswith("@@RESULT@@"):
            res = json.loads(line[len("@@RESULT@@"):])
            res["process_wall_s"] = wall
            return res
    tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-5:]
    raise RuntimeError(f"compile probe exited with {proc.returncode}: " + " | ".join(tail))


def measure_compile_times(hdim=128, causal=True, dtype="bf16"):
    """Cold (empty CUPY_DASH_CACHE_DIR and CUPY_CACHE_DIR) and warm (same directories, new process) first-call
    times of forward + backward, each in a fresh Python process."""
    params = dict(batch=1, heads=2, seqlen=256, hdim=hdim, causal=causal, dtype=dtype)
    res = dict(shape=params)
    with tempfile.TemporaryDirectory(prefix="cupy_dash_bench_cache_") as tmp:
        dash_dir, cupy_dir = os.path.join(tmp, "dash"), os.path.join(tmp, "cupy")
        os.makedirs(dash_dir)
        os.makedirs(cupy_dir)
        for phase in ("cold", "warm"):
            try:
                res[phase] = _run_compile_probe(params, dash_dir, cupy_dir)
                _log(f"    compile {phase}: first fwd {res[phase]['first_fwd_s']:.2f} s, first bwd "
                     f"{res[phase]['first_bwd_s']:.2f} s (process {res[phase]['process_wall_s']:.1f} s)")
            except Exception as exc:
                res[phase] = dict(error=f"{type(exc).__name__}: {exc}")
                _log(f"    compile {phase}: FAILED: {res[phase]['error']}")
    return res


