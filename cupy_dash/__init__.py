"""cupy_dash: deterministic FlashAttention-style attention for NVIDIA Hopper (sm_90a).

Public API (layout q (B, Sq, H, D), k/v (B, Sk, Hkv, D), bf16 or fp16, any ``__dlpack__`` CUDA tensor)::

    out, lse = cupy_dash.attention_forward(q, k, v, causal=False, softmax_scale=None)
    dq, dk, dv = cupy_dash.attention_backward(do, q, k, v, out, lse, causal=False, softmax_scale=None,
                                              schedule="auto", deterministic=True)

Packed variable-length batches: ``attention_forward_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
max_seqlen_k, ...)`` (q (total_q, H, D)) and ``attention_backward_varlen(do, q, k, v, out, lse, cu_seqlens_q,
cu_seqlens_k, max_seqlen_q, max_seqlen_k, ...)``; ``prepare_varlen_backward(...)`` builds a future packing's
schedule table ahead of time (e.g. from a data-loader thread).

``cupy_dash.schedule`` builds, validates and simulates the dQ-reduction schedules and needs no GPU.
``cupy_dash.torch`` (registered torch ops) and ``cupy_dash.jax`` are imported on first access, so importing
``cupy_dash`` never imports torch or JAX.
"""
from ._version import __version__
from . import schedule, reference
from .api import attention, attention_backward, attention_forward, check_errors
from .varlen import attention_backward_varlen, attention_forward_varlen, prepare_varlen_backward

__all__ = ["__version__", "attention", "attention_backward", "attention_backward_varlen", "attention_forward",
           "attention_forward_varlen", "check_errors", "prepare_varlen_backward", "reference", "schedule"]

_LAZY_SUBMODULES = ("torch", "jax")


def __getattr__(name):
    """``cupy_dash.torch`` / ``cupy_dash.jax`` without an explicit import: the adapter is imported on first access
    (ModuleNotFoundError if its framework is not installed)."""
    if name in _LAZY_SUBMODULES:
        import importlib
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
