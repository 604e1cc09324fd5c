"""Train a tiny causal GQA transformer with cupy_dash attention under torch.compile, twice, and check that the two
runs are bitwise identical (every loss, every final weight); the same with torch SDPA's FlashAttention-2
backend, whose backward adds dQ with atomics, shows the difference.

    python examples/train_tiny_transformer.py                      # both attentions, 2 runs each
    python examples/train_tiny_transformer.py --attention cupy_dash --steps 300 --plot loss.png --json out.json

Model: token one-hot -> linear embedding (a matmul, so its backward has no atomics), fixed sinusoidal positions,
4 pre-norm blocks (RMSNorm, causal GQA attention with 8 query heads and 2 KV heads of dim 64, MLP 4x), tied
output. Task: rows of 512 tokens that repeat a random pattern of 8 to 32 Zipf-distributed tokens: the loss after
position 64 falls first to the entropy of the token frequencies (about 4.3 nats), then further as the model
learns to copy from one period back (induction heads). bf16 autocast, AdamW. Everything but the attention is
deterministic by construction here (matmuls, elementwise ops, fixed-order reductions), so the only possible
source of run-to-run differences is the attention backward.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import time

if __name__ == "__main__":             # before torch is imported: one line, not a traceback, where anything is missing
    from preflight import require_torch
    require_torch()

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

VOCAB, D_MODEL, LAYERS, HEADS, KV_HEADS, HEAD_DIM, SEQ, BATCH = 256, 256, 4, 8, 2, 64, 512, 16


def cupy_dash_attention(q, k, v):
    """q (B, S, H, D), k / v (B, S, Hkv, D) -> (B, S, H, D), causal, deterministic backward."""
    import cupy_dash
    return cupy_dash.torch.attention(q, k, v, causal=True)


def sdpa_attention(q, k, v):
    """The same with torch SDPA (FlashAttention-2 backend; KV heads repeated, as FA2 in torch wants H = Hkv)."""
    g = q.shape[2] // k.shape[2]
    k, v = (x.repeat_interleave(g, dim=2) for x in (k, v))
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
    return out.transpose(1, 2)


class Block(nn.Module):
    def __init__(self, attention):
        super().__init__()
        self.attention = attention
        self.norm1, self.norm2 = nn.RMSNorm(D_MODEL), nn.RMSNorm(D_MODEL)
        self.qkv = nn.Linear(D_MODEL, (HEADS + 2 * KV_HEADS) * HEAD_DIM, bias=False)
        self.proj = nn.Linear(HEADS * HEAD_DIM, D_MODEL, bias=False)
        self.mlp = nn.Sequential(nn.Linear(D_MODEL, 4 * D_MODEL), nn.GELU(), nn.Linear(4 * D_MODEL, D_MODEL))

    def forward(self, x):
        B, S, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], -1)
        # strided views into the qkv activation: cupy_dash reads them in place
        q = q.view(B, S, HEADS, HEAD_DIM)
        k, v = k.view(B, S, KV_HEADS, HEAD_DIM), v.view(B, S, KV_HEADS, HEAD_DIM)
        o = self.attention(q, k, v)
        x = x + self.proj(o.reshape(B, S, HEADS * HEAD_DIM))
        return x + self.mlp(self.norm2(x))


class TinyTransformer(nn.Module):
    def __init__(self, attention):
        super().__init__()
        self.embed = nn.Parameter(torch.randn(VOCAB, D_MODEL) * 0.1)
        self.blocks = nn.ModuleList(Block(attention) for _ in range(LAYERS))
        self.norm = nn.RMSNorm(D_MODEL)
        pos = torch.arange(SEQ)[:, None] / 10000 ** (torch.arange(0, D_MODEL, 2) / D_MODEL)
        # NOTES: positions at a scale comparable to the token embeddings, so neither drowns the other
        self.register_buffer("pos", 0.1 * torch.cat([pos.sin(), pos.cos()], -1), persistent=False)

    def forward(self, tokens):
        x = F.one_hot(tokens, VOCAB).to(self.embed.dtype) @ self.embed + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        logits = self.norm(x) @ self.embed.t()
        start = 2 * 32                        # loss once every pattern has been seen twice: what can be learned
        return F.cross_entropy(logits[:, start:-1].float().reshape(-1, VOCAB), tokens[:, start + 1:].reshape(-1))


def batches(steps, device, seed=1234):
    """Fixed synthetic data: (BATCH, SEQ) int64 tokens, each row a random pattern of 8 to 32 tokens (drawn with
    Zipf frequencies) repeated."""
    gen = torch.Generator().manual_seed(seed)
    zipf = 1.0 / torch.arange(1, VOCAB + 1, dtype=torch.float64)   # skewed token frequencies: a quick first lesson
    for _ in range(steps):
        rows = []
        for _ in range(BATCH):
            period = int(torch.randint(8, 33, (1,), generator=gen))
            pattern = torch.multinomial(zipf, period, replacement=True, generator=gen)
            rows.append(pattern.repeat(SEQ // period + 1)[:SEQ])
        yield torch.stack(rows).to(device, non_blocking=True)


def train(attention_name, steps, seed=0, compile_mode="default"):
    """One training run from a fixed seed; returns (losses as float32 list, sha256 of the final weights,
    seconds per step after the first 10)."""
    torch.manual_seed(seed)
    attention = cupy_dash_attention if attention_name == "cupy_dash" else sdpa_attention
    model = TinyTransformer(attention).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    step_fn = torch.compile(model, fullgraph=True, mode=compile_mode)
    losses = torch.empty(steps, device="cuda")
    t0 = None
    for i, tokens in enumerate(batches(steps, "cuda")):
        if i == 10:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_fn(tokens)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses[i] = loss.detach()
    torch.cuda.synchronize()
    per_step = (time.perf_counter() - t0) / max(1, steps - 10) if t0 is not None else float("nan")
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().float().cpu().numpy().tobytes())
    return losses.cpu().tolist(), digest.hexdigest(), per_step


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--attention", choices=("cupy_dash", "sdpa", "both"), default="both")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--mode", default="default", help="torch.compile mode (default, reduce-overhead, ...)")
    ap.add_argument("--plot", default=None, help="PNG of the loss curves and run-to-run differences")
    ap.add_argument("--json", default=None, help="write losses, weight digests and timings here")
    args = ap.parse_args(argv)
    torch.backends.cuda.enable_math_sdp(False)        # SDPA: FlashAttention-2 only
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    torch.backends.cuda.enable_cudnn_sdp(False)
    names = ("cupy_dash", "sdpa") if args.attention == "both" else (args.attention,)
    results = {}
    for name in names:
        results[name] = []
        for run in range(2):
            losses, digest, per_step = train(name, args.steps, compile_mode=args.mode)
            results[name].append(dict(losses=losses, weights_sha256=digest, seconds_per_step=per_step))
            print(f"{name} run {run + 1}: final loss {losses[-1]:.4f} (first {losses[0]:.4f}), weights "
                  f"{digest[:16]}, {per_step * 1e3:.1f} ms/step", flush=True)
        a, b = results[name]
        same_losses = a["losses"] == b["losses"]
        same_weights = a["weights_sha256"] == b["weights_sha256"]
        differ = sum(x != y for x, y in zip(a["losses"], b["losses"]))
        print(f"{name}: identical loss curves: {same_losses} ({differ} of {args.steps} steps differ), identical "
              f"final weights: {same_weights}", flush=True)
        results[name + "_identical"] = dict(losses=same_losses, weights=same_weights, steps_differing=differ)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(steps=args.steps, torch=torch.__version__, results=results), f)
    if args.plot:
        from loss_plot import plot
        plot({k: v for k, v in results.items() if not k.endswith("_identical")}, args.plot,
             title="tiny causal GQA transformer, torch.compile, bf16: two runs from the same seed")
    ok = all(results[n + "_identical"]["losses"] and results[n + "_identical"]["weights"]
             for n in names if n == "cupy_dash")
    return 0 if ok and all(math.isfinite(r["losses"][-1]) for n in names for r in results[n]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
