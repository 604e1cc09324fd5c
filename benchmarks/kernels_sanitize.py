"""Small forwards and backwards of every kernel family, for compute-sanitizer (memcheck, racecheck, synccheck) after a
kernel change: head dims 64 and 128, causal and full, deterministic and atomic, GQA, per-visit and compact tables,
varlen, logit soft-capping (the DASH_SOFTCAP builds, with per-visit and compact tables), tables with split KV columns
(cupy_dash/schedule/pieces.py: few CTAs, so that pieces of one column run on several), and the 80-query tile
(``CUPY_DASH_BWD_FULL_BLOCK_M=80`` in the environment: its full-mask head-dim-128 cases). Each backward runs twice;
deterministic ones must repeat their bits. Shapes keep several visits per CTA and a partial last tile. Exits 1 on a
difference.

    compute-sanitizer --tool racecheck python benchmarks/kernels_sanitize.py
    CUPY_DASH_BWD_FULL_BLOCK_M=80 compute-sanitizer --tool synccheck python benchmarks/kernels_sanitize.py
    compute-sanitizer --tool racecheck python benchmarks/kernels_sanitize.py --softcap-only   # the capped builds
    compute-sanitizer --tool memcheck python benchmarks/kernels_sanitize.py --pieces-only    # split columns only
"""
from __future__ import annotations

import os
import sys

import numpy as np

import cupy
import cupy_dash

# B, H, Hkv, Sq, Sk, D, causal, deterministic, compact tables, softcap
CASES = [(1, 2, 2, 300, 300, 128, True, True, False, 0.0), (1, 2, 1, 200, 333, 128, False, True, False, 0.0),
         (2, 1, 1, 129, 200, 64, True, False, False, 0.0), (1, 2, 2, 256, 256, 64, False, True, False, 0.0),
         (1, 2, 2, 300, 300, 128, True, True, True, 0.0), (1, 2, 2, 256, 200, 64, False, True, True, 0.0),
         (1, 2, 1, 300, 257, 128, True, True, False, 5.0), (1, 2, 2, 256, 300, 64, False, True, False, 5.0),
         (1, 2, 2, 333, 300, 128, False, False, False, 0.0), (1, 2, 2, 250, 260, 128, False, True, False, 5.0),
         (1, 2, 1, 300, 257, 128, True, True, True, 5.0), (1, 2, 2, 256, 300, 64, False, True, True, 5.0)]
# B, H, Sq, Sk, D, CTAs, pieces (0: trim_tail's causal cut), deterministic: split tables through the test hook
# (64-query tile)
PIECES = [(1, 3, 300, 700, 128, 5, 3, True), (2, 2, 200, 333, 64, 7, 2, True), (1, 3, 300, 700, 128, 5, 3, False),
          (1, 6, 700, 700, 128, 5, 0, True)]
VARLEN = [(2, 1, (130, 0, 77), (130, 45, 200), 128, True, True), (2, 2, (64, 129), (100, 129), 64, False, True),
          (2, 2, (100, 171, 9), (90, 200, 40), 128, False, True)]


def _randn(rng, shape):
    return cupy.asarray(rng.standard_normal(shape, dtype=np.float32)).astype(cupy.float16)


def _same(a, b) -> bool:
    return all(np.array_equal(x.get().view(np.int16), y.get().view(np.int16)) for x, y in zip(a, b))


def _fixed(rng, case) -> bool:
    B, H, Hkv, Sq, Sk, D, causal, det, compact, cap = case
    os.environ["CUPY_DASH_COMPACT_TABLES"] = "1" if compact else "0"      # the table form under test
    q, do = _randn(rng, (B, Sq, H, D)), _randn(rng, (B, Sq, H, D))
    k, v = _randn(rng, (B, Sk, Hkv, D)), _randn(rng, (B, Sk, Hkv, D))
    out, lse = cupy_dash.attention_forward(q, k, v, causal=causal, softcap=cap)
    runs = [cupy_dash.attention_backward(do, q, k, v, out, lse, causal=causal, deterministic=det, softcap=cap)
            for _ in range(2)]
    cupy_dash.check_errors()
    os.environ.pop("CUPY_DASH_COMPACT_TABLES")
    return _same(*runs) or not det


def _varlen(rng, case) -> bool:
    H, Hkv, lens_q, lens_k, D, causal, det = case
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    q, do = _randn(rng, (int(cu_q[-1]), H, D)), _randn(rng, (int(cu_q[-1]), H, D))
    k, v = _randn(rng, (int(cu_k[-1]), Hkv, D)), _randn(rng, (int(cu_k[-1]), Hkv, D))
    args = (cu_q, cu_k, max(lens_q), max(lens_k))   # host cu_seqlens: the backward reads them on the host
    dev_args = (cupy.asarray(cu_q), cupy.asarray(cu_k)) + args[2:]   # the forward takes them on q's device
    out, lse = cupy_dash.attention_forward_varlen(q, k, v, *dev_args, causal=causal)
    runs = [cupy_dash.attention_backward_varlen(do, q, k, v, out, lse, *args, causal=causal, deterministic=det)
            for _ in range(2)]
    cupy_dash.check_errors()
    return _same(*runs) or not det


def _pieces(rng, case) -> bool:
    from cupy_dash import schedule
    from cupy_dash.core import api
    from cupy_dash.cuda import kernels
    from cupy_dash.schedule import pieces
    B, H, Sq, Sk, D, ctas, num_pieces, det = case
    causal = num_pieces == 0
    q, do = _randn(rng, (B, Sq, H, D)), _randn(rng, (B, Sq, H, D))
    k, v = _randn(rng, (B, Sk, H, D)), _randn(rng, (B, Sk, H, D))
    out, lse = cupy_dash.attention_forward(q, k, v, causal=causal)
    tile = kernels.bwd_tile(D, causal)
    base = schedule.build("symmetric_shift" if causal else "shift", seqlen_q=Sq, seqlen_k=Sk, block_m=tile.block_m,
                          block_n=tile.block_n, num_heads=B * H, causal=causal, num_sms=ctas)
    plan = pieces.trim_tail(base) if causal else pieces.split_tail(base, num_pieces)
    assert plan.pieces is not None, "the case must split a column"
    runs = [api._backward_with_plan(do, q, k, v, out, lse, plan=plan, causal=causal, deterministic=det)
            for _ in range(2)]
    cupy_dash.check_errors()
    return _same(*runs) or not det


def main() -> int:
    rng = np.random.default_rng(0)
    capped_only = "--softcap-only" in sys.argv[1:]
    pieces_only = "--pieces-only" in sys.argv[1:]
    bad = 0
    for case in () if capped_only else PIECES:
        ok = _pieces(rng, case)
        bad += not ok
        print(f"pieces {case}: {'OK' if ok else 'DIFFERENT BITS'}", flush=True)
    if pieces_only:
        return 1 if bad else 0
    for case in (c for c in CASES if c[-1] or not capped_only):
        ok = _fixed(rng, case)
        bad += not ok
        print(f"fixed {case}: {'OK' if ok else 'DIFFERENT BITS'}", flush=True)
    for case in () if capped_only else VARLEN:
        ok = _varlen(rng, case)
        bad += not ok
        print(f"varlen {case}: {'OK' if ok else 'DIFFERENT BITS'}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
