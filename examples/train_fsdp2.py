"""Fully sharded data-parallel training (FSDP2, ``torch.distributed.fsdp.fully_shard``) of the tiny causal GQA
transformer of examples/train_tiny_transformer.py with cupy_dash attention, twice from one seed: every rank's
losses, its shard of the final weights and the gathered full weights are bitwise equal between the two runs, and
every rank gathers the same full weights.

    torchrun --nproc-per-node 2 examples/train_fsdp2.py --steps 30 --json fsdp2.json   # one GPU per rank (nccl)
    python examples/train_fsdp2.py --backend gloo --nproc 2     # two ranks sharing cuda:0 (gloo, CUDA tensors)

Each block and then the whole model are sharded over the ranks (parameters all-gathered for each block's
forward and backward, gradients reduce-scattered); each step's global batch of 16 rows is split over the ranks.
Eager mode, bf16 autocast, fp32 parameters and gradient reduction. With gloo, the gradient reduction is forced to
SUM followed by a division (``set_force_sum_reduction_for_comms``, where torch has it), as gloo's reduce-scatter
does not average. A different world size shards and reduces differently and gives other bits.
"""
from __future__ import annotations

if __name__ == "__main__":             # before torch is imported: one line, not a traceback, where anything is missing
    from preflight import require

    def _torch_cuda():
        import torch
        return None if torch.cuda.is_available() else f"a CUDA build of PyTorch (torch {torch.__version__} sees no GPU)"
    require("torch", "pip install torch", _torch_cuda)

import os  # noqa: E402

import dist_common  # noqa: E402

dist_common.multicast_off()

import torch  # noqa: E402

from train_tiny_transformer import TinyTransformer, batches, cupy_dash_attention  # noqa: E402


def train(ctx, steps, seed):
    """One run: (every step's local loss, sha256 of the gathered full weights, sha256 of this rank's shards)."""
    import cupy_dash
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(seed)
    model = TinyTransformer(cupy_dash_attention).to(ctx.device)
    mesh = init_device_mesh("cuda", (ctx.world,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if ctx.backend == "gloo" and hasattr(model, "set_force_sum_reduction_for_comms"):
        model.set_force_sum_reduction_for_comms(True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    losses = torch.empty(steps, device=ctx.device)
    for i, tokens in enumerate(batches(steps, "cpu")):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(dist_common.local_batch(tokens, ctx))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses[i] = loss.detach()
    cupy_dash.check_errors()
    params = list(model.parameters())                      # DTensors, sharded on dim 0 over the mesh
    return dict(losses=losses.cpu().tolist(), weights=dist_common.digest(p.full_tensor() for p in params),
                shard=dist_common.digest(p.to_local() for p in params))


def main(argv=None):
    args = dist_common.parse(__doc__.splitlines()[0], argv)
    if "RANK" not in os.environ:
        dist_common.relaunch_under_torchrun(__file__, args, argv)
    ctx = dist_common.Context(args.backend)
    runs = [train(ctx, args.steps, args.seed) for _ in range(2)]
    return dist_common.report("fsdp2", ctx, args, runs)


if __name__ == "__main__":
    raise SystemExit(main())
