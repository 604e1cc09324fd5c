"""Data-parallel training of the tiny causal GQA transformer of examples/train_tiny_transformer.py with cupy_dash
attention, twice from one seed, with torch DistributedDataParallel (``--strategy ddp``) or FSDP2
(``torch.distributed.fsdp.fully_shard`` per block and on the model, ``--strategy fsdp2``): every rank's losses and
the final weights (FSDP2: also this rank's shards) are bitwise equal between the two runs, and (DDP) the ranks'
copies of the final weights are bitwise equal to each other (FSDP2's ranks hold different shards: no such check).

    torchrun --nproc-per-node 2 examples/train_data_parallel.py --steps 30 --json ddp.json   # a GPU per rank (nccl)
    python examples/train_data_parallel.py --strategy fsdp2      # the same, started under torchrun by itself
    CUDA_VISIBLE_DEVICES=0 python examples/train_data_parallel.py --backend gloo --nproc 2   # two ranks, one GPU

Each step's global batch (16 rows of 512 tokens) is split over the ranks (rank r takes the r-th chunk); the
gradients are all-reduced (DDP) or reduce-scattered (FSDP2) and averaged, then every rank applies the same AdamW
step. Eager mode, bf16 autocast, fp32 parameters. The reduction's addition order is fixed for a given world size
and backend, so runs repeat bit for bit; another world size groups the ranks' gradients differently and gives other
bits. With gloo, rank r takes GPU r modulo the visible GPUs. NVLink multicast is kept off (the GPU machines of this
project require it) before any NCCL communicator starts; ranks inherit it.
"""
from __future__ import annotations

if __name__ == "__main__":             # before torch is imported: one line, not a traceback, where anything is missing
    from preflight import require_torch
    require_torch()

import argparse  # noqa: E402
import datetime  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

# NOTES: the GPU machines this project runs on require NVLink multicast off (a program using it can take the
# host's GPUs out of service); set before NCCL or NVSHMEM read them, and inherited by torchrun's ranks.
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
os.environ.update(MULTICAST_OFF)

import torch  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

from train_tiny_transformer import TinyTransformer, batches, cupy_dash_attention  # noqa: E402


