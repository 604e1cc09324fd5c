"""FLOP counts, seeded random inputs on the GPU and the backward's schedule names: what the demo (``python -m
cupy_dash``) measures with, and what the benchmark scripts of ``benchmarks/`` build on (conventions:
docs/performance.md; their CUDA-event timing is benchmarks/measure.py).
"""
from __future__ import annotations

import math

__all__ = ["ATOMIC", "SCHEDULES", "attention_flops", "random_tensor"]

ATOMIC = "atomic"                      # the backward with deterministic=False
SCHEDULES = ("fa3", "descending", "shift", "symmetric_shift", "auto")    # the deterministic backward's schedules


def attention_flops(batch, heads, seqlen_q, seqlen_k, head_dim, causal, mode="fwd", head_dim_v=None):
    """FLOPs of one attention call, FA3 paper convention: fwd 4·B·H·Sq·Sk·D (×½ causal), bwd 2.5× fwd. With a value
    head dim Dv (``head_dim_v``) each GEMM counts its own width: fwd 2·B·H·Sq·Sk·(D + Dv), bwd 2·B·H·Sq·Sk·(3 D +
    2 Dv) (S, dQ, dK over D; dP, dV over Dv), the same numbers where Dv = D."""
    if mode not in ("fwd", "bwd"):
        raise ValueError(f"mode must be 'fwd' or 'bwd', got {mode!r}")
    dv = head_dim if head_dim_v is None else head_dim_v
    f = 2.0 * batch * heads * seqlen_q * seqlen_k * ((head_dim + dv) if mode == "fwd" else (3 * head_dim + 2 * dv))
    return f * 0.5 if causal else f


def random_tensor(shape, dtype="bf16", seed=0):
    """Standard-normal CuPy array of ``shape`` in bf16 (ml_dtypes) or fp16, generated on the GPU.

    bf16 is produced by round-to-nearest-even on the fp32 bit pattern with plain uint32 arithmetic, so no CuPy
    kernel has to know the bf16 type.
    """
    import cupy
    n = int(math.prod(shape))
    x = cupy.random.RandomState(seed).standard_normal(n, dtype=cupy.float32)
    if dtype in ("fp16", "float16"):
        return x.astype(cupy.float16).reshape(shape)
    if dtype not in ("bf16", "bfloat16"):
        raise ValueError(f"dtype must be bf16 or fp16, got {dtype!r}")
    import ml_dtypes
    u = x.view(cupy.uint32)
    bits = ((u + cupy.uint32(0x7FFF) + ((u >> cupy.uint32(16)) & cupy.uint32(1))) >> cupy.uint32(16))
    return bits.astype(cupy.uint16).view(ml_dtypes.bfloat16).reshape(shape)

