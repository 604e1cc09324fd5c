"""``attn_implementation="cupy_dash"`` in Hugging Face transformers models, against the same models with sdpa.

Tiny models from configs (random init, no download), bf16: Llama (GQA with head dim 64, MQA with head dim 128),
Qwen2 with a sliding-window layer, Gemma 2 (logit soft-capping, a sliding-window layer; its reference runs
transformers' eager attention, which applies the cap), and the bidirectional encoder ModernBERT (global and
bidirectional sliding-window layers). Batches: equal lengths (no mask: the dense kernels), right and left padding
(a 2D mask: unpadded to the varlen kernels), packed sequences (restarting ``position_ids``; the ``cu_seq_lens_*``
kwargs of ``DataCollatorWithFlattening``). The reference runs every sequence alone, without padding, with sdpa (or
eager) in float64 (and in bf16 for the tolerance): the outputs at every real token and every parameter gradient of
a fixed random projection of them must satisfy FA3's rule ``max|ours - ref64| <= 2 max|ref_bf16 - ref64| + atol``
(:func:`cupy_dash.reference.assert_close_fa3`). Two short AdamW trainings give bitwise equal losses and weights,
and what the kernels cannot do (dropout in training, a 4D mask, float32 without a half target) raises,
naming the model setting. Generation: greedy steps from a left-padded batch with a dynamic and a static cache
against sdpa, and an encoder-decoder's cross-attention over a right-padded encoder against eager. Skipped without
a Hopper GPU, torch or transformers.
"""
from __future__ import annotations

import copy

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from cupy_dash import reference  # noqa: E402
from cupy_dash.transformers import NAME  # noqa: E402  (the import registers attn_implementation="cupy_dash")

pytestmark = pytest.mark.gpu

BF16 = np.dtype(ml_dtypes.bfloat16)
VOCAB = 128
LENGTHS = [80, 53, 17, 64]          # > the sliding window (16), odd lengths, one row of the padded batch full


def _config(model):
    """Tiny configs: 2-3 layers, 4 query heads (hidden 256)."""
    common = dict(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_attention_heads=4,
                  max_position_embeddings=512, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                  initializer_range=0.1)
    if model == "llama_d64":        # GQA 4 / 2, head dim 64
        return transformers.LlamaConfig(num_hidden_layers=2, num_key_value_heads=2, head_dim=64, **common)
    if model == "llama_d128":       # MQA 4 / 1, head dim 128
        return transformers.LlamaConfig(num_hidden_layers=2, num_key_value_heads=1, head_dim=128, **common)
    if model == "qwen2_sliding":    # layer 0 full, layer 1 a sliding window of 16 tokens; GQA 4 / 2
        return transformers.Qwen2Config(num_hidden_layers=2, num_key_value_heads=2, use_sliding_window=True,
                                        sliding_window=16, max_window_layers=1, **common)
    if model == "gemma2":           # logit cap 2 (random init: scores of a few units, so the cap bends them)
        return transformers.Gemma2Config(num_hidden_layers=2, num_key_value_heads=2, head_dim=64,
                                         query_pre_attn_scalar=64, sliding_window=16, attn_logit_softcapping=2.0,
                                         **common)
    if model == "deepseek_v3":      # MLA: query / key head dim 192 (128 + 64 rotary), value head dim 128; dense MLPs
        if not hasattr(transformers, "DeepseekV3Config"):
            pytest.skip(f"transformers {transformers.__version__} has no DeepSeek-V3 model")
        return transformers.DeepseekV3Config(num_hidden_layers=2, num_key_value_heads=4, first_k_dense_replace=2,
                                             q_lora_rank=None, kv_lora_rank=64, qk_nope_head_dim=128,
                                             qk_rope_head_dim=64, v_head_dim=128, **common)
    if model == "modernbert":       # bidirectional; layer 0 global, layers 1-2 |i - j| <= 16
        return transformers.ModernBertConfig(num_hidden_layers=3, local_attention=32, cls_token_id=1,
                                             sep_token_id=2, global_attn_every_n_layers=3, **common)
    raise ValueError(model)


