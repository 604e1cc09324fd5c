"""Hugging Face transformers integration: ``import cupy_dash.transformers`` registers ``attn_implementation=
"cupy_dash"`` (an attention function in transformers' ``AttentionInterface``, the 2D padding mask function
:func:`padding_mask` in its ``AttentionMaskInterface``), built on :mod:`cupy_dash.torch`: dense calls on strided
views, padded and packed batches through :func:`cupy_dash.torch.attention_varlen`. Masks, causality, windows,
dtypes and what raises ``NotImplementedError``: docs/api.md, "Hugging Face transformers"; the framework-free
rules: :mod:`cupy_dash.core.transformers_rules`.
"""
from __future__ import annotations

import weakref

import torch
from transformers import AttentionInterface, AttentionMaskInterface

from ..core import transformers_rules as rules
from ..torch import attention, attention_varlen

__all__ = ["NAME", "register", "padding_mask", "make_attention"]

NAME = rules.NAME


def padding_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
                 attention_mask=None, use_vmap=False, config=None, **kwargs):
    """transformers' mask interface for ``attn_implementation="cupy_dash"``: the 2D boolean padding mask
    ``(batch, kv_length)`` (the last ``kv_length`` columns of the model's mask) where some token is padding, or
    shorter than ``kv_length`` (a static cache: its slots past the tokens seen are no keys), else None. Packing and
    windows are not in the mask: the attention function takes them from its arguments."""
    overlay = bool(use_vmap) or "or_masks" in getattr(mask_function, "__qualname__", "")   # e.g. a prefix-LM block
    rules.check_mask_overlay(overlay, getattr(config, "attention_chunk_size", None), kv_length + kv_offset)
    if attention_mask is None:
        seen = q_offset + q_length - kv_offset         # (generate drops an all-ones mask, static cache or not)
        if isinstance(seen, torch.Tensor):
            seen = int(seen)
        return None if seen >= kv_length else torch.ones(batch_size, seen, dtype=torch.bool, device=kwargs.get(
            "device"))
    mask = attention_mask[:, -kv_length:]
    if mask.shape[1] == kv_length and bool(mask.all()):
        return None
    return mask


class _LastPlan:
    """``plan(tensor, *key)`` for the last tensor seen: every layer of a forward gets the same mask or position
    tensor, so its host-side lengths are read once. The cached plan is used only for the same object, unmodified
    (its version counter), with the same key; inference tensors (no version counter) and traced calls are planned
    every time. One state tuple: a thread reads a whole one."""

    def __init__(self, plan):
        self.plan, self.state = plan, (None, None, None)

    def __call__(self, tensor, *key):
        if torch.compiler.is_compiling() or tensor.is_inference():
            return self.plan(tensor, *key)
        full_key = (tensor._version, tensor.data_ptr(), tuple(tensor.shape), key)
        ref, seen_key, value = self.state
        if ref is None or ref() is not tensor or seen_key != full_key:
            value = self.plan(tensor, *key)
            self.state = (weakref.ref(tensor), full_key, value)
        return value


def _rows(mask):
    """mask ``(B, S)`` -> (batch indices, positions) of its true entries in row-major order, device cu_seqlens
    ``(B + 1,)`` int32, the longest row."""
    cu, longest = rules.cu_seqlens(mask.sum(-1).tolist())
    return mask.nonzero(as_tuple=True), torch.tensor(cu, dtype=torch.int32, device=mask.device), longest


def _padding_plan(mask, seqlen_q, causal):
    """The unpadding of a padding mask ``(B, Sk)``: (q rows, cu_q, max_q, k rows, cu_k, max_k); the queries are
    the last ``seqlen_q`` positions (left padding when generating with a cache), or with other keys than queries and
    no causal mask (cross-attention: the mask is the encoder's) all ``seqlen_q`` of every row."""
    mask = mask.bool()
    k_plan = _rows(mask)
    if seqlen_q == mask.shape[1]:
        return k_plan + k_plan
    queries = mask[:, -seqlen_q:] if causal else mask.new_ones((mask.shape[0], seqlen_q))
    return _rows(queries) + k_plan


def _packing_plan(position_ids, batch):
    """Packed sequences from ``position_ids`` ``(B or 1, S)``: (cu_seqlens over the B * S flattened rows, longest)
    where some position does not follow its predecessor by one, else None (also for position ids of another rank,
    e.g. multimodal rotary ids ``(3, B, S)``)."""
    if position_ids.dim() != 2:
        return None
    pos = position_ids.expand(batch, -1) if position_ids.shape[0] != batch else position_ids
    start = torch.ones(pos.shape, dtype=torch.bool, device=pos.device)
    start[:, 1:] = pos[:, 1:] != pos[:, :-1] + 1
    starts = start.flatten().nonzero().flatten().tolist()
    if len(starts) == batch:
        return None
    cu, longest = rules.cu_seqlens_from_starts(starts, pos.numel())
    return torch.tensor(cu, dtype=torch.int32, device=pos.device), longest


_padding = _LastPlan(_padding_plan)
_packing = _LastPlan(_packing_plan)


