"""The machinery of :mod:`cupy_dash.jax` (docs/api.md): the fixed-length entry points and what every JAX call
shares at trace time: the configuration and checks, the custom_vjp (:func:`differentiable`), the vmap rule and the
preparation of its custom calls (:func:`prepare`, over :mod:`cupy_dash.jax.callbacks`). The varlen modules build
on it.
"""

from __future__ import annotations

import collections
import functools

import jax
import numpy as np

from .. import config
from .. import schedule as _schedule
from ..core import interop, problem
from . import callbacks

__all__ = ["attention", "attention_forward", "attention_backward"]


# ------------------------------------------------------------------------------------------------------------
# public functions
# ------------------------------------------------------------------------------------------------------------
def attention(q, k, v, causal=False, softmax_scale=None, schedule="auto", deterministic=True, window=(-1, -1),
              softcap=0.0):
    """Differentiable attention: q ``(B, Sq, H, D)``, k/v ``(B, Sk, Hkv, D)`` with ``H % Hkv == 0`` (GQA / MQA;
    the cotangents of k, v are ``(B, Sk, Hkv, D)``) -> out ``(B, Sq, H, D)``, dtype of q. Arguments as in
    :func:`cupy_dash.attention_forward` / :func:`cupy_dash.attention_backward` (``schedule``, ``deterministic``:
    the backward's; ``window`` and ``softcap``: the sliding window and logit cap of both passes). Works eagerly
    and under ``jax.jit`` / ``grad`` / ``vmap`` (docs/api.md)."""
    cfg = _config(causal, softmax_scale, window=window, schedule=schedule, deterministic=deterministic,
                  softcap=softcap)
    return _attention_jit(cfg, *callbacks.vary_together(q, k, v))


def attention_forward(q, k, v, *, causal=False, softmax_scale=None, window=(-1, -1), softcap=0.0):
    """Forward: q ``(B, Sq, H, D)``, k/v ``(B, Sk, Hkv, D)`` -> ``(out (B, Sq, H, D), lse (B, H, Sq) float32)``,
    as :func:`cupy_dash.attention_forward` (``window``: FlashAttention's sliding window). ``out`` is
    differentiable (gradient: :func:`attention_backward` with this window and cap, default schedule); ``lse`` is
    not."""
    cfg = _config(causal, softmax_scale, window=window, softcap=softcap)
    return _forward_jit(cfg, *callbacks.vary_together(q, k, v))


def attention_backward(dout, q, k, v, out, lse, *, causal=False, softmax_scale=None, schedule="auto",
                       deterministic=True, window=(-1, -1), softcap=0.0):
    """Backward: dout, q, out ``(B, Sq, H, D)``, k/v ``(B, Sk, Hkv, D)``, lse ``(B, H, Sq)`` float32 ->
    ``(dq (B, Sq, H, D), dk, dv (B, Sk, Hkv, D))``, dtype of q, as :func:`cupy_dash.attention_backward` (``window``:
    and ``softcap``: the forward's)."""
    cfg = _config(causal, softmax_scale, window=window, schedule=schedule, deterministic=deterministic,
                  softcap=softcap)
    return _backward_jit(cfg, dout, q, k, v, out, lse)


_Config = collections.namedtuple("_Config", "causal scale window schedule deterministic ffi knobs softcap")


def _config(causal, softmax_scale, window=(-1, -1), schedule="auto", deterministic=True, softcap=0.0) -> _Config:
    """The static (hashable) arguments, checked as :mod:`cupy_dash.core.api` checks them (window: right side 0 when
    causal; its canonical form depends on the shapes, see :func:`_problem`); ``ffi``: whether the calls go
    through the C handler (:func:`_use_ffi`); ``knobs``: :func:`cupy_dash.config.fingerprint`, the knobs that decide
    what a traced call launches (table form, tile, writers, fold, ...), so that a change of one retraces and
    prepares the call anew (:func:`prepare`'s key)."""
    causal = problem.check_flag("causal", causal)
    deterministic = problem.check_flag("deterministic", deterministic)
    problem.check_schedule(schedule)
    scale = None if softmax_scale is None else problem.check_scale(softmax_scale, None)
    return _Config(causal, scale, _schedule.check_window(window, causal), schedule, deterministic, _use_ffi(),
                   config.fingerprint(), problem.check_softcap(softcap))