def _models(model, seed=0):
    """(cupy_dash bf16, reference bf16, reference float64) base models with identical weights, on the GPU; the
    reference attention is sdpa, or eager for Gemma 2 (sdpa has no logit cap)."""
    config = _config(model)
    ref = "eager" if model == "gemma2" else "sdpa"
    torch.manual_seed(seed)
    base = transformers.AutoModel.from_config(copy.deepcopy(config), attn_implementation=ref)
    out = []
    for attn, dtype in ((NAME, torch.bfloat16), (ref, torch.bfloat16), (ref, torch.float64)):
        # NOTES: a model keeps the config object it was built from and reads its attention implementation from
        # it at every forward: models that share one config run whichever implementation was set last.
        m = transformers.AutoModel.from_config(copy.deepcopy(config), attn_implementation=attn)
        m.load_state_dict(base.state_dict())
        out.append(m.to("cuda", dtype).eval())
    assert [m.config._attn_implementation for m in out] == [NAME, ref, ref]
    return out


def _sequences(seed=1):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (n,), generator=gen) for n in LENGTHS]


def _padded(seqs, side):
    """(input_ids, attention_mask, position_ids) (B, S) on the GPU, padded on ``side``."""
    S = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), S, dtype=torch.long)
    mask = torch.zeros(len(seqs), S, dtype=torch.long)
    pos = torch.zeros(len(seqs), S, dtype=torch.long)
    for b, s in enumerate(seqs):
        cols = slice(0, len(s)) if side == "right" else slice(S - len(s), S)
        ids[b, cols], mask[b, cols], pos[b, cols] = s, 1, torch.arange(len(s))
    return dict(input_ids=ids.cuda(), attention_mask=mask.cuda(), position_ids=pos.cuda())


def _packed(seqs, flash_kwargs):
    """One packed row from DataCollatorWithFlattening: position_ids restart; with ``flash_kwargs`` also
    cu_seq_lens_q / cu_seq_lens_k / max_length_q / max_length_k."""
    collate = transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=flash_kwargs)
    batch = collate([{"input_ids": s.tolist()} for s in seqs])
    batch.pop("labels")
    return {k: v.cuda() if torch.is_tensor(v) else v for k, v in batch.items()}


def _layout_sequences(seqs, layout):
    """The sequences a layout holds: "dense" takes the first 48 tokens of those that have them (equal lengths)."""
    return [s[:48] for s in seqs if len(s) >= 48] if layout == "dense" else seqs


def _batch(seqs, layout):
    if layout == "dense":
        return dict(input_ids=torch.stack(seqs).cuda())
    if layout in ("right", "left"):
        return _padded(seqs, layout)
    return _packed(seqs, flash_kwargs=layout == "packed_cu_seq_lens")


def _valid(batch):
    """Bool (B, S) of the positions that hold real tokens, in the order of ``_sequences``."""
    if "attention_mask" in batch:
        return batch["attention_mask"].bool()
    return torch.ones(batch["input_ids"].shape, dtype=torch.bool, device="cuda")


def _step(model, batch, valid, weights):
    """Outputs at the real tokens (N, hidden) and every parameter's gradient of sum(outputs * weights), float64
    on the host."""
    model.zero_grad(set_to_none=True)
    hidden = model(**batch, use_cache=False).last_hidden_state
    out = hidden[valid]
    (out.double() * weights).sum().backward()
    grads = {n: p.grad.double().cpu().numpy() for n, p in model.named_parameters() if p.grad is not None}
    return out.detach().double().cpu().numpy(), grads


def _reference(model, seqs, weights):
    """Every sequence alone (no padding, no packing), outputs concatenated and gradients summed."""
    outs, grads, row = [], {}, 0
    for s in seqs:
        ids = s[None].cuda()
        out, g = _step(model, dict(input_ids=ids), torch.ones_like(ids, dtype=torch.bool), weights[row:row + len(s)])
        row += len(s)
        outs.append(out)
        for name, x in g.items():
            grads[name] = grads.get(name, 0) + x
    return np.concatenate(outs), grads


CASES = [(m, layout) for m in ("llama_d64", "llama_d128", "qwen2_sliding", "gemma2", "modernbert", "deepseek_v3")
         for layout in ("dense", "right", "left", "packed_position_ids", "packed_cu_seq_lens")
         if not (m == "modernbert" and layout == "packed_position_ids")]   # ModernBERT keeps position_ids to itself


