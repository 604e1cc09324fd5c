"""GPU time of the backward folded into one launch (kernels_src/bwd/fold.cuh) against three launches.

For each shape, CUPY_DASH_FOLD = 0 and = 1 in turn (CuPy inputs, the full eager path): the GPU is first given a
spin kernel longer than the host's enqueue time, then an event, the backward, an event; so the events time the
backward's kernels and the gaps between them, not the host. Also the host time of the call (perf_counter).
Medians of --repeats calls. Decides ``launchers.FOLD_MAX_TILES``: where folding stops paying on the GPU.

    python benchmarks/fold_bench.py [--repeats 50] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np

import cupy
import cupy_dash
from cupy_dash.cuda import launchers

SHAPES = [  # B, H, S, D, causal
    (1, 1, 128, 64, True), (1, 4, 512, 128, True), (4, 16, 512, 128, True), (1, 16, 1024, 128, True),
    (2, 16, 1024, 128, True), (1, 16, 2048, 128, False), (1, 16, 2048, 128, True), (1, 32, 2048, 64, True),
    (1, 16, 4096, 128, True), (4, 16, 2048, 128, True)]

_SPIN = cupy.RawKernel(r"""
extern "C" __global__ void spin(long long cycles) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) {}
}""", "spin")


def _pairs(B, H, S, D):
    bm, bn = (128, 128) if D == 64 else (64, 128)
    return B * H * -(-S // bm) * -(-S // bn)


def measure(B, H, S, D, causal, repeats):
    rng = np.random.default_rng(0)
    shape = (B, S, H, D)
    q, k, v, do = (cupy.asarray(rng.standard_normal(shape, dtype=np.float32)).astype(cupy.float16) for _ in range(4))
    out, lse = cupy_dash.attention_forward(q, k, v, causal=causal)
    row = {}
    for fold in ("0", "1"):
        os.environ[launchers.FOLD_ENV] = fold
        for _ in range(3):
            cupy_dash.attention_backward(do, q, k, v, out, lse, causal=causal)
        cupy.cuda.Device().synchronize()
        gpu, host = [], []
        for _ in range(repeats):
            a, b = cupy.cuda.Event(), cupy.cuda.Event()
            _SPIN((1,), (1,), (np.int64(2_000_000),))          # ~1 ms at 1.98 GHz: longer than any enqueue
            a.record()
            t0 = time.perf_counter()
            cupy_dash.attention_backward(do, q, k, v, out, lse, causal=causal)
            host.append((time.perf_counter() - t0) * 1e6)
            b.record()
            b.synchronize()
            gpu.append(cupy.cuda.get_elapsed_time(a, b) * 1e3)
        cupy_dash.check_errors()
        row[fold] = (statistics.median(gpu), statistics.median(host))
    os.environ.pop(launchers.FOLD_ENV, None)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--json")
    args = ap.parse_args()
    print(f"backward GPU / host µs per call, median of {args.repeats}, fp16 "
          f"({cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}); FOLD_MAX_TILES = "
          f"{launchers.FOLD_MAX_TILES}")
    print(f"{'B':>3} {'H':>3} {'S':>5} {'D':>4} {'mask':>6} {'pairs':>6}  {'GPU 3 launches':>14} {'GPU folded':>10} "
          f"{'ratio':>6}  {'host 3':>7} {'host 1':>7}")
    rows = []
    for B, H, S, D, causal in SHAPES:
        r = measure(B, H, S, D, causal, args.repeats)
        (g0, h0), (g1, h1) = r["0"], r["1"]
        print(f"{B:>3} {H:>3} {S:>5} {D:>4} {'causal' if causal else 'full':>6} {_pairs(B, H, S, D):>6}  "
              f"{g0:>14.1f} {g1:>10.1f} {g1 / g0:>6.3f}  {h0:>7.1f} {h1:>7.1f}", flush=True)
        rows.append(dict(B=B, H=H, S=S, D=D, causal=causal, pairs=_pairs(B, H, S, D), gpu_unfolded_us=g0,
                         gpu_folded_us=g1, host_unfolded_us=h0, host_folded_us=h1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
