"""One backward (``--forward``: one forward) of cupy_dash or of FlashAttention-3 (flash-attn3-jax wheel) on one
shape, bracketed by cudaProfilerStart / Stop after warm-up calls, for Nsight Compute (`ncu --profile-from-start
off`): the profile of the two main kernels on the same inputs, side by side.

    ncu --profile-from-start off --clock-control none --set full -o ours \
        python benchmarks/ncu_bwd.py --impl ours --causal --seqlen 8192 --batch 2
    ncu ... python benchmarks/ncu_bwd.py --impl fa3 --causal --seqlen 8192 --batch 2

Shapes are (batch, seqlen, heads, head dim); bf16; q, k, v, dO random normal. `--impl fa3` calls the wheel's
backward FFI (bench_peers.Fa3Peer) non-deterministically unless --deterministic.
"""
import argparse
import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--impl", choices=("ours", "fa3"), required=True)
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--hdim", type=int, default=128)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--deterministic", action="store_true", help="FA3: its deterministic backward")
    ap.add_argument("--schedule", default="auto", help="ours: schedule, or 'atomic'")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--forward", action="store_true", help="the forward instead (FA3: its public flash_mha)")
    ap.add_argument("--softcap", type=float, default=0.0, help="ours: logit soft-capping (0: off)")
    args = ap.parse_args()

    import cupy

    import cupy_dash
    from cupy_dash.cli.measure import random_tensor

    shape = (args.batch, args.seqlen, args.heads, args.hdim)
    q, k, v, do = (random_tensor(shape, "bf16", seed=i) for i in range(4))
    if args.softcap and args.impl != "ours":
        ap.error("--softcap: ours only")
    cap = dict(softcap=args.softcap)
    out, lse = cupy_dash.attention_forward(q, k, v, causal=args.causal, **cap)
    cupy.cuda.Device().synchronize()

    if args.forward and args.impl == "ours":
        def call():
            return cupy_dash.attention_forward(q, k, v, causal=args.causal, **cap)

        def sync(_):
            cupy.cuda.Device().synchronize()
    elif args.forward:
        import jax
        from flash_attn3_jax import flash_mha
        fn = jax.jit(lambda q, k, v: flash_mha(q, k, v, is_causal=args.causal))
        js = tuple(jax.dlpack.from_dlpack(x) for x in (q, k, v))

        def call():
            return fn(*js)

        def sync(res):
            jax.block_until_ready(res)
    elif args.impl == "ours":
        det = args.schedule != "atomic"
        sched = args.schedule if det else "auto"

        def call():
            return cupy_dash.attention_backward(do, q, k, v, out, lse, causal=args.causal, schedule=sched,
                                                deterministic=det, **cap)

        def sync(_):
            cupy.cuda.Device().synchronize()
    else:
        import jax

        from bench_peers import Fa3Peer
        peer = Fa3Peer()
        fn = peer._bwd_fn(args.causal, args.deterministic)
        js = tuple(jax.dlpack.from_dlpack(x) for x in (do, q, k, v, out, lse))

        def call():
            return fn(*js)

        def sync(res):
            jax.block_until_ready(res)
    for _ in range(args.warmup):
        sync(call())
    cupy.cuda.runtime.profilerStart()
    sync(call())
    cupy.cuda.runtime.profilerStop()
    what = "forward" if args.forward else "backward"
    print(f"{args.impl}: one {what} profiled at {shape} causal={args.causal}", flush=True)


if __name__ == "__main__":
    main()
