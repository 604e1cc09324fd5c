"""cupy_dash: deterministic FlashAttention-style attention for NVIDIA Hopper (sm_90a).

Public API (layout q (B, Sq, H, D), k/v (B, Sk, Hkv, D), bf16 or fp16, any ``__dlpack__`` CUDA tensor)::

    out, lse = cupy_dash.attention_forward(q, k, v, causal=False, softmax_scale=None)
    dq, dk, dv = cupy_dash.attention_backward(do, q, k, v, out, lse, causal=False, softmax_scale=None,
                                              schedule="auto", deterministic=True)

``cupy_dash.schedule`` builds, validates and simulates the dQ-reduction schedules and needs no GPU.
"""
from ._version import __version__
from . import schedule, reference
from .api import attention, attention_backward, attention_forward, check_errors

__all__ = ["__version__", "attention", "attention_backward", "attention_forward", "check_errors", "reference",
           "schedule"]
