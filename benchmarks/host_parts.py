"""What each step of the torch host fast paths costs on this machine (µs per step, mean of a tight loop): the
torch calls (allocations, tensor attributes, stream query), the CUDA calls, and cupy_dash's own steps (signature,
stream check, error poll, block patch, launch), then the whole forward and backward calls. Tiny shape (B=1,
H=1, S=128, D=64, bf16), so the GPU work is negligible; the device is drained between steps. Needs a GPU.

    python benchmarks/host_parts.py [--loops 3000]

Read with benchmarks/host_overhead.py (per-call medians): the sum of the steps of a path should come near its
whole call; the steps that dominate are where a faster fast path must save.
"""
from __future__ import annotations

import argparse
import struct
import time

import torch

import cupy_dash
from cupy_dash.core import fastpath, interop
from cupy_dash.cuda import errors


def per_step_us(fn, loops):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):                                   # best of three rounds: the VM's CPU speed moves
        t0 = time.perf_counter_ns()
        for _ in range(loops):
            fn()
        best = min(best, (time.perf_counter_ns() - t0) / loops / 1e3)
        torch.cuda.synchronize()
    return best


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loops", type=int, default=3000)
    args = ap.parse_args(argv)
    n = args.loops
    q, k, v, do = (torch.randn(1, 128, 1, 64, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    out, lse = cupy_dash.attention_forward(q, k, v)
    cupy_dash.attention_backward(do, q, k, v, out, lse)
    torch.cuda.synchronize()
    dev = q.device
    fkey = fastpath.fwd_key(q, k, v, False, None, (-1, -1))
    bkey = fastpath.bwd_key(do, q, k, v, out, lse, False, None, "auto", True, (-1, -1))
    fplan, bplan = fastpath._fwd_plans[fkey], fastpath._bwd_plans[bkey]
    stream = fastpath._ready_stream(bplan)
    template = bplan.c.plan.parts.params.tobytes()
    fbuffers = (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr())
    rows = [
        ("torch.empty (1,128,1,64) bf16", lambda: torch.empty((1, 128, 1, 64), dtype=torch.bfloat16, device=dev)),
        ("torch.empty 4 KB uint8", lambda: torch.empty((4096,), dtype=torch.uint8, device=dev)),
        ("tensor.shape", lambda: q.shape),
        ("tensor.stride()", lambda: q.stride()),
        ("tensor.dtype", lambda: q.dtype),
        ("tensor.device", lambda: q.device),
        ("tensor.data_ptr()", lambda: q.data_ptr()),
        ("tensor.get_device()", lambda: q.get_device()),
        ("fastpath._sig(q)", lambda: fastpath._sig(q)),
        ("fastpath.fwd_key", lambda: fastpath.fwd_key(q, k, v, False, None, (-1, -1))),
        ("fastpath.bwd_key", lambda: fastpath.bwd_key(do, q, k, v, out, lse, False, None, "auto", True, (-1, -1))),
        ("dict lookup of the bwd key", lambda: fastpath._bwd_plans.get(bkey)),
        ("cupy runtime.getDevice", lambda: fastpath.cupy.cuda.runtime.getDevice()),
        ("torch current raw stream", lambda: interop._torch_stream_ptr(0)),
        ("cupy runtime.streamIsCapturing", lambda: fastpath.cupy.cuda.runtime.streamIsCapturing(stream.ptr)),
        ("fastpath._ready_stream", lambda: fastpath._ready_stream(bplan)),
        ("errors.poll_errors (nothing pending)", errors.poll_errors),
        ("bytearray(bwd template) + 15 pack_into", lambda: [struct.pack_into("<Q", b, 8 * i, i) for b in
                                                           (bytearray(template),) for i in range(15)]),
        ("LaunchPlan.run (forward: patches, maps, cuLaunchKernel)", lambda: fplan.launch.run(stream.ptr, fbuffers)),
        ("fastpath.run_forward", lambda: fastpath.run_forward(fplan, stream, q, k, v)),
        ("fastpath.run_backward", lambda: fastpath.run_backward(bplan, stream, do, q, k, v, out, lse)),
        ("cupy_dash.attention_forward (whole call)", lambda: cupy_dash.attention_forward(q, k, v)),
        ("cupy_dash.attention_backward (whole call)", lambda: cupy_dash.attention_backward(do, q, k, v, out, lse)),
        ("torch SDPA forward (for scale)", lambda: torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))),
    ]
    print(f"host time per step, µs (best of 3 rounds of {n}; {torch.cuda.get_device_name()})")
    for name, fn in rows:
        print(f"{name:45s} {per_step_us(fn, n):8.2f}")
    cupy_dash.check_errors()


if __name__ == "__main__":
    main()
