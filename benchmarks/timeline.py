"""Per-visit timelines of the deterministic backward (debug build, kernels_src/bwd/timeline.cuh): where CTAs
compute and where they wait, per schedule, measured with %globaltimer on the GPU.

    python benchmarks/timeline.py --out timelines.npz --shapes 128:causal:4096 128:full:1024

For each shape (bf16, 16k tokens, H*D = 2048) and schedule it runs the backward once to warm up, then once with
stamps, and prints per-visit means (ns): compute (start -> dQ ready), dQ hand-off (dQ ready -> added and
released), the gap before the next visit of the same CTA, and the kernel span; then the MMA warpgroups' phases in
cycles and the share of cycles with no GEMM in flight (timeline_phases.py). The raw stamps, visits and ranks go
to the .npz.
"""
import argparse

import cupy
import numpy as np

import cupy_dash
from cupy_dash import schedule
from cupy_dash.core import api
from cupy_dash.cuda import kernels, launchers
from cupy_dash.cli.measure import random_tensor
from cupy_dash.cuda.params import CONSTANTS
from timeline_phases import format_report, format_switch_report, phase_report, switch_report


def stamped_backward(hdim, causal, S, policy, deterministic=True):
    """(call, plan, stamps) for the bench shape (bf16, 16k tokens, H * D = 2048): call() runs the timeline build's
    backward once on fixed random inputs with ``policy``'s table, writing its stamps into ``stamps`` (V,
    kTimelineCols) int64."""
    B, H = 16384 // S, 2048 // hdim
    q, k, v, do = (random_tensor((B, S, H, hdim), "bf16", seed=i) for i in range(4))
    out, lse = cupy_dash.attention_forward(q, k, v, causal=causal)
    dev = cupy.cuda.Device().id
    _, bm, bn, max_ctas = kernels.bwd_entry(dev, "bfloat16", hdim, causal, True)
    # NOTES: the head section the call's tables use (launchers.bwd_tables): without it `fa3` would run its
    # unsectioned order, which no call runs.
    plan = schedule.build(policy, seqlen_q=S, seqlen_k=S, block_m=bm, block_n=bn, num_heads=B * H, causal=causal,
                          num_sms=max_ctas, head_section=launchers.head_section(S, hdim, 1, None, dev))
    stamps = cupy.zeros((plan.num_visits, CONSTANTS.kTimelineCols), dtype=cupy.int64)

    def call():
        api._backward_with_plan(do, q, k, v, out, lse, plan=plan, causal=causal, deterministic=deterministic,
                                timeline=stamps)
    return call, plan, stamps


def run(hdim, causal, S, policy, deterministic=True):
    call, plan, stamps = stamped_backward(hdim, causal, S, policy, deterministic)
    for _ in range(2):                                # the first call compiles and warms up
        call()
    cupy.cuda.Device().synchronize()
    cupy_dash.check_errors()
    t = stamps.get()
    t[:, :4] -= t[:, 0].min()                        # the CTA stamps (ns); the warpgroups' are cycles
    visits, cta_start = np.asarray(plan.visits), np.asarray(plan.cta_start)
    compute = t[:, 1] - t[:, 0]
    handoff = t[:, 3] - t[:, 1]
    gaps = []
    for c in range(plan.num_ctas):
        a, b = int(cta_start[c]), int(cta_start[c + 1])
        gaps.append(t[a + 1:b, 0] - t[a:b - 1, 1])
    gaps = np.concatenate(gaps) if gaps else np.zeros(0)
    span = int(t[:, 3].max())
    mode = policy if deterministic else "atomic"
    print(f"d{hdim} {plan.block_m}x{plan.block_n} {'causal' if causal else 'full'} S={S} {mode:16s} "
          f"CTAs {plan.num_ctas:4d} visits {plan.num_visits:7d}  span {span / 1e3:8.1f} us  compute "
          f"{compute.mean():6.0f}  hand-off {handoff.mean():6.0f} (p90 {np.percentile(handoff, 90):6.0f})  gap "
          f"{gaps.mean():6.0f} (p90 {np.percentile(gaps, 90):6.0f})  CTA time per visit "
          f"{span * plan.num_ctas / plan.num_visits:6.0f}", flush=True)
    print(format_report(phase_report(t, cta_start, CONSTANTS.kBwdStages)), flush=True)
    print(format_switch_report(switch_report(t, visits, cta_start)), flush=True)
    return dict(stamps=t, visits=visits, rank=np.asarray(plan.rank), cta_start=cta_start)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=["128:causal:4096", "128:full:1024", "64:causal:16384"],
                    help="hdim:mask:seqlen")
    ap.add_argument("--policies", nargs="+", default=["fa3", "descending", "shift", "symmetric_shift"])
    ap.add_argument("--out", default="timelines.npz")
    args = ap.parse_args()
    saved = {}
    for shape in args.shapes:
        d, mask, S = shape.split(":")
        for policy in args.policies + ["atomic"]:
            det = policy != "atomic"
            res = run(int(d), mask == "causal", int(S), "shift" if not det else policy, det)
            for key, val in res.items():
                saved[f"{shape}:{policy}:{key}"] = val
            cupy.get_default_memory_pool().free_all_blocks()
    np.savez_compressed(args.out, **saved)


if __name__ == "__main__":
    main()
