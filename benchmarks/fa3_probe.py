"""Step-by-step check that the FlashAttention-3 peer of the benchmark (benchmarks/bench_peers.py, through the
flash-attn3-jax wheel) works on this machine: each step prints before and after, so a hang shows where.

    XLA_PYTHON_CLIENT_PREALLOCATE=false python benchmarks/fa3_probe.py [--full] [--seqlen S] [--batch B]
"""
import argparse
import os
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def step(name, fn):
    print(f"[{time.strftime('%H:%M:%S')}] {name} ...", flush=True)
    t = time.perf_counter()
    out = fn()
    print(f"[{time.strftime('%H:%M:%S')}] {name}: ok ({time.perf_counter() - t:.2f} s)", flush=True)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="full mask (default causal)")
    ap.add_argument("--seqlen", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=4)
    args = ap.parse_args()
    causal = not args.full
    import jax
    import jax.numpy as jnp

    import cupy
    import cupy_dash
    from cupy_dash.cli.measure import random_tensor
    from bench_peers import Fa3Peer, same_bits

    B, S, H, D = args.batch, args.seqlen, 16, 128
    print(f"B={B} S={S} H={H} D={D} causal={causal}", flush=True)
    peer = step("import flash_attn3_jax, JAX devices", Fa3Peer)
    import flash_attn3_jax
    key = jax.random.PRNGKey(0)
    q, k, v = (jax.random.normal(jax.random.fold_in(key, i), (B, S, H, D), jnp.bfloat16) for i in range(3))
    fwd = jax.jit(lambda q, k, v: flash_attn3_jax.flash_mha(q, k, v, is_causal=causal))
    step("FA3 public forward (JAX inputs)", lambda: jax.block_until_ready(fwd(q, k, v)))
    grad = jax.jit(jax.grad(lambda q, k, v: flash_attn3_jax.flash_mha(q, k, v, is_causal=causal).astype(
        jnp.float32).sum(), argnums=(0, 1, 2)))
    step("FA3 public backward (non-deterministic)", lambda: jax.block_until_ready(grad(q, k, v)))

    cq, ck, cv, cdo = (random_tensor((B, S, H, D), "bf16", seed=i) for i in range(4))
    out, lse = cupy_dash.attention_forward(cq, ck, cv, causal=causal)
    cupy.cuda.Device().synchronize()
    js = step("DLPack CuPy -> JAX", lambda: tuple(jax.dlpack.from_dlpack(x) for x in (cdo, cq, ck, cv, out, lse)))
    for det in (False, True):
        fn = peer._bwd_fn(causal, det)
        r1 = step(f"FA3 backward FFI, deterministic={det}", lambda: jax.block_until_ready(fn(*js)))
        r2 = step("again", lambda: jax.block_until_ready(fn(*js)))
        print(f"  identical bits on the second call: {same_bits(r1, r2)}", flush=True)
        ours = cupy_dash.attention_backward(cdo, cq, ck, cv, out, lse, causal=causal)
        for name, a, b in zip(("dq", "dk", "dv"), r1, ours):
            a = cupy.from_dlpack(a).astype(cupy.float32)
            b = b.astype(cupy.float32)
            rel = float(cupy.abs(a - b).max() / cupy.abs(b).max())
            print(f"  {name}: max |FA3 - cupy_dash| / max |cupy_dash| = {rel:.2e}", flush=True)


if __name__ == "__main__":
    main()
