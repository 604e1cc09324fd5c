"""Optional JAX adapter: differentiable attention through ``jax.custom_vjp``, eager mode only.

Imported only on demand (``cupy_dash.attention`` with JAX arrays, or ``import cupy_dash.jax``); importing
``cupy_dash`` itself never imports jax. Layout: q ``(B, Sq, H, D)``, k/v ``(B, Sk, Hkv, D)``, bf16/fp16, on a
GPU. ``jax.grad`` / ``jax.vjp`` work on concrete arrays; inside ``jax.jit`` (or ``vmap``) the inputs are
tracers and the call raises TypeError: running CuPy-launched kernels inside a compiled XLA program would need
an XLA FFI custom call, which is out of scope. Tip: set ``XLA_PYTHON_CLIENT_PREALLOCATE=false`` so that XLA
leaves GPU memory for CuPy's pool.
"""
from __future__ import annotations

import functools

import jax

from . import api

__all__ = ["attention"]


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6, 7))
def _attention(q, k, v, causal, softmax_scale, schedule, deterministic, window):
    return api.attention_forward(q, k, v, causal=causal, softmax_scale=softmax_scale, window=window)[0]


def _attention_fwd(q, k, v, causal, softmax_scale, schedule, deterministic, window):
    out, lse = api.attention_forward(q, k, v, causal=causal, softmax_scale=softmax_scale, window=window)
    return out, (q, k, v, out, lse)


def _attention_bwd(causal, softmax_scale, schedule, deterministic, window, residuals, dout):
    q, k, v, out, lse = residuals
    dq, dk, dv = api.attention_backward(dout, q, k, v, out, lse, causal=causal, softmax_scale=softmax_scale,
                                        schedule=schedule, deterministic=deterministic, window=window)
    return dq, dk, dv


_attention.defvjp(_attention_fwd, _attention_bwd)


def attention(q, k, v, causal=False, softmax_scale=None, schedule="auto", deterministic=True, window=(-1, -1)):
    """Differentiable attention for JAX arrays (eager): q ``(B, Sq, H, D)``, k/v ``(B, Sk, Hkv, D)`` with
    ``H % Hkv == 0`` (GQA / MQA; the cotangents of k, v are ``(B, Sk, Hkv, D)``) -> out ``(B, Sq, H, D)``.
    Arguments as in :func:`cupy_dash.attention_forward` / :func:`cupy_dash.attention_backward`; ``window``
    (left, right) is the sliding window of both passes.
    Raises TypeError inside ``jax.jit`` / ``vmap`` (inputs are tracers).
    """
    api._check_schedule(schedule)
    if softmax_scale is not None:
        softmax_scale = api._check_scale(softmax_scale, None)
    causal, deterministic = api._check_flag("causal", causal), api._check_flag("deterministic", deterministic)
    window = api._check_window(window, causal)       # a tuple of ints: hashable, as nondiff_argnums needs
    return _attention(q, k, v, causal, softmax_scale, schedule, deterministic, window)