def parse(description: str, argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--strategy", choices=("ddp", "fsdp2"), default="ddp",
                    help="ddp: DistributedDataParallel; fsdp2: fully_shard per block and on the model")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--backend", choices=("nccl", "gloo"), default="nccl",
                    help="gloo: CUDA tensors through gloo, ranks may share a GPU")
    ap.add_argument("--nproc", type=int, default=None,
                    help="ranks when not started by torchrun (default: every GPU; gloo: 2)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="rank 0 writes losses, digests and verdicts here")
    return ap.parse_args(argv)


def relaunch_under_torchrun(script: str, args, argv) -> None:
    """Re-execute ``script`` with the same arguments under torchrun (this process is replaced)."""
    n = args.nproc or (2 if args.backend == "gloo" else torch.cuda.device_count())
    argv = sys.argv[1:] if argv is None else list(argv)
    os.execv(sys.executable, [sys.executable, "-m", "torch.distributed.run", "--standalone",
                              f"--nproc-per-node={n}", script, *argv])


class Context:
    """This rank: ``rank``, ``world``, ``device`` (torch.device), ``backend``."""

    def __init__(self, backend: str):
        import torch.distributed as dist
        self.rank, self.world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local, gpus = int(os.environ.get("LOCAL_RANK", self.rank)), torch.cuda.device_count()
        if backend == "nccl" and int(os.environ.get("LOCAL_WORLD_SIZE", self.world)) > gpus:
            raise SystemExit(f"nccl needs one GPU per rank: {self.world} ranks, {gpus} GPU(s); use --backend gloo")
        self.device, self.backend = torch.device("cuda", local % gpus), backend
        torch.cuda.set_device(self.device)
        # NOTES: a collective that hangs (a rank lost) raises after 2 minutes instead of NCCL's default 10
        dist.init_process_group(backend, device_id=self.device if backend == "nccl" else None,
                                timeout=datetime.timedelta(minutes=2))


def local_batch(tokens, ctx):
    """This rank's rows of a global ``(BATCH, SEQ)`` batch (contiguous chunks, rank order), on its GPU."""
    if tokens.shape[0] % ctx.world:
        raise SystemExit(f"the global batch of {tokens.shape[0]} rows does not split over {ctx.world} ranks")
    return tokens.chunk(ctx.world)[ctx.rank].to(ctx.device)


def digest(tensors) -> str:
    """sha256 of the float32 bytes of ``tensors`` (plain torch tensors), in order."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()


def report(name: str, ctx, args, runs, replicas=True) -> int:
    """Compare two runs and the ranks; ``runs``: per run, dict(losses=[float per step], weights=sha256 of the
    whole model's final weights, as this rank sees them, and optionally shard=sha256 of this rank's shard).
    ``replicas``: each rank holds a whole replica of its own (DDP), compared across the ranks; else (FSDP2, whose
    full weights every rank gathers from the same shards) ``replicas_identical`` is None. Rank 0 prints the summary
    and writes --json; every rank returns the same exit status (0: all identical)."""
    import torch.distributed as dist
    every = [None] * ctx.world
    dist.all_gather_object(every, runs)                    # every[rank][run] -> that rank's record of that run
    same_runs = all(r[0] == r[1] for r in every)
    per_rank = [sum(a != b for a, b in zip(r[0]["losses"], r[1]["losses"])) for r in every]
    same_replicas = all(len({every[rank][run]["weights"] for rank in range(ctx.world)}) == 1 for run in range(2)) \
        if replicas else None
    ok = same_runs and same_replicas is not False
    if ctx.rank == 0:
        print(f"{name}: {ctx.world} ranks ({ctx.backend}, {torch.cuda.get_device_name(ctx.device)}), "
              f"{args.steps} steps, final loss of rank 0 {every[0][0]['losses'][-1]:.4f}", flush=True)
        print(f"{name}: runs 1 and 2 identical (every rank's losses and weights): {same_runs} (steps differing per "
              f"rank: {per_rank}); ranks' final weights identical: {same_replicas} "
              f"({every[0][0]['weights'][:16]})", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(dict(example=name, backend=ctx.backend, world=ctx.world, steps=args.steps,
                               torch=torch.__version__, runs_identical=same_runs, replicas_identical=same_replicas,
                               ranks=every), f)
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok else 1


def fit(module, ctx, steps) -> list:
    """AdamW steps of ``module`` (the wrapped model) on this rank's rows of each global batch: the local losses."""
    import cupy_dash
    opt = torch.optim.AdamW(module.parameters(), lr=1e-3, weight_decay=0.01)
    losses = torch.empty(steps, device=ctx.device)
    for i, tokens in enumerate(batches(steps, "cpu")):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = module(local_batch(tokens, ctx))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses[i] = loss.detach()
    cupy_dash.check_errors()
    return losses.cpu().tolist()


def train_ddp(ctx, steps, seed):
    """One run: (every step's local loss, sha256 of the final weights of this rank's replica)."""
    torch.manual_seed(seed)
    model = TinyTransformer(cupy_dash_attention).to(ctx.device)
    losses = fit(DistributedDataParallel(model, device_ids=[ctx.device.index]), ctx, steps)
    return dict(losses=losses, weights=digest(model.parameters()))


def train_fsdp2(ctx, steps, seed):
    """One run: (every step's local loss, sha256 of the gathered full weights, sha256 of this rank's shards)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(seed)
    model = TinyTransformer(cupy_dash_attention).to(ctx.device)
    mesh = init_device_mesh("cuda", (ctx.world,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    losses = fit(model, ctx, steps)
    shards = [p.to_local().detach().float().cpu() for p in model.parameters()]   # DTensors, Shard(0) over the mesh
    return dict(losses=losses, weights=digest(full_weights(shards, ctx.world)), shard=digest(shards))


def full_weights(shards, world) -> list:
    """The whole parameters from every rank's dim-0 shards (FSDP2 splits dim 0 as ``torch.chunk`` does), gathered
    as host objects: ``DTensor.full_tensor()``'s functional all-gather crashed (SIGSEGV, torch 2.11) with gloo and
    CUDA tensors on the H200."""
    import torch.distributed as dist
    every = [None] * world
    dist.all_gather_object(every, shards)                  # every[rank][parameter]
    return [torch.cat([every[rank][i] for rank in range(world)]) for i in range(len(shards))]


def main(argv=None):
    args = parse(__doc__.splitlines()[0], argv)
    if "RANK" not in os.environ:
        relaunch_under_torchrun(__file__, args, argv)
    ctx = Context(args.backend)
    train = train_ddp if args.strategy == "ddp" else train_fsdp2
    runs = [train(ctx, args.steps, args.seed) for _ in range(2)]
    return report(args.strategy, ctx, args, runs, replicas=args.strategy == "ddp")


if __name__ == "__main__":
    raise SystemExit(main())
