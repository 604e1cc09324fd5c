"""Optional torch adapter: differentiable attention through ``torch.autograd.Function``.

Imported only on demand (``cupy_dash.attention`` with torch tensors, or ``import cupy_dash.torch``); importing
``cupy_dash`` itself never imports torch. Layout: q ``(B, Sq, H, D)``, k/v ``(B, Sk, Hkv, D)``, bf16/fp16, CUDA.
"""
from __future__ import annotations

import torch

from . import api

__all__ = ["DashAttention", "attention"]


class DashAttention(torch.autograd.Function):
    """``out = DashAttention.apply(q, k, v, causal, softmax_scale, schedule, deterministic)``.

    Forward: :func:`cupy_dash.attention_forward`, saving q, k, v, out and lse ``(B, H, Sq)``. Backward:
    :func:`cupy_dash.attention_backward` with the given schedule (a failure of the bounded dQ semaphore wait is
    reported by the next cupy_dash call or :func:`cupy_dash.check_errors`).
    """

    @staticmethod
    def forward(ctx, q, k, v, causal=False, softmax_scale=None, schedule="auto", deterministic=True):
        out, lse = api.attention_forward(q, k, v, causal=causal, softmax_scale=softmax_scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal = causal
        ctx.softmax_scale = softmax_scale
        ctx.schedule = schedule
        ctx.deterministic = deterministic
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = api.attention_backward(dout.contiguous(), q, k, v, out, lse, causal=ctx.causal,
                                            softmax_scale=ctx.softmax_scale, schedule=ctx.schedule,
                                            deterministic=ctx.deterministic)
        return dq, dk, dv, None, None, None, None


def attention(q, k, v, causal=False, softmax_scale=None, schedule="auto", deterministic=True):
    """Differentiable attention for torch tensors: q ``(B, Sq, H, D)``, k/v ``(B, Sk, Hkv, D)`` with
    ``H % Hkv == 0`` (GQA / MQA; the gradients of k, v are ``(B, Sk, Hkv, D)``) -> out ``(B, Sq, H, D)``.
    Arguments as in :func:`cupy_dash.attention_forward` / :func:`cupy_dash.attention_backward`.
    """
    api._check_schedule(schedule)
    causal, deterministic = api._check_flag("causal", causal), api._check_flag("deterministic", deterministic)
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if not needs_grad:
        return api.attention_forward(q, k, v, causal=causal, softmax_scale=softmax_scale)[0]
    return DashAttention.apply(q, k, v, causal, softmax_scale, schedule, deterministic)
