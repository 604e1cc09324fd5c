"""Data-parallel training of the tiny causal GQA transformer of examples/train_tiny_transformer_jax.py over every
local GPU from one process: a mesh over the GPUs, a ``jax.jit`` train step whose batch is sharded
(``NamedSharding``) and whose parameters and optimizer state are replicated, cupy_dash attention under
``jax.shard_map`` (each GPU attends its own rows). Twice from one seed: every loss and the final weights are
bitwise equal between the two runs, and every GPU's replica of the weights is bitwise equal to the others.

    python examples/train_jax_dp.py --steps 30 --json jax_dp.json      # all local GPUs (one works too)

XLA inserts the gradient all-reduce over the mesh (NCCL between GPUs); its addition order is fixed for a given
number of GPUs, so runs repeat bit for bit; another number of GPUs gives other bits.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
# NOTES: NVLink multicast stays off (the GPU machines this project runs on require it; XLA's collectives use NCCL)
os.environ.update({"NCCL_NVLS_ENABLE": "0", "NVSHMEM_DISABLE_NVLS": "1"})

if __name__ == "__main__":             # before jax is imported: one line, not a traceback, where anything is missing
    from preflight import require_jax
    require_jax()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

from train_tiny_transformer_jax import BATCH, batches, init_params, make_step  # noqa: E402


def sharded_attention(mesh):
    """cupy_dash attention on q ``(B, S, H, D)``, k / v ``(B, S, Hkv, D)`` sharded on B over ``mesh``: each GPU
    calls it on its own rows (a custom call has no partitioning rule of its own, so shard_map says how)."""
    import cupy_dash

    def attention(q, k, v):
        return cupy_dash.jax.attention(q, k, v, causal=True)
    return jax.shard_map(attention, mesh=mesh, in_specs=P("data"), out_specs=P("data"))


def train(mesh, steps, seed):
    """One run: (every step's loss, sha256 of the final weights, whether every GPU's replica is the same)."""
    import cupy_dash
    replicated, rows = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    params = jax.device_put(init_params(seed), replicated)
    opt = jax.device_put(dict(m=jax.tree.map(jnp.zeros_like, params), v=jax.tree.map(jnp.zeros_like, params)),
                         replicated)
    step = make_step(sharded_attention(mesh), in_shardings=(replicated, replicated, rows, replicated),
                     out_shardings=(replicated, replicated, replicated))
    losses = []
    for i, tokens in enumerate(batches(steps)):
        params, opt, loss = step(params, opt, jax.device_put(tokens, rows), jnp.float32(i + 1))
        losses.append(loss)
    losses = [float(x) for x in jax.device_get(losses)]
    cupy_dash.check_errors()
    digest, same = hashlib.sha256(), True
    for leaf in jax.tree.leaves(params):
        shards = [np.asarray(s.data).tobytes() for s in leaf.addressable_shards]
        same = same and len(shards) == len(mesh.devices.flat) and len(set(shards)) == 1
        digest.update(shards[0])
    return losses, digest.hexdigest(), same


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write losses, digests and verdicts here")
    args = ap.parse_args(argv)
    gpus = jax.devices("gpu")
    if BATCH % len(gpus):
        raise SystemExit(f"the global batch of {BATCH} rows does not split over {len(gpus)} GPUs")
    mesh = Mesh(np.array(gpus), ("data",))
    runs = [train(mesh, args.steps, args.seed) for _ in range(2)]
    (l1, w1, r1), (l2, w2, r2) = runs
    differ = sum(a != b for a, b in zip(l1, l2))
    same_runs, same_replicas = differ == 0 and w1 == w2, r1 and r2
    print(f"jax data parallel: {len(gpus)} GPU(s) ({gpus[0].device_kind}), {args.steps} steps, final loss "
          f"{l1[-1]:.4f} (first {l1[0]:.4f})", flush=True)
    print(f"jax data parallel: runs 1 and 2 identical: {same_runs} ({differ} of {args.steps} losses differ, "
          f"weights {w1[:16]} / {w2[:16]}); every GPU's replica identical: {same_replicas}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(example="jax_dp", devices=len(gpus), steps=args.steps, jax=jax.__version__,
                           runs_identical=same_runs, replicas_identical=same_replicas,
                           runs=[dict(losses=l, weights_sha256=w) for l, w, _ in runs]), f)
    return 0 if same_runs and same_replicas else 1


if __name__ == "__main__":
    raise SystemExit(main())