@pytest.mark.parametrize("model,layout", CASES, ids=[f"{m}-{layout}" for m, layout in CASES])
def test_outputs_and_gradients_match_sdpa(model, layout):
    ours, sdpa_bf16, sdpa_f64 = _models(model)
    seqs = _layout_sequences(_sequences(), layout)
    batch = _batch(seqs, layout)
    valid = _valid(batch)
    gen = torch.Generator(device="cuda").manual_seed(7)
    weights = torch.randn(int(valid.sum()), ours.config.hidden_size, generator=gen, device="cuda",
                          dtype=torch.float64)
    out, grads = _step(ours, batch, valid, weights)
    out_ref, grads_ref = _reference(sdpa_f64, seqs, weights)
    out_lowp, grads_lowp = _reference(sdpa_bf16, seqs, weights)
    reference.assert_close_fa3("output", out, out_ref, out_lowp, dtype=BF16)
    assert grads.keys() == grads_ref.keys() and len(grads) > 10
    for name in grads:
        reference.assert_close_fa3(name, grads[name], grads_ref[name], grads_lowp[name], dtype=BF16)
    assert np.abs(out_ref).max() > 0 and all(np.abs(g).max() > 0 for g in grads_ref.values() if g.size > 1)


def _train(model_name, steps, seed=0):
    """A few AdamW steps on a causal LM head, one set of sequences in turn padded and packed: (losses, weights)."""
    config = _config(model_name)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="cupy_dash")
    model = model.to("cuda", torch.bfloat16).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for step in range(steps):
        seqs = _sequences(seed=100)
        batch = _padded(seqs, "right") if step % 2 == 0 else _packed(seqs, flash_kwargs=step % 4 == 3)
        labels = batch["input_ids"].masked_fill(~_valid(batch), -100)
        loss = model(**batch, labels=labels, use_cache=False).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach().float())
    return torch.stack(losses).cpu(), [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("model", ["llama_d64", "qwen2_sliding", "gemma2"])
def test_two_trainings_are_bitwise_identical(model):
    losses_a, weights_a = _train(model, steps=6)
    losses_b, weights_b = _train(model, steps=6)
    assert torch.equal(losses_a.view(torch.int32), losses_b.view(torch.int32)), (losses_a, losses_b)
    for a, b in zip(weights_a, weights_b):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))
    # it learns: steps 0 and 4 are the same padded batch (random tokens: only memorising them lowers the loss)
    assert torch.isfinite(losses_a).all() and losses_a[4] < losses_a[0], losses_a


def _tiny_llama(**overrides):
    config = _config("llama_d64")
    for key, value in overrides.items():
        setattr(config, key, value)
    return transformers.AutoModel.from_config(config, attn_implementation="cupy_dash").to("cuda", torch.bfloat16)


def test_dropout_raises_in_training_only():
    model = _tiny_llama(attention_dropout=0.1)
    ids = _sequences()[0][None].cuda()
    with pytest.raises(NotImplementedError, match=r"dropout=0.1.*config\.attention_dropout"):
        model.train()(input_ids=ids, use_cache=False)
    assert torch.isfinite(model.eval()(input_ids=ids, use_cache=False).last_hidden_state).all()


def test_4d_mask_and_float32_raise():
    model = _tiny_llama()
    ids = _sequences()[0][None].cuda()
    S = ids.shape[1]
    mask4d = torch.ones(1, 1, S, S, dtype=torch.bool, device="cuda").tril()
    with pytest.raises(NotImplementedError, match="a 4D attention mask"):
        model(input_ids=ids, attention_mask=mask4d, use_cache=False)
    model = model.float()
    with pytest.raises(TypeError, match="dtype=torch.bfloat16"):
        model(input_ids=ids, use_cache=False)
    with torch.autocast("cuda", dtype=torch.bfloat16):       # float32 weights, bf16 attention as with FlashAttention
        assert torch.isfinite(model(input_ids=ids, use_cache=False).last_hidden_state).all()