def _target_dtype(query, module):
    """FlashAttention's rule for float32 inputs (e.g. norms kept in float32): the autocast dtype, else a quantized
    model's ``config.dtype`` (its Linear weights are packed integers), else the dtype of the module's first Linear
    weight."""
    if torch.is_autocast_enabled(query.device.type):
        return torch.get_autocast_dtype(query.device.type)
    config = getattr(module, "config", None)
    if hasattr(config, "_is_quantized") and getattr(config, "dtype", None) in (torch.bfloat16, torch.float16):
        return config.dtype
    weight = next((m.weight for m in module.modules() if isinstance(m, torch.nn.Linear)), None)
    if weight is None or weight.dtype not in (torch.bfloat16, torch.float16):
        raise rules.fp32_error(str(weight.dtype) if weight is not None else "absent")
    return weight.dtype


def _causal(module, is_causal):
    if is_causal is not None:
        return bool(is_causal)
    if not hasattr(module, "is_causal"):
        raise ValueError(f"attn_implementation={NAME!r}: cannot tell whether {type(module).__name__} is causal (no "
                         f"is_causal argument and no module.is_causal)")
    return bool(module.is_causal)


def _device_cu(cu, device):
    return cu.to(device=device, dtype=torch.int32) if torch.is_tensor(cu) else \
        torch.tensor(cu, dtype=torch.int32, device=device)


def _longest(max_length, cu):
    if max_length is not None:
        return int(max_length)
    cu = cu.tolist() if torch.is_tensor(cu) else list(cu)
    return max(b - a for a, b in zip(cu, cu[1:]))


def make_attention(schedule="auto", deterministic=True):
    """An attention function for transformers' ``AttentionInterface`` with these backward options."""

    def cupy_dash_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                            sliding_window=None, softcap=None, is_causal=None, **kwargs):
        """query ``(B, H, Sq, D)``, key / value ``(B, Hkv, Sk, D)``, attention_mask ``(B, Sk)`` or None ->
        ``(out (B, Sq, H, D), None)`` (docs/api.md, "Hugging Face transformers")."""
        config = getattr(module, "config", None)
        rules.check_call(config, dropout=dropout, sinks=kwargs.get("s_aux") is not None,
                         output_attentions=bool(kwargs.get("output_attentions", False)))
        rules.check_head_dims(config, query.shape[-1], value.shape[-1])
        if attention_mask is not None:
            rules.check_mask(attention_mask.dim(), str(attention_mask.dtype), attention_mask.is_floating_point())
        if query.dtype == torch.float32:
            dtype = _target_dtype(query, module)
            query, key, value = query.to(dtype), key.to(dtype), value.to(dtype)
        causal = _causal(module, is_causal)
        options = dict(causal=causal, softmax_scale=scaling, window=rules.window(sliding_window, causal),
                       schedule=schedule, deterministic=deterministic, softcap=softcap or 0.0)
        q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)      # (B, S, heads, D)
        batch, seqlen_q, heads, _ = q.shape

        if attention_mask is not None:
            if attention_mask.shape[1] > k.shape[1]:
                raise ValueError(f"attn_implementation={NAME!r}: the padding mask covers {attention_mask.shape[1]} "
                                 f"keys, the layer has {k.shape[1]}")
            k, v = k[:, :attention_mask.shape[1]], v[:, :attention_mask.shape[1]]    # a static cache's slots past it
            q_rows, cu_q, max_q, k_rows, cu_k, max_k = _padding(attention_mask, seqlen_q, causal)
            out = attention_varlen(q[q_rows], k[k_rows], v[k_rows], cu_q, cu_k, max_q, max_k, **options)
            return q.new_zeros((batch, seqlen_q, heads, out.shape[-1])).index_put(q_rows, out), None

        cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
        position_ids = kwargs.get("position_ids")
        if cu_q is not None and cu_k is not None:
            max_q, max_k = _longest(kwargs.get("max_length_q"), cu_q), _longest(kwargs.get("max_length_k"), cu_k)
            cu_q, cu_k = _device_cu(cu_q, q.device), _device_cu(cu_k, q.device)
        elif position_ids is not None and seqlen_q > 1 and (packed := _packing(position_ids, batch)) is not None:
            if k.shape[1] != seqlen_q:
                raise ValueError(f"attn_implementation={NAME!r}: packed sequences (restarting position_ids) need "
                                 f"as many keys as queries, got {k.shape[1]} keys for {seqlen_q} queries")
            cu_q, max_q = packed
            cu_k, max_k = cu_q, max_q
        else:
            return attention(q, k, v, **options), None
        out = attention_varlen(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu_q, cu_k, max_q, max_k,
                               **options)
        return out.view(batch, seqlen_q, heads, out.shape[-1]), None

    return cupy_dash_attention


_attention_functions = {}


def register(name=NAME, *, schedule="auto", deterministic=True):
    """Register the attention and mask functions as ``attn_implementation=name``; registering the same name and
    options again registers the same function objects (idempotent). Returns ``name``."""
    options = (schedule, bool(deterministic))
    if options not in _attention_functions:
        _attention_functions[options] = make_attention(schedule=schedule, deterministic=deterministic)
    AttentionInterface.register(name, _attention_functions[options])
    AttentionMaskInterface.register(name, padding_mask)
    return name


register()
