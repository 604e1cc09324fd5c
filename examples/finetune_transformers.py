"""Fine-tune a small Hugging Face Llama (from a config, random init, no download) with attn_implementation=
"cupy_dash", twice from the same seed, and check that the two runs are bitwise identical (every loss, every final
weight). Two dataloaders over the same synthetic token data: padded batches (right padding, a 2D attention mask:
the adapter unpads them to the varlen kernels) and packed ones (transformers' DataCollatorWithFlattening, one row
per batch, with the cu_seq_lens_* / max_length_* kwargs); the runs alternate them.

    python examples/finetune_transformers.py                          # 200 steps, two runs
    python examples/finetune_transformers.py --steps 100 --plot hf.png --json hf.json

Model: LlamaForCausalLM, 4 layers, hidden 512, 8 query heads and 2 KV heads of dim 64 (GQA), bf16, AdamW. Data:
sequences of 64 to 512 tokens that repeat a random pattern of 8 to 32 tokens, so the loss falls as the model learns
to copy from one period back. Needs torch, transformers (pip install -e ".[transformers]") and a Hopper GPU.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math

if __name__ == "__main__":             # before torch is imported: one line, not a traceback, where anything is missing
    from preflight import require_torch
    require_torch("transformers")

import torch  # noqa: E402
import transformers  # noqa: E402

import cupy_dash.transformers  # noqa: E402  (the import registers attn_implementation="cupy_dash")

VOCAB, BATCH = 256, 8


def sequences(steps, seed=1234):
    """Per step BATCH token lists (int64 tensors) of 64 to 512 tokens, each a repeated random pattern."""
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        rows = []
        for _ in range(BATCH):
            length = int(torch.randint(64, 513, (1,), generator=gen))
            pattern = torch.randint(3, VOCAB, (int(torch.randint(8, 33, (1,), generator=gen)),), generator=gen)
            rows.append(pattern.repeat(length // len(pattern) + 1)[:length])
        yield rows


def padded_batch(rows):
    """Right-padded input_ids, attention_mask and labels (-100 on padding) (BATCH, longest)."""
    longest = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), longest, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, :len(r)], mask[i, :len(r)] = r, 1
    return dict(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100))


_flatten = transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=True)


def packed_batch(rows):
    """One row (1, total) with restarting position_ids, labels with -100 at each sequence's first token, and the
    cu_seq_lens_q / cu_seq_lens_k / max_length_q / max_length_k kwargs."""
    return _flatten([{"input_ids": r.tolist()} for r in rows])


def dataloaders(steps):
    """The two dataloaders, alternating: even steps padded, odd steps packed (the same kind of data)."""
    for step, rows in enumerate(sequences(steps)):
        yield ("padded", padded_batch(rows)) if step % 2 == 0 else ("packed", packed_batch(rows))


def train(steps, seed=0):
    """One run from a fixed seed -> (losses as a float list, sha256 of the final weights)."""
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=512, intermediate_size=1536, num_hidden_layers=4,
                                      num_attention_heads=8, num_key_value_heads=2, head_dim=64,
                                      max_position_embeddings=1024, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=cupy_dash.transformers.NAME)
    model = model.to("cuda", torch.bfloat16).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    losses = torch.empty(steps, device="cuda")
    for i, (_, batch) in enumerate(dataloaders(steps)):
        batch = {k: v.to("cuda", non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}
        loss = model(**batch, use_cache=False).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses[i] = loss.detach()
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().float().cpu().numpy().tobytes())
    return losses.cpu().tolist(), digest.hexdigest()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--plot", default=None, help="PNG of the two runs' loss curves and their difference")
    ap.add_argument("--json", default=None, help="write the losses and weight digests here")
    args = ap.parse_args(argv)
    runs = []
    for run in range(2):
        losses, digest = train(args.steps)
        runs.append(dict(losses=losses, weights_sha256=digest))
        print(f"run {run + 1}: loss {losses[0]:.4f} -> {losses[-1]:.4f}, weights {digest[:16]}", flush=True)
    a, b = runs
    differ = sum(x != y for x, y in zip(a["losses"], b["losses"]))
    same_weights = a["weights_sha256"] == b["weights_sha256"]
    print(f"identical loss curves: {differ == 0} ({differ} of {args.steps} steps differ), identical final weights: "
          f"{same_weights}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(steps=args.steps, torch=torch.__version__, transformers=transformers.__version__,
                           runs=runs, identical=dict(losses=differ == 0, weights=same_weights)), f)
    if args.plot:
        from loss_plot import plot
        plot({"cupy_dash": runs}, args.plot,
             title="tiny Llama (transformers), padded and packed batches, bf16: two runs from the same seed")
    return 0 if differ == 0 and same_weights and math.isfinite(a["losses"][-1]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
