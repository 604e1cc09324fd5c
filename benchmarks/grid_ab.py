"""Persistent CTAs against one CTA per KV tile, for the atomic backward (bwd-engine.md, "What to try next"): the
same kernel driven by schedule tables with as many CTAs as SMs allow (ours) or with one CTA per KV column, which the
hardware then schedules as FA3's grid is (causal: shortest or longest columns first). Atomic only: a deterministic
table with more CTAs than fit at once can wait on a rank whose CTA is not resident.

    python benchmarks/grid_ab.py --json grid_ab.json

Every leg goes through ``api._backward_with_plan`` (the 64-query tile at every shape), whose table upload this
script makes once per leg (:func:`uploaded_once`: that hook uploads in every call, and at 1920 columns the host
work of a 460k-visit table would be timed with the kernel); TFLOP/s as bench.py (2.5 x the forward's FLOPs,
halved for causal). Needs a Hopper GPU.
"""
import argparse
import contextlib
import functools
import json
import time
import types

import cupy
import numpy as np

import cupy_dash
from cupy_dash import schedule
from cupy_dash.cli.measure import random_tensor
from cupy_dash.core import api
from cupy_dash.cuda import device_tables, kernels

# beside this script (its folder is first on sys.path when it runs as `python benchmarks/grid_ab.py`)
from measure import CupyEvents, time_calls


def reorder(plan, order) -> types.SimpleNamespace:
    """The plan with its CTAs (one KV column each) in ``order`` (CTA indices): visits renumbered by CTA."""
    cs = np.asarray(plan.cta_start)
    visits, rank = np.asarray(plan.visits), np.asarray(plan.rank)
    rows = np.concatenate([np.arange(cs[c], cs[c + 1]) for c in order])
    lens = np.diff(cs)[order]
    new = visits[rows].copy()
    new[:, 0] = np.repeat(np.arange(len(order), dtype=np.int32), lens)
    return types.SimpleNamespace(visits=new, rank=rank[rows].copy(), num_ctas=len(order), policy=plan.policy,
                                 cta_start=np.concatenate([[0], np.cumsum(lens)]).astype(np.int64))


def legs(S, causal, H, max_ctas, bm, bn):
    """name -> plan-like: persistent (the shift policy on the co-resident CTAs) and one CTA per KV column."""
    common = dict(seqlen_q=S, seqlen_k=S, block_m=bm, block_n=bn, num_heads=H, causal=causal)
    columns = H * -(-S // bn)
    per_column = schedule.build("descending", num_sms=columns, **common)
    lens = np.diff(np.asarray(per_column.cta_start))
    out = {"persistent (shift)": schedule.build("shift", num_sms=max_ctas, **common),
           "per column, head-major": per_column,
           "per column, longest first": reorder(per_column, np.argsort(-lens, kind="stable"))}
    if causal:
        out["per column, shortest first"] = reorder(per_column, np.argsort(lens, kind="stable"))
    return out


@contextlib.contextmanager
def uploaded_once():
    """``device_tables.upload`` memoized per plan object (tables are read-only to the kernel) while inside."""
    real, done = device_tables.upload, {}

    def upload(plan, *args, **kwargs):
        if id(plan) not in done:
            done[id(plan)] = (plan, real(plan, *args, **kwargs))       # the plan is kept so that its id stays unique
        return done[id(plan)][1]
    device_tables.upload = upload
    try:
        yield
    finally:
        device_tables.upload = real


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["full:3840", "full:15360", "causal:8192", "causal:16384"],
                    help="mask:seqlen, head dim 128, 16k tokens (full 15360), H * D = 2048")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--warmup-s", type=float, default=0.5)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    dev = cupy.cuda.Device().id
    results = []
    for shape in args.shapes:
        mask, S = shape.split(":")
        S, causal = int(S), mask == "causal"
        tokens = 15360 if S in (1280, 3840, 15360) else 16384
        B, H, D = tokens // S, 16, 128
        q, k, v, do = (random_tensor((B, S, H, D), "bf16", seed=i) for i in range(4))
        out, lse = cupy_dash.attention_forward(q, k, v, causal=causal)
        _, bm, bn, max_ctas = kernels.bwd_entry(dev, "bfloat16", D, causal)   # the plan hook's tile
        flops = 2.5 * 4 * B * H * S * S * D * (0.5 if causal else 1.0)
        for name, plan in legs(S, causal, B * H, max_ctas, bm, bn).items():
            call = functools.partial(api._backward_with_plan, do, q, k, v, out, lse, plan=plan, causal=causal,
                                     deterministic=False)
            with uploaded_once():
                ms = float(np.median(time_calls([call], warmup=1, repeats=args.calls, events=CupyEvents(),
                                                warmup_s=args.warmup_s)))
            cupy_dash.check_errors()
            results.append(dict(shape=shape, leg=name, ctas=int(plan.num_ctas), ms=ms, tflops=flops / ms / 1e9))
            print(f"{shape:14s} {name:28s} CTAs {plan.num_ctas:5d}  {ms:7.3f} ms  {flops / ms / 1e9:6.1f} TFLOP/s",
                  flush=True)
        cupy.get_default_memory_pool().free_all_blocks()
    if args.json:
        meta = dict(date=time.strftime("%Y-%m-%dT%H:%M:%S"), command="python benchmarks/grid_ab.py "
                    + " ".join(argv if argv is not None else __import__("sys").argv[1:]),
                    gpu=cupy.cuda.runtime.getDeviceProperties(dev)["name"].decode())
        with open(args.json, "w") as f:
            json.dump(dict(meta=meta, results=results), f, indent=1)


if __name__ == "__main__":
    main()
