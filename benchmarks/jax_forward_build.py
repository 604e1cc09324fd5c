"""The causal forward under ``jax.jit`` beside the functional API's, per build: whether a traced forward runs as fast
as ``cupy_dash.attention_forward`` on the same inputs (docs/decisions/fwd-launch-order.md, "The persistent forward").

Legs, in interleaved loops of back-to-back calls (steady_bench.pipelined_loop) with the order rotated every round:
``api`` (the functional API on CuPy arrays: the persistent build for causal masks), ``jit`` (``jax.jit`` of
``cupy_dash.jax.attention_forward``, traced once, the build :class:`cupy_dash.jax.callbacks._Forward` picks) and,
with ``--grid``, ``jit_grid`` (the same traced with ``kernels.FWD_PERSISTENT`` emptied: the grid build, one CTA per
tile). The outputs of every leg are compared bitwise with the functional API's (the builds give the same bits).

    python benchmarks/jax_forward_build.py --hdim 64 --shapes causal:1024 causal:4096 causal:16384 --grid \\
        --json jax_fwd.json
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from steady_bench import Smi, parse_shape, pipelined_loop  # noqa: E402  (beside this script)


def legs_of(shape, grid):
    """{leg: (call, done)} and each leg's (out, lse) for one seeded input set (16k tokens as the bench)."""
    import cupy
    import jax
    import numpy as np

    import cupy_dash
    import cupy_dash.jax as cj
    from cupy_dash.cuda import kernels
    B, S, H, D, causal = shape["batch"], shape["seqlen"], shape["heads"], shape["hdim"], shape["causal"]
    rng = np.random.default_rng(S + D)
    qj, kj, vj = (jax.device_put(rng.standard_normal((B, S, H, D), np.float32).astype(jax.numpy.bfloat16))
                  for _ in range(3))
    legs, results = {}, {}
    # NOTES: the functional API on CuPy views of the same buffers (on JAX arrays each call would pay DLPack's
    # conversions both ways, host-bound below 4k); an event per call keeps two calls in flight as JAX's legs do.
    qc, kc, vc = (cupy.from_dlpack(x) for x in (qj, kj, vj))

    def api_call():
        out = cupy_dash.attention_forward(qc, kc, vc, causal=causal)
        event = cupy.cuda.Event(disable_timing=True)
        event.record()
        return out, event

    def api_done(handle):
        handle[1].synchronize()
        return handle[0]

    legs["api"] = (api_call, api_done)
    jitted = jax.jit(lambda q, k, v: cj.attention_forward(q, k, v, causal=causal))
    legs["jit"] = (lambda: jitted(qj, kj, vj), jax.block_until_ready)
    jitted(qj, kj, vj)                                   # traced and prepared with today's choice
    if grid:
        from cupy_dash.jax import callbacks
        # NOTES: the prepared calls are keyed without the build: set the first aside (kept alive) to prepare anew
        kept, saved = dict(callbacks._prepared), kernels.FWD_PERSISTENT
        callbacks._prepared.clear()
        kernels.FWD_PERSISTENT = frozenset()
        try:
            jitted_grid = jax.jit(lambda q, k, v: cj.attention_forward(q, k, v, causal=causal))
            jitted_grid(qj, kj, vj)                      # traced and prepared without the persistent build
        finally:
            kernels.FWD_PERSISTENT = saved
        callbacks._prepared.update(kept)
        legs["jit_grid"] = (lambda: jitted_grid(qj, kj, vj), jax.block_until_ready)
    for leg, (call, done) in legs.items():
        out, lse = (cupy.asnumpy(x) if isinstance(x, cupy.ndarray) else np.asarray(x) for x in done(call()))
        results[leg] = (out.view(np.uint16), lse)
    return legs, results


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["causal:1024", "causal:4096", "causal:16384"])
    ap.add_argument("--hdim", type=int, default=128)
    ap.add_argument("--grid", action="store_true", help="also the grid build under jax.jit")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--loop-s", type=float, default=0.4)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    report = {"meta": {"date": _dt.datetime.now().isoformat(timespec="seconds"),
                       "command": "python benchmarks/jax_forward_build.py " + " ".join(argv or sys.argv[1:]),
                       "commit": os.environ.get("CUPY_DASH_COMMIT", "unset")}, "shapes": []}
    smi = Smi()
    try:
        for text in args.shapes:
            report["shapes"].append(run_shape(text, args, smi))
    finally:
        smi.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


def run_shape(text, args, smi) -> dict:
    """One shape's legs in interleaved loops; prints and returns its report (each loop with nvidia-smi's median SM
    clock over it)."""
    shape = parse_shape(text, 2048, args.hdim)
    legs, results = legs_of(shape, args.grid)
    same = {leg: bool((r[0] == results["api"][0]).all() and (r[1] == results["api"][1]).all())
            for leg, r in results.items()}
    names = list(legs)
    loops = {leg: [] for leg in names}
    for r in range(args.rounds):
        for leg in names[r % len(names):] + names[:r % len(names)]:
            ms, calls, wall0, wall1 = pipelined_loop(*legs[leg], args.loop_s)
            loops[leg].append({"round": r, "ms": ms, "calls": calls, "sm_mhz": smi.window(wall0, wall1)[0]})
    flops = 4 * shape["batch"] * shape["heads"] * shape["seqlen"] ** 2 * shape["hdim"] / (2 if shape["causal"] else 1)
    summary = {leg: round(flops / statistics.median(x["ms"] for x in loops[leg]) / 1e9, 1) for leg in names}
    print(text, f"d{args.hdim}", "TFLOP/s", summary, "same bits as api", same, flush=True)
    return {"shape": shape, "loops": loops, "tflops": summary, "same_bits": same}


if __name__ == "__main__":
    main()
