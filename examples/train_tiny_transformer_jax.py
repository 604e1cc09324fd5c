"""Train a tiny causal GQA transformer in JAX with cupy_dash attention inside a jax.jit train step, twice, and
check that the two runs are bitwise identical (every loss, every final weight); the same with
jax.nn.dot_product_attention (cuDNN's fused attention, whose backward is not deterministic unless XLA is told to
be) shows the difference.

    python examples/train_tiny_transformer_jax.py                   # both attentions, 2 runs each
    python examples/train_tiny_transformer_jax.py --attention cupy_dash --steps 300 --plot loss.png

The model and task are those of examples/train_tiny_transformer.py (torch): one-hot embedding matmul, fixed
sinusoidal positions, 4 pre-norm blocks with 8 query heads / 2 KV heads of dim 64, the copy task on 512 tokens,
bf16 activations, AdamW written out in jax.numpy (no optax or flax needed).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

if __name__ == "__main__":             # before jax is imported: one line, not a traceback, where anything is missing
    from preflight import require_jax
    require_jax()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

VOCAB, D_MODEL, LAYERS, HEADS, KV_HEADS, HEAD_DIM, SEQ, BATCH = 256, 256, 4, 8, 2, 64, 512, 16
LR, WD, BETAS, EPS = 1e-3, 0.01, (0.9, 0.999), 1e-8


def cupy_dash_attention(q, k, v):
    """q (B, S, H, D), k / v (B, S, Hkv, D) bf16 -> (B, S, H, D), causal, deterministic backward."""
    import cupy_dash
    return cupy_dash.jax.attention(q, k, v, causal=True)


def cudnn_attention(q, k, v):
    """jax.nn.dot_product_attention with cuDNN's fused kernel (GQA handled by JAX)."""
    return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")


def init_params(seed):
    keys = iter(jax.random.split(jax.random.PRNGKey(seed), 4 * LAYERS + 1))

    def dense(n_in, n_out):
        return jax.random.normal(next(keys), (n_in, n_out), jnp.float32) / math.sqrt(n_in)
    qkv_out = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    blocks = [dict(norm1=jnp.ones(D_MODEL), norm2=jnp.ones(D_MODEL), qkv=dense(D_MODEL, qkv_out),
                   proj=dense(HEADS * HEAD_DIM, D_MODEL), up=dense(D_MODEL, 4 * D_MODEL), up_b=jnp.zeros(4 * D_MODEL),
                   down=dense(4 * D_MODEL, D_MODEL), down_b=jnp.zeros(D_MODEL)) for _ in range(LAYERS)]
    return dict(embed=jax.random.normal(next(keys), (VOCAB, D_MODEL), jnp.float32) * 0.1, blocks=blocks,
                norm=jnp.ones(D_MODEL))


def rms_norm(x, w):
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + 1e-6) * w).astype(x.dtype)


def positions():
    pos = np.arange(SEQ)[:, None] / 10000 ** (np.arange(0, D_MODEL, 2) / D_MODEL)
    return jnp.asarray(0.1 * np.concatenate([np.sin(pos), np.cos(pos)], -1), jnp.float32)


def loss_fn(params, tokens, attention):
    bf = jnp.bfloat16
    B, S = tokens.shape
    x = (jax.nn.one_hot(tokens, VOCAB, dtype=bf) @ params["embed"].astype(bf)) + positions()[:S].astype(bf)
    for p in params["blocks"]:
        h = rms_norm(x, p["norm1"]) @ p["qkv"].astype(bf)
        q, k, v = jnp.split(h, [HEADS * HEAD_DIM, (HEADS + KV_HEADS) * HEAD_DIM], axis=-1)
        o = attention(q.reshape(B, S, HEADS, HEAD_DIM), k.reshape(B, S, KV_HEADS, HEAD_DIM),
                      v.reshape(B, S, KV_HEADS, HEAD_DIM))
        x = x + o.reshape(B, S, HEADS * HEAD_DIM) @ p["proj"].astype(bf)
        h = jax.nn.gelu(rms_norm(x, p["norm2"]) @ p["up"].astype(bf) + p["up_b"].astype(bf))
        x = x + h @ p["down"].astype(bf) + p["down_b"].astype(bf)
    logits = (rms_norm(x, params["norm"]) @ params["embed"].astype(bf).T).astype(jnp.float32)
    start = 2 * 32                  # every pattern seen twice: what can be learned
    logp = jax.nn.log_softmax(logits[:, start:-1], -1)
    target = jax.nn.one_hot(tokens[:, start + 1:], VOCAB, dtype=jnp.float32)
    return -jnp.mean(jnp.sum(logp * target, -1))


