"""FLOP counts, seeded random inputs on the GPU and CUDA-event timing: what the demo (``python -m cupy_dash``)
measures with, and what the benchmark scripts of ``benchmarks/`` build on (conventions: docs/performance.md).
"""
from __future__ import annotations

import math
import time

__all__ = ["ATOMIC", "SCHEDULES", "CupyEvents", "attention_flops", "random_tensor", "time_calls"]

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


class CupyEvents:
    """The events :func:`time_calls` records: CuPy's, on the current stream."""

    def __init__(self):
        import cupy
        self.cupy = cupy

    def event(self):
        return self.cupy.cuda.Event()

    def record(self, ev):
        ev.record(self.cupy.cuda.get_current_stream())

    def synchronize(self, ev):
        ev.synchronize()

    def elapsed_ms(self, start, end):
        return float(self.cupy.cuda.get_elapsed_time(start, end))


def time_calls(calls, *, warmup, repeats, events, flush=None, warmup_s=0.0):
    """Median-ready list of per-call GPU times (ms): ``calls[i % len(calls)]`` is call i (rotating input sets).

    Every call is bracketed by two events on the current stream; calls are enqueued back to back and the host
    synchronizes once at the end. ``events``: :class:`CupyEvents` or any object with the same four methods
    (the benchmark's torch peer passes torch's); ``flush``: called before every timed call, outside the events.
    ``warmup_s``: after the ``warmup`` calls, more untimed calls until that many seconds of wall time have passed
    since the first (at most two calls in flight): a busy H200 reaches its power limit within ~0.1 s and lowers its
    SM clock (1980 -> ~1700 MHz at 15k tokens), so calls timed right after an idle GPU run faster than a training
    step's would.
    """
    n = len(calls)
    t0 = time.perf_counter()
    for i in range(warmup):
        calls[i % n]()
    i, prev = warmup, None
    while time.perf_counter() - t0 < warmup_s:
        calls[i % n]()
        ev = events.event()
        events.record(ev)
        if prev is not None:
            events.synchronize(prev)
        prev, i = ev, i + 1
    starts = [events.event() for _ in range(repeats)]
    ends = [events.event() for _ in range(repeats)]
    for i in range(repeats):
        if flush is not None:
            flush()
        events.record(starts[i])
        calls[i % n]()
        events.record(ends[i])
    events.synchronize(ends[-1])
    return [events.elapsed_ms(s, e) for s, e in zip(starts, ends)]
