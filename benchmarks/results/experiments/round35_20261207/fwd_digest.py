"""SHA-256 of the forward's out and lse bits on fixed random inputs (fp16; head dims 64 / 128; causal and full), as
JSON, to compare two kernel versions (run one under benchmarks/with_kernels.py):

    python fwd_digest.py --out tree.json; python benchmarks/with_kernels.py <src> fwd_digest.py --out leg.json
"""
import argparse
import hashlib
import json

import cupy
import numpy as np

import cupy_dash

CASES = [(4, 4096, 16, 128, True), (4, 3840, 16, 128, False), (2, 2000, 8, 64, True), (1, 8192, 16, 128, True)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    out = {}
    for B, S, H, D, causal in CASES:
        rng = np.random.default_rng(S + D)
        q, k, v = (cupy.asarray(rng.standard_normal((B, S, H, D), np.float32)).astype(cupy.float16) for _ in range(3))
        o, lse = cupy_dash.attention_forward(q, k, v, causal=causal)
        cupy.cuda.Device().synchronize()
        key = f"B{B}-S{S}-H{H}-d{D}-{'causal' if causal else 'full'}"
        out[key] = hashlib.sha256(o.get().tobytes() + lse.get().tobytes()).hexdigest()
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