def make_step(attention, **jit_kwargs):
    """The jitted train step ``(params, opt, tokens, t) -> (params, opt, loss)`` (AdamW); ``jit_kwargs`` go to
    jax.jit (examples/train_jax_dp.py gives shardings)."""
    def step(params, opt, tokens, t):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens, attention)
        b1, b2 = BETAS
        m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, opt["m"], grads)
        v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, opt["v"], grads)
        c1, c2 = 1 - b1 ** t, 1 - b2 ** t
        params = jax.tree.map(lambda p, m, v: p - LR * (m / c1 / (jnp.sqrt(v / c2) + EPS) + WD * p), params, m, v)
        return params, dict(m=m, v=v), loss
    return jax.jit(step, donate_argnums=(0, 1), **jit_kwargs)


def batches(steps, seed=1234):
    """(BATCH, SEQ) int32 tokens: each row a random pattern of 8 to 32 Zipf-distributed tokens, repeated (the
    torch example's task)."""
    rng = np.random.default_rng(seed)
    zipf = 1.0 / np.arange(1, VOCAB + 1)
    zipf /= zipf.sum()
    for _ in range(steps):
        rows = []
        for _ in range(BATCH):
            pattern = rng.choice(VOCAB, size=int(rng.integers(8, 33)), p=zipf)
            rows.append(np.tile(pattern, SEQ // len(pattern) + 1)[:SEQ])
        yield jnp.asarray(np.stack(rows), jnp.int32)


def train(attention_name, steps, seed=0):
    attention = cupy_dash_attention if attention_name == "cupy_dash" else cudnn_attention
    params = init_params(seed)
    opt = dict(m=jax.tree.map(jnp.zeros_like, params), v=jax.tree.map(jnp.zeros_like, params))
    step = make_step(attention)
    losses, t0 = [], None
    for i, tokens in enumerate(batches(steps)):
        if i == 10:
            jax.block_until_ready(losses[-1])
            t0 = time.perf_counter()
        params, opt, loss = step(params, opt, tokens, jnp.float32(i + 1))
        losses.append(loss)
    losses = [float(x) for x in jax.device_get(losses)]
    per_step = (time.perf_counter() - t0) / max(1, steps - 10) if t0 is not None else float("nan")
    digest = hashlib.sha256()
    for leaf in jax.tree.leaves(params):
        digest.update(np.asarray(leaf).tobytes())
    return losses, digest.hexdigest(), per_step


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--attention", choices=("cupy_dash", "cudnn", "both"), default="both")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--plot", default=None, help="PNG of the loss curves and run-to-run differences")
    ap.add_argument("--json", default=None, help="write losses, weight digests and timings here")
    args = ap.parse_args(argv)
    names = ("cupy_dash", "cudnn") if args.attention == "both" else (args.attention,)
    results, verdicts = {}, {}
    for name in names:
        runs = []
        for run in range(2):
            try:
                losses, digest, per_step = train(name, args.steps)
            except Exception as exc:                     # e.g. no cuDNN fused attention on this install
                print(f"{name} run {run + 1} failed: {type(exc).__name__}: {exc}", flush=True)
                break
            runs.append(dict(losses=losses, weights_sha256=digest, seconds_per_step=per_step))
            print(f"{name} run {run + 1}: final loss {losses[-1]:.4f} (first {losses[0]:.4f}), weights "
                  f"{digest[:16]}, {per_step * 1e3:.1f} ms/step", flush=True)
        results[name] = runs
        if len(runs) == 2:
            a, b = runs
            differ = sum(x != y for x, y in zip(a["losses"], b["losses"]))
            verdicts[name] = dict(losses=differ == 0, weights=a["weights_sha256"] == b["weights_sha256"],
                                  steps_differing=differ)
            print(f"{name}: identical loss curves: {differ == 0} ({differ} of {args.steps} steps differ), "
                  f"identical final weights: {verdicts[name]['weights']}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(steps=args.steps, jax=jax.__version__, results=results, identical=verdicts), f)
    if args.plot:
        from loss_plot import plot
        plot({k: v for k, v in results.items() if len(v) == 2}, args.plot,
             title="tiny causal GQA transformer, jax.jit, bf16: two runs from the same seed")
    ok = "cupy_dash" not in names or (verdicts.get("cupy_dash", {}).get("losses") and
                                      verdicts["cupy_dash"]["weights"])
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
