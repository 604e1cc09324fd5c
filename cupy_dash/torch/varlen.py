"""The torch ops of packed variable-length batches, ``attention_forward_varlen`` / ``attention_backward_varlen``
(registered in the ``cupy_dash`` fragment of :mod:`cupy_dash.torch.ops`), and :func:`attention_varlen`; users import
them from :mod:`cupy_dash.torch`. Layouts, autograd, where the backward finds the lengths and CUDA graph capture:
docs/api.md ("Packed variable-length batches", the torch section).
"""
import torch

from ..core import problem, varlen
from .ops import _check_dims, _lib, check_options, checked_options, differentiable, register_gradient

__all__ = ["attention_varlen", "attention_forward_varlen", "attention_backward_varlen"]


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False,
                     softmax_scale=None, schedule="auto", deterministic=True, window=(-1, -1), softcap=0.0):
    """Differentiable varlen attention for torch tensors: q ``(total_q, H, D)``, k / v ``(total_k, Hkv, D)``,
    int32 ``cu_seqlens`` ``(B + 1,)`` -> out ``(total_q, H, D)``; arguments as in
    :func:`cupy_dash.attention_forward_varlen` / :func:`cupy_dash.attention_backward_varlen`, ``schedule`` and
    ``deterministic`` the backward's. Eager calls skip the dispatcher as :func:`cupy_dash.torch.attention` does."""
    options = checked_options(causal, softmax_scale, schedule, deterministic, window, softcap)
    return differentiable((varlen.attention_forward_varlen, varlen.attention_backward_varlen),
                          attention_forward_varlen, (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k), options,
                          q, k, v)


def _check_packed(**tensors):
    _check_dims({"lse": "(H, total_q)", "": "(total, heads, head_dim)"}, **tensors)


# NOTES: defined with torch.library.Library like the fixed-length ops (ops.py says why); the schemas
# are the ones torch.library.custom_op inferred from these signatures.
_lib.define("attention_forward_varlen(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
            "SymInt max_seqlen_q, SymInt max_seqlen_k, bool causal=False, float? softmax_scale=None, "
            "str schedule=\"auto\", bool deterministic=True, SymInt window_left=-1, SymInt window_right=-1, "
            "float softcap=0.0) -> (Tensor, Tensor)")
_lib.define("attention_backward_varlen(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
            "Tensor cu_seqlens_q, Tensor cu_seqlens_k, SymInt max_seqlen_q, SymInt max_seqlen_k, bool causal=False, "
            "float? softmax_scale=None, str schedule=\"auto\", bool deterministic=True, SymInt window_left=-1, "
            "SymInt window_right=-1, float softcap=0.0) -> (Tensor, Tensor, Tensor)")
attention_forward_varlen = torch.ops.cupy_dash.attention_forward_varlen
attention_backward_varlen = torch.ops.cupy_dash.attention_backward_varlen
attention_forward_varlen.__doc__ = """The op ``torch.ops.cupy_dash.attention_forward_varlen``:
    :func:`cupy_dash.attention_forward_varlen` (``schedule`` and ``deterministic`` are checked here and used by its
    gradient)."""
attention_backward_varlen.__doc__ = """The op ``torch.ops.cupy_dash.attention_backward_varlen``:
    :func:`cupy_dash.attention_backward_varlen`."""


def _forward_impl(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False,
                  softmax_scale=None, schedule="auto", deterministic=True, window_left=-1, window_right=-1,
                  softcap=0.0):
    problem.check_schedule(schedule)
    return varlen.attention_forward_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                           causal=causal, softmax_scale=softmax_scale,
                                           window=(window_left, window_right), softcap=softcap)


_lib.impl("attention_forward_varlen", _forward_impl, "CompositeExplicitAutograd")


@torch.library.register_fake("cupy_dash::attention_forward_varlen", lib=_lib)
def _forward_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False,
                  softmax_scale=None, schedule="auto", deterministic=True, window_left=-1, window_right=-1,
                  softcap=0.0):
    check_options(schedule, causal, (window_left, window_right), softcap)
    _check_packed(q=q, k=k, v=v)
    total_q, H, _ = q.shape
    return q.new_empty((total_q, H, v.shape[-1])), q.new_empty((H, total_q), dtype=torch.float32)


register_gradient("attention_forward_varlen", attention_backward_varlen, tensors=2)


def _backward_impl(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False,
                   softmax_scale=None, schedule="auto", deterministic=True, window_left=-1, window_right=-1,
                   softcap=0.0):
    return varlen.attention_backward_varlen(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                            max_seqlen_k, causal=causal, softmax_scale=softmax_scale,
                                            window=(window_left, window_right), schedule=schedule,
                                            deterministic=deterministic, softcap=softcap)


_lib.impl("attention_backward_varlen", _backward_impl, "CompositeExplicitAutograd")


@torch.library.register_fake("cupy_dash::attention_backward_varlen", lib=_lib)
def _backward_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False,
                   softmax_scale=None, schedule="auto", deterministic=True, window_left=-1, window_right=-1,
                   softcap=0.0):
    check_options(schedule, causal, (window_left, window_right), softcap)
    _check_packed(dout=dout, q=q, k=k, v=v, out=out, lse=lse)
    return q.new_empty(tuple(q.shape)), q.new_empty(tuple(k.shape)), q.new_empty(tuple(v.shape))
