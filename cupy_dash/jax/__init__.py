"""JAX integration: attention that works eagerly and under ``jax.jit``, ``jax.grad`` and ``jax.vmap`` (and inside
``jax.shard_map``), each call an XLA custom call run by a C XLA FFI handler or a ``buffer_callback``
(``CUPY_DASH_JAX_FFI``), with the bits of the functional API. Imported only on demand. Signatures, trace-time
preparation, vmap, varlen, errors and memory: docs/api.md, "JAX"; several GPUs and shard_map: "Several GPUs".
"""
import jax as _jax_lib

from ..core.varlen_launch import check_max_seqlen as _check_max_seqlen
from . import ops, varlen, varlen_dyn
from .callbacks import callback_runs
from .ops import attention, attention_backward, attention_forward

__all__ = ["attention", "attention_forward", "attention_backward", "attention_varlen", "callback_runs"]


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False,
                     softmax_scale=None, schedule="auto", deterministic=True, window=(-1, -1), softcap=0.0):
    """Differentiable varlen attention -> out ``(total_q, H, D)``; q ``(total_q, H, D)``, k / v
    ``(total_k, Hkv, D)``, cu_seqlens ``(B + 1,)``. ``schedule`` and ``deterministic`` apply to the backward,
    ``window`` and ``softcap`` to both passes (per sequence). cu_seqlens on the host: static (a new packing
    retraces); as JAX arrays: one program for every packing (:mod:`cupy_dash.jax.varlen_dyn`)."""
    base = ops._config(causal, softmax_scale, window=window, schedule=schedule, deterministic=deterministic,
                       softcap=softcap)
    max_q, max_k = _check_max_seqlen("max_seqlen_q", max_seqlen_q), _check_max_seqlen("max_seqlen_k", max_seqlen_k)
    traced = [isinstance(cu, _jax_lib.Array) for cu in (cu_seqlens_q, cu_seqlens_k)]
    if any(traced):
        if not all(traced):
            raise TypeError("cu_seqlens_q, cu_seqlens_k: pass both as JAX arrays or both on the host")
        return varlen_dyn.attention_device_lengths(q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, max_k, base)
    return varlen.attention_host_lengths(q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, max_k, base)
