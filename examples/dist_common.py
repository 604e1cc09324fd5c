"""What examples/train_ddp.py and examples/train_fsdp2.py share (not a script): NVLink multicast kept off, the
launch under torchrun (a script run with plain ``python`` re-executes itself under
``python -m torch.distributed.run --standalone``), the process group and each rank's GPU, each rank's slice of
the tiny transformer's data, the digest of the weights, and the report: two runs from one seed compared bit for
bit (every rank's losses, the final weights), and the ranks' copies of the final weights compared with each
other.

Backends: ``nccl`` (one GPU per rank, the default) or ``gloo`` (CUDA tensors; ranks may share a GPU: two ranks
on cuda:0 test the wiring where one GPU is all there is).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

# NOTES: the GPU machines this project runs on require NVLink multicast off (a program using it can take the
# host's GPUs out of service); set before torch, NCCL or NVSHMEM read them, and inherited by torchrun's ranks.
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def multicast_off() -> None:
    os.environ.update(MULTICAST_OFF)


def parse(description: str, argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=description)
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
    import torch
    n = args.nproc or (2 if args.backend == "gloo" else torch.cuda.device_count())
    argv = sys.argv[1:] if argv is None else list(argv)
    os.execv(sys.executable, [sys.executable, "-m", "torch.distributed.run", "--standalone",
                              f"--nproc-per-node={n}", script, *argv])


class Context:
    """This rank: ``rank``, ``world``, ``device`` (torch.device), ``backend``."""

    def __init__(self, backend: str):
        import torch
        import torch.distributed as dist
        self.rank, self.world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local, gpus = int(os.environ.get("LOCAL_RANK", self.rank)), torch.cuda.device_count()
        if backend == "nccl" and int(os.environ.get("LOCAL_WORLD_SIZE", self.world)) > gpus:
            raise SystemExit(f"nccl needs one GPU per rank: {self.world} ranks, {gpus} GPU(s); use --backend gloo")
        self.device, self.backend = torch.device("cuda", local % gpus), backend
        torch.cuda.set_device(self.device)
        dist.init_process_group(backend, device_id=self.device if backend == "nccl" else None)


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


def report(name: str, ctx, args, runs) -> int:
    """Compare two runs and the ranks; ``runs``: per run, dict(losses=[float per step], weights=sha256 of the
    whole model's final weights, as this rank sees them, and optionally shard=sha256 of this rank's shard).
    Rank 0 prints the summary and writes --json; every rank returns the same exit status (0: all identical)."""
    import torch
    import torch.distributed as dist
    every = [None] * ctx.world
    dist.all_gather_object(every, runs)                    # every[rank][run] -> that rank's record of that run
    same_runs = all(r[0] == r[1] for r in every)
    per_rank = [sum(a != b for a, b in zip(r[0]["losses"], r[1]["losses"])) for r in every]
    same_replicas = all(len({every[rank][run]["weights"] for rank in range(ctx.world)}) == 1 for run in range(2))
    ok = same_runs and same_replicas
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
