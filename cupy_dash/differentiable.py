"""The framework-neutral differentiable entry point, ``cupy_dash.attention``: it hands torch tensors and JAX arrays
to their adapters, so it sits above them; the core (:mod:`cupy_dash.core.api`) never imports an adapter.
"""
from .core import interop
from .core.api import attention_forward
from .core.problem import check_flag, check_schedule
from .schedule import check_window


def attention(q, k, v, *, causal=False, softmax_scale=None, schedule="auto", deterministic=True, window=(-1, -1)):
    """Differentiable attention; returns ``out`` ``(B, Sq, H, D)`` in the caller's type.

    torch tensors go through the registered op ``torch.ops.cupy_dash.attention_forward`` (autograd, torch.compile
    and CUDA graphs; :func:`cupy_dash.torch.attention`), JAX arrays through :func:`cupy_dash.jax.attention`
    (``jax.custom_vjp``; eagerly and under ``jax.jit`` / ``grad`` / ``vmap``); CuPy and other arrays get the
    forward only. Shapes, dtypes and the other arguments (``window``: the sliding
    window (left, right), used by the forward and the backward alike) are as in :func:`attention_forward` /
    :func:`cupy_dash.attention_backward`.
    """
    causal = check_flag("causal", causal)
    check_flag("deterministic", deterministic)
    check_window(window, causal)
    fw = interop.framework_of(q)
    if fw == "torch":
        from .torch import attention as torch_attention       # imported on use: the framework may be absent
        return torch_attention(q, k, v, causal=causal, softmax_scale=softmax_scale, schedule=schedule,
                               deterministic=deterministic, window=window)
    if fw == "jax":
        from .jax import attention as jax_attention           # imported on use: the framework may be absent
        return jax_attention(q, k, v, causal=causal, softmax_scale=softmax_scale, schedule=schedule,
                             deterministic=deterministic, window=window)
    check_schedule(schedule)
    return attention_forward(q, k, v, causal=causal, softmax_scale=softmax_scale, window=window)[0]
