"""The ``fa3`` policy's dispatch in L2-sized head sections (``schedule.build(..., head_section=h)``), against its
dispatch over every head at once (``--sections 0``): same reduction order (so the same bits), fewer heads' Q, dO
and dQ accumulators in flight at a time (docs/schedules.md, "L2 sections"; the backward itself takes
``schedule.l2_head_section``). The tables go through the backward's explicit-plan hook, each timed with CUDA events
(median of ``--repeats`` calls, the legs interleaved ``--rounds`` times; the hook uploads its tables in every call),
deterministic and atomic, beside the ``symmetric_shift`` and ``shift`` tables of the same tile and the public call's
``fa3`` and ``symmetric_shift`` (cached tables; its tile is the hook's when ``CUPY_DASH_BWD_CAUSAL_BLOCK_M`` forces
it); the bits of every ``fa3`` leg are compared.

    python benchmarks/l2_sections.py --hdim 192 --heads 8 --seqlen 4096 --batch 4 --causal --sections 0 1 2 4 8
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import statistics


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hdim", type=int, default=192)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seqlen", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--sections", type=int, nargs="+", default=[0, 1, 2, 4, 8])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    import cupy

    import cupy_dash
    from cupy_dash import schedule
    from cupy_dash.cli.measure import random_tensor
    from cupy_dash.core.api import _backward_with_plan
    from cupy_dash.cuda import kernels

    B, S, H, D = args.batch, args.seqlen, args.heads, args.hdim
    tile = kernels.bwd_tile(D, args.causal, seqlen_q=0)   # the explicit-plan hook's tile
    num_sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    common = dict(seqlen_q=S, seqlen_k=S, block_m=tile.block_m, block_n=tile.block_n, num_heads=B * H,
                  causal=args.causal, num_sms=num_sms)
    plans = {f"fa3, sections of {h or B * H} heads": schedule.build("fa3", head_section=h, **common).validate()
             for h in args.sections}
    for policy in ("symmetric_shift", "shift"):
        plans[policy] = schedule.build(policy, **common)
    api_legs = ("fa3", "symmetric_shift")   # the public call, cached tables: what the hook's per-call upload adds

    shape = (B, S, H, D)
    q, k, v, do = (random_tensor(shape, "bf16", seed=i) for i in range(4))
    out, lse = cupy_dash.attention_forward(q, k, v, causal=args.causal)
    flops = 4 * B * H * S * S * D * 2.5 * (0.5 if args.causal else 1.0)
    times = {(name, det): [] for name in plans for det in (True, False)}
    times.update({(f"api {policy}", True): [] for policy in api_legs})
    digests = {}
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    for _ in range(args.rounds):
        for name, plan in plans.items():
            for det in (True, False):
                def call():
                    return _backward_with_plan(do, q, k, v, out, lse, plan=plan, causal=args.causal,
                                               deterministic=det)
                for _ in range(2):
                    grads = call()
                for _ in range(args.repeats):
                    start.record()
                    grads = call()
                    end.record()
                    end.synchronize()
                    times[(name, det)].append(cupy.cuda.get_elapsed_time(start, end))
                if det:
                    digests[name] = [hashlib.sha256(cupy.asnumpy(g).tobytes()).hexdigest() for g in grads]
        for policy in api_legs:
            for i in range(args.repeats + 2):
                start.record()
                grads = cupy_dash.attention_backward(do, q, k, v, out, lse, causal=args.causal, schedule=policy)
                end.record()
                end.synchronize()
                if i >= 2:
                    times[(f"api {policy}", True)].append(cupy.cuda.get_elapsed_time(start, end))
            if policy == "fa3":
                digests["api fa3"] = [hashlib.sha256(cupy.asnumpy(g).tobytes()).hexdigest() for g in grads]
    cupy_dash.check_errors()
    ref = next(d for n, d in digests.items() if n.startswith("fa3"))
    rows = []
    print(f"B={B} S={S} H={H} D={D} causal={args.causal} tile {tile.block_m}x{tile.block_n}, {num_sms} SMs; "
          f"ms (median of {args.repeats * args.rounds}), TFLOP/s")
    for name in plans:
        det, atomic = (statistics.median(times[(name, d)]) for d in (True, False))
        same = digests[name] == ref if name.startswith("fa3") else None
        rows.append(dict(table=name, det_ms=det, atomic_ms=atomic, det_tflops=flops / det / 1e9,
                         atomic_tflops=flops / atomic / 1e9, bits_as_fa3=same))
        print(f"  {name:32s} det {det:7.3f} ms {flops / det / 1e9:6.1f}   atomic {atomic:7.3f} ms "
              f"{flops / atomic / 1e9:6.1f}   bits as fa3: {same}")
    for policy in api_legs:
        det = statistics.median(times[(f"api {policy}", True)])
        same = digests["api fa3"] == ref if policy == "fa3" else None
        rows.append(dict(table=f"api {policy}", det_ms=det, det_tflops=flops / det / 1e9, bits_as_fa3=same))
        print(f"  {'api ' + policy + ' (cached tables)':32s} det {det:7.3f} ms {flops / det / 1e9:6.1f}"
              f"{'':28s}bits as fa3: {same}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(date=datetime.datetime.now().isoformat(timespec="seconds"), args=vars(args),
                           shape=dict(batch=B, seqlen=S, heads=H, hdim=D, causal=args.causal,
                                      block_m=tile.block_m, block_n=tile.block_n), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