def _use_ffi() -> bool:
    """The C FFI handler unless ``CUPY_DASH_JAX_FFI=0`` asks for the Python buffer_callback, or the extension
    ``cupy_dash.jax._xla_ffi`` is not built (``CUPY_DASH_JAX_FFI=1`` then raises when a call is traced)."""
    choice = config.JAX_FFI.get()
    return choice is not False and (choice is True or _ffi_built())


@functools.lru_cache(maxsize=None)
def _ffi_built() -> bool:
    try:
        from . import _xla_ffi  # noqa: F401
    except ImportError:
        return False
    return True


# ------------------------------------------------------------------------------------------------------------
# differentiation: one custom_vjp for every entry point
# ------------------------------------------------------------------------------------------------------------
def differentiable(forward, backward, with_lse=False):
    """The jitted differentiable call ``(cfg, q, k, v, *extra) -> out`` (``with_lse``: ``(out, lse)``, lse not
    differentiable), ``cfg`` static. ``forward(cfg, q, k, v, *extra) -> (out, lse)``, ``backward(cfg, dout, q, k,
    v, out, lse, *extra) -> (dq, dk, dv)``: the custom calls; ``extra`` (the varlen device cu_seqlens) gets no
    cotangent."""
    @functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
    def attention(cfg, *operands):
        out, lse = forward(cfg, *operands)
        return (out, lse) if with_lse else out

    def attention_fwd(cfg, *operands):
        if with_lse:
            operands = tuple(x.value for x in operands)     # symbolic_zeros: primals arrive wrapped
        out, lse = forward(cfg, *operands)
        return ((out, lse) if with_lse else out), (operands, out, lse)

    def attention_bwd(cfg, residuals, cotangents):
        operands, out, lse = residuals
        dout = _out_cotangent(cotangents, operands[0], operands[2]) if with_lse else cotangents
        grads = backward(cfg, dout, *operands[:3], out, lse, *operands[3:])
        return (*grads, *(None,) * (len(operands) - 3))

    attention.defvjp(attention_fwd, attention_bwd, symbolic_zeros=with_lse)
    return jax.jit(attention, static_argnums=(0,))


def _out_cotangent(cotangents, q, v):
    """The cotangent of out of ``(out, lse)`` (symbolic zeros: zeros of out's shape, q's with v's head dim); raises
    when lse has one."""
    import jax.numpy as jnp
    from jax.custom_derivatives import SymbolicZero
    dout, dlse = cotangents
    if not isinstance(dlse, SymbolicZero):
        raise ValueError("lse: the output lse of cupy_dash.jax.attention_forward is not differentiable, but the "
                         "differentiated function depends on it; use only out, or stop_gradient(lse)")
    return jnp.zeros((*q.shape[:-1], v.shape[-1]), q.dtype) if isinstance(dout, SymbolicZero) else dout


# ------------------------------------------------------------------------------------------------------------
# batching: custom_vmap folds the mapped axis into B
# ------------------------------------------------------------------------------------------------------------
def _fold(x, batched, axis_size):
    """``(N, B, ...)`` -> ``(N*B, ...)`` (an unmapped ``x`` ``(B, ...)`` is broadcast to ``(N, B, ...)`` first)."""
    import jax.numpy as jnp
    if not batched:
        x = jnp.broadcast_to(x, (axis_size, *x.shape))
    return x.reshape(axis_size * x.shape[1], *x.shape[2:])


