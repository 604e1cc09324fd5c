"""Where backward time goes: GPU time of each of the three backward kernels (preprocess, main, postprocess), per
schedule, on the benchmark shapes (bf16, 16k tokens, H*D = 2048). Every launch is bracketed by CUDA events (by
wrapping cupy_dash.cuda.launchers.enqueue_backward, the backward's launcher, so that it runs its launch plan one
kernel at a time), median of `--repeats` calls. A backward folded into one launch (launchers.fold_wanted: small
problems) shows its whole time as "main".

    python benchmarks/profile_bwd.py --seqlens 1024 4096 16384 --hdims 128 64
"""
import argparse
import statistics

import cupy

import cupy_dash
from cupy_dash.core import interop
from cupy_dash.cuda import launchers
from cupy_dash.cli.measure import attention_flops, random_tensor


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqlens", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--hdims", type=int, nargs="+", default=[128, 64])
    ap.add_argument("--schedules", nargs="+", default=["fa3", "shift", "symmetric_shift", "atomic"])
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()

    spans = []                                  # (kernel name, start event, end event) of the calls being timed
    # the kernels of a plan: three; one folded
    names = {3: ("bwd_preprocess", "bwd_main", "bwd_postprocess"), 1: ("bwd_main",)}

    def timed_sequence(c, stream, buffers, *, slot=None, call=None):
        parts = c.plan.parts
        stream = interop.external_stream(stream.ptr, cupy.cuda.Device().id)
        for i, (name, one) in enumerate(zip(names[len(parts.kernels)], parts.kernels)):
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record(stream)
            parts._replace(kernels=(one,), zeros=parts.zeros if i == 0 else ()).plan().run(stream.ptr, buffers)
            end.record(stream)
            spans.append((name, start, end))
        if slot is not None:
            launchers._track(slot, call)

    launchers.enqueue_backward = timed_sequence
    print(f"{'shape':<22} {'schedule':<16} {'pre ms':>8} {'main ms':>8} {'post ms':>8} {'total':>8} "
          f"{'main TFLOP/s':>12} {'all TFLOP/s':>11}")
    for hdim in args.hdims:
        for causal in (False, True):
            for S in args.seqlens:
                B, H = 16384 // S, 2048 // hdim
                q, k, v, do = (random_tensor((B, S, H, hdim), "bf16", seed=i) for i in range(4))
                out, lse = cupy_dash.attention_forward(q, k, v, causal=causal)
                flops = attention_flops(B, H, S, S, hdim, causal, "bwd")
                for sched in args.schedules:
                    kw = dict(schedule="auto", deterministic=False) if sched == "atomic" else dict(schedule=sched)
                    for _ in range(3):
                        cupy_dash.attention_backward(do, q, k, v, out, lse, causal=causal, **kw)
                    cupy.cuda.Device().synchronize()
                    spans.clear()
                    for _ in range(args.repeats):
                        cupy_dash.attention_backward(do, q, k, v, out, lse, causal=causal, **kw)
                    cupy.cuda.Device().synchronize()
                    cupy_dash.check_errors()
                    ms = {}
                    for name, s, e in spans:
                        ms.setdefault(name, []).append(cupy.cuda.get_elapsed_time(s, e))
                    med = dict.fromkeys(("bwd_preprocess", "bwd_postprocess"), 0.0)
                    med.update((n, statistics.median(t)) for n, t in ms.items())
                    total = sum(med.values())
                    shape = f"d{hdim} {'causal' if causal else 'full'} S={S}"
                    print(f"{shape:<22} {sched:<16} {med['bwd_preprocess']:8.3f} {med['bwd_main']:8.3f} "
                          f"{med['bwd_postprocess']:8.3f} {total:8.3f} {flops / med['bwd_main'] / 1e9:12.0f} "
                          f"{flops / total / 1e9:11.0f}", flush=True)
                del q, k, v, do, out, lse
                cupy.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
