"""Forward tile sweep on the GPU: KV tile rows (BLOCK_N 64 / 80 / 112 / 128 / 176) x K/V stages (2 / 3) for each head
dim and mask, timed with CUDA events on the benchmark's shapes (16k tokens, H*D = 2048, bf16). Each variant's output is
first compared with the shipped variant's (same inputs) so that a broken variant cannot win.

    python benchmarks/fwd_tiles.py [--seqlens 1024 4096 16384] [--repeats 30] [--block-n 128 64] [--stages 2 3]
                                   [--hdims 64 128] [--masks full causal] [--tokens 16384]

FA3's full-mask head-dim-128 tile (128 x 176, two stages) beside ours, on the engine issue's full-mask shapes:
``--hdims 128 --masks full --block-n 128 176 --stages 2 --seqlens 1280 3840 15360 --tokens 15360``. FA3's head-dim
256 and 192 tiles (128 x 80, 128 x 112) beside ours (128 x 64): ``--hdims 256 --block-n 64 80 --stages 2`` and
``--hdims 192 --hidden 1536 --block-n 64 112 --stages 2``.
"""
from __future__ import annotations

import argparse
import dataclasses

import cupy
import numpy as np

import cupy_dash
from cupy_dash.cuda import kernels
from cupy_dash.cli.measure import attention_flops, random_tensor


def variant(dtype, hdim, causal, block_n, stages):
    base = kernels.fwd_spec(dtype, hdim, causal)
    tile = kernels.fwd_tile(hdim)
    smem = kernels._fwd_smem(dataclasses.replace(tile, block_n=block_n), hdim, stages)
    d = dict(base.defines, DASH_BLOCK_N=block_n, DASH_SMEM_BYTES=smem, DASH_KV_STAGES=stages)
    return dataclasses.replace(base, defines=tuple(sorted(d.items())), smem_bytes=smem), tile.block_m, block_n


def timed(fn, repeats):
    for _ in range(3):
        fn()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for _ in range(repeats):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end))
    return float(np.median(times))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqlens", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--block-n", type=int, nargs="+", default=[128, 64], choices=[64, 80, 112, 128, 176])
    ap.add_argument("--stages", type=int, nargs="+", default=[2, 3])
    ap.add_argument("--hdims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--masks", nargs="+", default=["full", "causal"], choices=["full", "causal"])
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=2048, help="H * D (head dim 192: e.g. 1536 or 3072)")
    args = ap.parse_args()
    tokens, hidden = args.tokens, args.hidden
    n = tokens * hidden
    q, k, v = (random_tensor((n,), "bf16", seed=s) for s in (0, 1, 2))
    print("| hdim | mask | S | BLOCK_N | stages | ms | TFLOP/s | max abs diff vs shipped |")
    print("|---|---|---|---|---|---|---|---|")
    for hdim in args.hdims:
        for causal in (mask == "causal" for mask in args.masks):
            for S in args.seqlens:
                B, H = tokens // S, hidden // hdim
                shape = (B, S, H, hdim)
                qs, ks, vs = (x.reshape(shape) for x in (q, k, v))
                ref, _ = cupy_dash.attention_forward(qs, ks, vs, causal=causal)
                ref = ref.astype(cupy.float32)
                flops = attention_flops(B, H, S, S, hdim, causal, "fwd")
                for block_n in args.block_n:
                    for stages in args.stages:
                        entry = variant("bfloat16", hdim, causal, block_n, stages)
                        if entry[0].smem_bytes > 227 * 1024:
                            continue
                        kernels._fwd_cache[("bfloat16", hdim, causal)] = entry
                        try:
                            out, _ = cupy_dash.attention_forward(qs, ks, vs, causal=causal)
                            diff = float(cupy.abs(out.astype(cupy.float32) - ref).max())
                            ms = timed(lambda: cupy_dash.attention_forward(qs, ks, vs, causal=causal),
                                       args.repeats)
                            print(f"| {hdim} | {'causal' if causal else 'full'} | {S} | {block_n} | {stages} | "
                                  f"{ms:.3f} | {flops / ms / 1e9:.0f} | {diff:.3g} |", flush=True)
                        finally:
                            kernels._fwd_cache.clear()


if __name__ == "__main__":
    main()