def _generate(model, ids, mask, **kw):
    """Greedy generation's per-step scores ``(steps, batch, vocab)`` float32 and its new tokens ``(batch, steps)``."""
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, num_beams=1,
                             output_scores=True, return_dict_in_generate=True, **kw)
    return torch.stack(out.scores).float(), out.sequences[:, -len(out.scores):]


def _generation_gap(ours, ref) -> float:
    """The largest score difference, relative to the largest reference score, of two greedy generations over the
    steps each row can compare: those up to the first step where the rows' tokens differ (a near tie may pick
    another token; from there the prefixes differ)."""
    (a, tokens_a), (b, tokens_b) = ours, ref
    gap = 0.0
    for row in range(a.shape[1]):
        differ = (tokens_a[row] != tokens_b[row]).nonzero()
        last = int(differ[0]) if len(differ) else a.shape[0] - 1
        gap = max(gap, (a[:last + 1, row] - b[:last + 1, row]).abs().max().item())
    return gap / b.abs().max().item()


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_generation_with_left_padding_matches_sdpa(cache):
    """A causal LM's greedy generation from a left-padded batch, with a dynamic and a static cache (whose slots past
    the tokens seen must be left out): every step's scores as sdpa's in the same precision, to bf16 rounding."""
    config = _config("llama_d64")
    torch.manual_seed(0)
    ref = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="sdpa")
    ours = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation=NAME)
    ours.load_state_dict(ref.state_dict())
    ref, ours = (m.to("cuda", torch.bfloat16).eval() for m in (ref, ours))
    ids = torch.randint(3, VOCAB, (3, 12), device="cuda")
    mask = torch.ones_like(ids)
    mask[1, :5], ids[1, :5] = 0, 0                      # left padding
    mask[2, :1], ids[2, :1] = 0, 0
    kw = dict(cache_implementation="static") if cache == "static" else {}
    assert _generation_gap(_generate(ours, ids, mask, **kw), _generate(ref, ids, mask, **kw)) <= 0.05, cache


def test_cross_attention_over_a_padded_encoder_matches_eager():
    """An encoder-decoder (Bart) with a right-padded encoder batch: the decoder's cross-attention attends the real
    encoder tokens with every decoder query (not the rows that line up with the encoder's mask), in greedy
    generation and in a teacher-forced forward."""
    config = transformers.BartConfig(vocab_size=VOCAB, d_model=256, encoder_layers=2, decoder_layers=2,
                                     encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=256,
                                     decoder_ffn_dim=256, max_position_embeddings=64, dropout=0.0,
                                     attention_dropout=0.0, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                                     decoder_start_token_id=2, forced_eos_token_id=None)
    torch.manual_seed(0)
    ref = transformers.BartForConditionalGeneration(config).to("cuda", torch.bfloat16).eval()
    ref.set_attn_implementation("eager")
    ours = copy.deepcopy(ref)
    ours.set_attn_implementation(NAME)
    ids = torch.randint(3, VOCAB, (2, 10), device="cuda")
    mask = torch.ones_like(ids)
    mask[1, 6:], ids[1, 6:] = 0, 1                      # right padding
    assert _generation_gap(_generate(ours, ids, mask, min_length=0), _generate(ref, ids, mask, min_length=0)) <= 0.05
    for steps in (1, 5):                                # a decoding step; teacher forcing
        dec = torch.randint(3, VOCAB, (2, steps), device="cuda")
        a, b = (_cross_attention(m, ids, mask, dec) for m in (ours, ref))
        # (the cross-attention's share of the logits is small at random init: its own output is compared)
        assert (a - b).abs().max().item() <= 0.05 * b.abs().max().item(), steps
        assert b[1].abs().max().item() > 0.1 * b.abs().max().item()       # the padded row attends: not zeros


def _cross_attention(model, ids, mask, decoder_ids):
    """The output ``(batch, steps, d_model)`` float32 of the first decoder layer's cross-attention."""
    seen = []
    hook = model.model.decoder.layers[0].encoder_attn.register_forward_hook(
        lambda module, args, out: seen.append(out[0].detach().float()))
    try:
        with torch.no_grad():
            model(ids, attention_mask=mask, decoder_input_ids=decoder_ids)
    finally:
        hook.remove()
    return seen[0]
