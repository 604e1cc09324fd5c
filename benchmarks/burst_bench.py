"""Ours against FA3 below the power limit and at it, in one process: how much of the steady ratio is cycles, how
much the clock each kernel gets at the limit.

A burst is ``--burst-s`` seconds of back-to-back calls (two in flight, steady_bench.pipelined_loop) after
``--cool-s`` idle seconds: the GPU starts it below the power limit, at the highest clock the load gets (the first
~50-70 ms of load: docs/decisions/bwd-engine.md, "The clock under load"; ~1.79 GHz on round 37's H100 by
clock_check.py's cold probe), so a burst's time per call is the call's cycles over one clock, the same for every
implementation. A steady loop (``--loop-s``, right after
the previous one, as steady_bench.py) runs at the limit, where the clock depends on the kernel's power. Per round
(order rotated as steady_bench.rotated_orders) every implementation's burst, then every implementation's loop.
Reported per shape: median ms of bursts and loops, and per round the ratio other / ours deterministic of each.
``burst`` ratio ~ the cycle ratio; ``steady`` / ``burst`` is what the power limit adds to it.

    python benchmarks/burst_bench.py --shapes full:3840 causal:8192 --json burst.json
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import steady_bench as sb  # noqa: E402


def ratios(runs: dict, ours: str = "dash_det") -> dict:
    """{other: {"burst": median over rounds of other ms / ours ms in its burst, "steady": the same of the loops,
    "limit_share": steady / burst}}. runs: {name: {"burst": [ms per round], "steady": [ms per round]}}."""
    med = statistics.median
    out = {}
    for name, r in runs.items():
        if name == ours:
            continue
        burst = med(o / d for o, d in zip(r["burst"], runs[ours]["burst"]))
        steady = med(o / d for o, d in zip(r["steady"], runs[ours]["steady"]))
        out[name] = dict(burst=burst, steady=steady, limit_share=steady / burst)
    return out


def run_shape(shape, opts, fa3):
    impls = sb.implementations(shape, fa3)
    impls = {n: impls[n] for n in opts.impls if n in impls}
    ref = impls["dash_det"][2]()
    for name, (_, _, result) in impls.items():     # compiles, warms up, and leaves out a peer that disagrees
        if name != "dash_det" and sb.agreement(ref, result()) > opts.tolerance:
            print(f"{shape['name']}: {name} disagrees with ours, left out", file=sys.stderr)
            impls.pop(name)
    runs = {n: dict(burst=[], steady=[], burst_calls=[]) for n in impls}
    # NOTES: the bursts of a round first, each after its own idle time, then the loops back to back: a loop right
    # after a burst would start below the limit.
    for order in sb.rotated_orders(list(impls), opts.rounds):
        for name in order:
            call, done, _ = impls[name]
            time.sleep(opts.cool_s)
            ms, n, _, _ = sb.pipelined_loop(call, done, opts.burst_s, warm_s=0.005)
            runs[name]["burst"].append(ms)
            runs[name]["burst_calls"].append(n)
        for name in order:
            call, done, _ = impls[name]
            runs[name]["steady"].append(sb.pipelined_loop(call, done, opts.loop_s)[0])
    med = statistics.median
    summary = {n: dict(burst_ms=med(r["burst"]), steady_ms=med(r["steady"])) for n, r in runs.items()}
    return dict(shape=shape, runs=runs, summary=summary, ratios=ratios(runs))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", nargs="+", default=["full:3840", "full:15360", "causal:8192", "causal:16384"])
    ap.add_argument("--impls", nargs="+", default=["dash_det", "dash_atomic", "fa3_nondet"])
    ap.add_argument("--hdim", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--cool-s", type=float, default=0.8)
    ap.add_argument("--burst-s", type=float, default=0.03)
    ap.add_argument("--loop-s", type=float, default=0.3)
    ap.add_argument("--tolerance", type=float, default=0.05)
    ap.add_argument("--json", default=None)
    opts = ap.parse_args()
    import cupy

    import measure
    fa3 = None
    if "fa3_nondet" in opts.impls:
        try:
            from bench_peers import Fa3Peer
            fa3 = Fa3Peer()
        except ImportError as exc:
            print(f"FA3 left out: {exc}", file=sys.stderr)
    reports = []
    for spec in opts.shapes:
        rep = run_shape(sb.parse_shape(spec, 2048, opts.hdim), opts, fa3)
        reports.append(rep)
        text = "  ".join(f"{n} burst {r['burst']:.3f} steady {r['steady']:.3f} (x{r['limit_share']:.3f})"
                         for n, r in rep["ratios"].items())
        print(f"{spec:14s} ours det {rep['summary']['dash_det']['burst_ms']:.3f} / "
              f"{rep['summary']['dash_det']['steady_ms']:.3f} ms  other/ours: {text}", flush=True)
    if opts.json:
        gpu = sb._text(cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"])
        measure.write_rows(opts.json, reports, gpu)


if __name__ == "__main__":
    main()
