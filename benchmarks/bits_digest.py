"""SHA-256 of the backward's dq, dk, dv bits on fixed random inputs, per case, as JSON (``--forward``: of the
forward's out and lse, on bench-sized cases): run it under two kernel versions (benchmarks/with_kernels.py) and
compare the digests, to show that a kernel change kept the bits.

    python benchmarks/bits_digest.py --out new.json [--forward]
    python benchmarks/with_kernels.py .ab/kernels_src benchmarks/bits_digest.py --out old.json
    python benchmarks/bits_digest.py --compare new.json old.json
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys

import numpy as np

# (B, S, H, Hkv, D, causal, schedule): the backward's tile plans (64-, 80- and 128-query), GQA, both masks
CASES = [(2, 1000, 4, 4, 128, True, "auto"), (2, 777, 4, 2, 128, False, "shift"), (1, 4197, 2, 2, 128, False, "auto"),
         (2, 1500, 4, 4, 64, True, "symmetric_shift"), (1, 900, 4, 1, 64, False, "fa3"),
         (2, 1000, 4, 4, 128, True, "fa3")]
# (B, S, H, D, causal): the forward at the bench's head counts, both masks, head dims 64 and 128
FORWARD_CASES = [(4, 4096, 16, 128, True), (4, 3840, 16, 128, False), (2, 2000, 8, 64, True),
                 (1, 8192, 16, 128, True)]


def _sha256(*arrays) -> str:
    """SHA-256 of the arrays' bytes, one after another (device arrays copied to the host)."""
    import cupy
    h = hashlib.sha256()
    for a in arrays:
        h.update(cupy.asnumpy(a).tobytes())
    return h.hexdigest()


def forward_digests() -> dict:
    """{case: SHA-256 of out's and lse's bits} over FORWARD_CASES (fp16 inputs)."""
    import cupy
    import cupy_dash
    out = {}
    for B, S, H, D, causal in FORWARD_CASES:
        rng = np.random.default_rng(S + D)
        q, k, v = (cupy.asarray(rng.standard_normal((B, S, H, D), np.float32)).astype(cupy.float16) for _ in range(3))
        o, lse = cupy_dash.attention_forward(q, k, v, causal=causal)
        cupy_dash.check_errors()
        out[f"B{B}-S{S}-H{H}-d{D}-{'causal' if causal else 'full'}"] = _sha256(o, lse)
    return out


def digests() -> dict:
    """{case: SHA-256 of dq's, dk's and dv's bits} over CASES (fp16 inputs)."""
    import cupy
    import cupy_dash
    out = {}
    for B, S, H, Hkv, D, causal, schedule in CASES:
        rng = np.random.default_rng(S * 7 + D)
        mk = lambda n: cupy.asarray(rng.standard_normal((B, S, n, D), np.float32)).astype(cupy.float16)  # noqa: E731
        q, k, v, do = mk(H), mk(Hkv), mk(Hkv), mk(H)
        out_, lse = cupy_dash.attention_forward(q, k, v, causal=causal)
        grads = cupy_dash.attention_backward(do, q, k, v, out_, lse, causal=causal, schedule=schedule)
        cupy_dash.check_errors()
        out[f"B{B}-S{S}-H{H}-Hkv{Hkv}-d{D}-{'causal' if causal else 'full'}-{schedule}"] = _sha256(*grads)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"))
    ap.add_argument("--forward", action="store_true", help="the forward's out and lse instead")
    args = ap.parse_args(argv)
    if args.compare:
        a, b = (json.load(open(p)) for p in args.compare)
        diff = sorted(k for k in a if a[k] != b.get(k))
        print("same bits in every case" if not diff else "different bits: " + ", ".join(diff))
        return 1 if diff else 0
    d = forward_digests() if args.forward else digests()
    print(json.dumps(d, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(d, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
