"""Data-parallel training of the tiny causal GQA transformer of examples/train_tiny_transformer.py with torch
DistributedDataParallel and cupy_dash attention, twice from one seed: every rank's losses and the final weights
are bitwise equal between the two runs, and the ranks' replicas are bitwise equal to each other.

    torchrun --nproc-per-node 2 examples/train_ddp.py --steps 30 --json ddp.json    # one GPU per rank (nccl)
    python examples/train_ddp.py                                 # the same, started under torchrun by itself
    python examples/train_ddp.py --backend gloo --nproc 2        # two ranks sharing cuda:0 (gloo, CUDA tensors)

Each step's global batch (16 rows of 512 tokens) is split over the ranks (rank r takes the r-th chunk); DDP
all-reduces the gradients (averaged), then every rank applies the same AdamW step. Eager mode, bf16 autocast.
The all-reduce's addition order is fixed for a given world size and backend, so runs repeat bit for bit; another
world size adds the ranks' gradients in another grouping and gives other bits.
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
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from train_tiny_transformer import TinyTransformer, batches, cupy_dash_attention  # noqa: E402


def train(ctx, steps, seed):
    """One run: (every step's local loss, sha256 of the final weights of this rank's replica)."""
    import cupy_dash
    torch.manual_seed(seed)
    model = TinyTransformer(cupy_dash_attention).to(ctx.device)
    ddp = DistributedDataParallel(model, device_ids=[ctx.device.index])
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3, weight_decay=0.01)
    losses = torch.empty(steps, device=ctx.device)
    for i, tokens in enumerate(batches(steps, "cpu")):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = ddp(dist_common.local_batch(tokens, ctx))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses[i] = loss.detach()
    cupy_dash.check_errors()
    return dict(losses=losses.cpu().tolist(), weights=dist_common.digest(model.parameters()))


def main(argv=None):
    args = dist_common.parse(__doc__.splitlines()[0], argv)
    if "RANK" not in os.environ:
        dist_common.relaunch_under_torchrun(__file__, args, argv)
    ctx = dist_common.Context(args.backend)
    runs = [train(ctx, args.steps, args.seed) for _ in range(2)]
    return dist_common.report("ddp", ctx, args, runs)


if __name__ == "__main__":
    raise SystemExit(main())
