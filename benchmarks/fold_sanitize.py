"""A few small folded backwards, for compute-sanitizer (memcheck, synccheck): several Q tiles per CTA in each
pass, GQA, rows without keys, deterministic and atomic, each compared with the unfolded backward (bit for bit
when deterministic). Exits 1 on a difference.

    compute-sanitizer --tool synccheck python benchmarks/fold_sanitize.py
"""
from __future__ import annotations

import os
import sys

import numpy as np

import cupy
import cupy_dash
from cupy_dash.cuda import launchers

CASES = [  # B, H, Hkv, Sq, Sk, D, causal, deterministic
    (1, 2, 2, 300, 300, 128, True, True), (1, 2, 1, 200, 333, 64, False, True), (2, 1, 1, 129, 64, 64, True, False)]


def main() -> int:
    rng = np.random.default_rng(0)
    bad = 0
    for B, H, Hkv, Sq, Sk, D, causal, det in CASES:
        q, do = (cupy.asarray(rng.standard_normal((B, Sq, H, D), dtype=np.float32)).astype(cupy.float16)
                 for _ in range(2))
        k, v = (cupy.asarray(rng.standard_normal((B, Sk, Hkv, D), dtype=np.float32)).astype(cupy.float16)
                for _ in range(2))
        out, lse = cupy_dash.attention_forward(q, k, v, causal=causal)
        grads = {}
        for fold in ("0", "1"):
            os.environ[launchers.FOLD_ENV] = fold
            grads[fold] = [x.get() for x in cupy_dash.attention_backward(do, q, k, v, out, lse, causal=causal,
                                                                            deterministic=det)]
            cupy_dash.check_errors()
        same = all(np.array_equal(a.view(np.int16), b.view(np.int16)) for a, b in zip(grads["0"], grads["1"]))
        close = all(np.allclose(a, b, atol=1e-2) for a, b in zip(grads["0"], grads["1"]))
        ok = same if det else close
        bad += not ok
        print(f"B={B} H={H} Hkv={Hkv} Sq={Sq} Sk={Sk} D={D} causal={causal} deterministic={det}: "
              f"{'OK' if ok else 'DIFFERENT'}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
