"""The float64 and low-precision references of five GQA-shaped cases (tests/gpu/test_gpu_gqa.py sizes), timed in one
process; run four at once with and without OPENBLAS_NUM_THREADS=1 to see what BLAS threads cost when processes share
the cores (2026-12-06, a 2-core machine: 25-26 s each with the default threads, 13 s with one; alone: 4.7 s with two
threads, 6.0 s with one):
    for i in 1 2 3 4; do python reference_threads.py & done; wait
    for i in 1 2 3 4; do OPENBLAS_NUM_THREADS=1 python reference_threads.py & done; wait"""
import time

import ml_dtypes
import numpy as np

from cupy_dash import reference

CASES = ((128, 1000, 300, True, 8), (256, 300, 777, False, 2), (64, 255, 255, True, 16), (192, 1000, 300, False, 1),
         (128, 300, 777, True, 16))   # head dim, Sq, Sk, causal, KV heads (16 query heads, batch 2)

t0 = time.time()
for d, sq, sk, causal, hkv in CASES:
    rng, dt = np.random.default_rng(0), ml_dtypes.bfloat16
    q, do = (rng.standard_normal((2, sq, 16, d)).astype(dt) for _ in range(2))
    k, v = (rng.standard_normal((2, sk, hkv, d)).astype(dt) for _ in range(2))
    out, lse = reference.forward(q, k, v, causal=causal)
    out_lp, lse_lp = reference.forward_lowp(q, k, v, causal=causal, dtype=dt)
    reference.backward(do, q, k, v, out, lse, causal=causal)
    reference.backward_lowp(do, q, k, v, out_lp, lse_lp, causal=causal, dtype=dt)
print(f"{time.time() - t0:.1f}")