def _unfold(x, axis_size):
    return x.reshape(axis_size, x.shape[0] // axis_size, *x.shape[1:])


def _batched(call):
    """``call(cfg, *arrays)`` (arrays with a leading batch axis -> tuple of such arrays) with the folding vmap rule
    (one custom_vmap per ``cfg``), its results varying over the manual mesh axes of its operands
    (:func:`cupy_dash.jax.callbacks.vary_like`)."""
    @functools.lru_cache(maxsize=None)
    def vmapped(cfg):
        from jax.custom_batching import custom_vmap
        op = custom_vmap(lambda *args: call(cfg, *args))

        @op.def_vmap
        def rule(axis_size, in_batched, *args):
            outs = op(*(_fold(x, b, axis_size) for x, b in zip(args, in_batched)))
            return tuple(_unfold(x, axis_size) for x in outs), tuple(True for _ in outs)
        return op

    def batched(cfg, *args):
        # NOTES: outside custom_vmap: the function it traces sees its operands without their varying mesh axes
        return callbacks.vary_like(vmapped(cfg)(*args), args)
    return batched


# ------------------------------------------------------------------------------------------------------------
# trace time: checks on shapes, the preparation cache, the mechanism
# ------------------------------------------------------------------------------------------------------------
class _Aval:
    """What :func:`cupy_dash.core.problem.validate` reads of an operand, from its shape and dtype (``packed``: a varlen
    operand, read as a batch of one): a contiguous array on a CUDA device (placeholder device 0: XLA picks the
    device at run time) whose address is not known."""
    __slots__ = ("shape", "dtype", "strides")

    def __init__(self, x, packed=False):
        shape = tuple(int(n) for n in x.shape)
        self.shape = (1, *shape) if packed else shape
        self.dtype = np.dtype(x.dtype)
        self.strides = tuple(int(s) * self.dtype.itemsize for s in interop.contiguous_strides(self.shape))

    def __dlpack_device__(self):
        return interop.DLPACK_CUDA, 0


def _problem(cfg, q, k, v, dout=None, out=None, lse=None, lengths=None):
    """(validated problem, ``cfg`` with the window in canonical form for these lengths). ``lengths``:
    ``(max_seqlen_q, max_seqlen_k)`` of a varlen call, whose 3-D packed operands are validated as one batch and
    whose window is canonical for the longest sequences, as the eager varlen functions do."""
    arrays = (q, k, v, dout, out, lse)
    if lengths is not None:
        for name, x in zip(("q", "k", "v", "dout", "out"), arrays):
            if x is not None and len(x.shape) != 3:
                raise ValueError(f"{name}: expected a 3-D packed tensor (total, heads, head_dim), got shape "
                                 f"{x.shape}")
    views = [_Aval(x, packed=lengths is not None) if x is not None else None for x in arrays]
    p = problem.validate(*views, softmax_scale=cfg.scale, backward=dout is not None, softcap=cfg.softcap,
                         do_name="dout")
    Sq, Sk = lengths or (p.Sq, p.Sk)
    return p, cfg._replace(window=_schedule.canonical_window(cfg.window, Sq, Sk, cfg.causal))


def prepare(kind, cls, p, cfg, *args, extra=(), backward=False):
    """The call ``cls(p, cfg, *args)`` (a backward: ``cls(p, cfg, *args, spin_timeout_ns)``), made at the first
    trace of its key and kept for the life of the process (:func:`cupy_dash.jax.callbacks._get`). The key: ``kind``,
    the mechanism, the plan knobs, what the launches depend on of ``p`` and ``cfg`` (a backward: also its schedule
    and CUPY_DASH_SPIN_TIMEOUT_MS, read now) and ``extra``."""
    key = (kind, cfg.ffi, cfg.knobs, p.dtype, (p.B, p.Sq, p.Sk, p.H, p.Hkv, p.D, p.Dv), p.scale, p.softcap,
           cfg.causal, cfg.window)
    if backward:
        spin_timeout_ns = config.spin_timeout_ns()
        key, args = (*key, cfg.schedule, cfg.deterministic, spin_timeout_ns), (*args, spin_timeout_ns)
    return callbacks._get((*key, *extra), lambda: cls(p, cfg, *args).prepare())


def _forward_call(cfg, q, k, v):
    p, cfg = _problem(cfg, q, k, v)
    return prepare("fwd", callbacks._Forward, p, cfg).bind(q, k, v)


def _backward_call(cfg, dout, q, k, v, out, lse):
    p, cfg = _problem(cfg, q, k, v, dout, out, lse)
    return prepare("bwd", callbacks._Backward, p, cfg, backward=True).bind(dout, q, k, v, out, lse)


_forward, _backward = _batched(_forward_call), _batched(_backward_call)
_attention_jit = differentiable(_forward, _backward)
_forward_jit = differentiable(_forward, _backward, with_lse=True)
_backward_jit = jax.jit(_backward, static_argnums=(0,))
