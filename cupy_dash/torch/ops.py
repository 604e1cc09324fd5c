"""The fixed-length torch ops and what :mod:`cupy_dash.torch.varlen` shares with them (the ``cupy_dash``
``torch.library`` fragment, the eager autograd path, the fake implementations' checks). Users import
:mod:`cupy_dash.torch` (docs/api.md); this module imports no other adapter module.
"""
import typing

import torch
from torch import Tensor
from torch.utils._python_dispatch import _get_current_dispatch_mode as _current_dispatch_mode

from ..core import api, problem
from ..schedule import check_window

__all__ = ["attention", "attention_forward", "attention_backward", "eager"]


def attention(q, k, v, causal=False, softmax_scale=None, schedule="auto", deterministic=True, window=(-1, -1),
              softcap=0.0):
    """Differentiable attention for torch tensors: q ``(B, Sq, H, D)``, k/v ``(B, Sk, Hkv, D)`` with
    ``H % Hkv == 0`` (GQA / MQA; the gradients of k, v are ``(B, Sk, Hkv, D)``) -> out ``(B, Sq, H, D)``
    (contiguous, dtype of q). Arguments as in :func:`cupy_dash.attention_forward` /
    :func:`cupy_dash.attention_backward`; ``schedule`` and ``deterministic`` apply to the backward, ``window``
    (left, right) and ``softcap`` (logit soft-capping, 0: none) to both passes.

    Runs :func:`attention_forward` (the op ``torch.ops.cupy_dash.attention_forward``) wherever torch traces
    (``torch.compile(fullgraph=True)``, ``mode="reduce-overhead"``, export, fake tensors, functorch transforms,
    dispatch modes), and the same functions through a plain ``torch.autograd.Function`` in eager calls on CUDA
    tensors (:func:`eager`): the same kernels and bits, less host time. ``torch.cuda.graph`` captures either
    (docs/api.md).
    """
    options = checked_options(causal, softmax_scale, schedule, deterministic, window, softcap)
    return differentiable((api.attention_forward, api.attention_backward), attention_forward, (), options, q, k, v)


def checked_options(causal, softmax_scale, schedule, deterministic, window, softcap) -> tuple:
    """The arguments of :func:`attention` / ``attention_varlen`` checked as :mod:`cupy_dash.core.api` checks them, as
    :class:`_Eager`'s ``options``: (causal, softmax_scale, schedule, deterministic, (left, right), softcap)."""
    problem.check_schedule(schedule)
    if softmax_scale is not None:
        softmax_scale = problem.check_scale(softmax_scale, None)
    causal, deterministic = problem.check_flag("causal", causal), problem.check_flag("deterministic", deterministic)
    window = check_window(window, causal)
    return causal, softmax_scale, schedule, deterministic, window, problem.check_softcap(softcap)


def differentiable(fns, op, extra, options, q, k, v) -> Tensor:
    """The output of :func:`attention` / ``attention_varlen``: cupy_dash's (forward, backward) functions ``fns``
    through :class:`_Eager` in eager calls (:func:`eager`), else the forward op ``op``; ``extra``: the arguments
    after v (varlen: cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k); ``options``: :func:`checked_options`."""
    if eager(q, k, v, *extra[:2]):
        return _Eager.apply(fns, extra, options, q, k, v)[0]
    causal, softmax_scale, schedule, deterministic, (left, right), softcap = options
    return op(q, k, v, *extra, causal, softmax_scale, schedule, deterministic, left, right, softcap)[0]


# NOTES: eager calls skip the dispatcher, whose register_autograd kernel is Python (a pytree scan, a redispatch, an
# autograd.Function of its own: ~9 µs more per forward, ~5 µs more per gradient; docs/api.md, torch section).
# Both paths run cupy_dash.core.api's functions, so the kernels and bits are the same; the ops stay wherever
# something traces or wraps the tensors, which the plain Function would not survive.
def eager(*tensors) -> bool:
    """Whether a call on ``tensors`` may take the plain autograd.Function: plain CUDA ``torch.Tensor`` objects
    (no subclass: fake, functional or distributed tensors), no functorch transform wrapping them, not under
    ``torch.compile`` tracing or an active torch dispatch mode (make_fx, selective checkpointing...)."""
    if torch.compiler.is_compiling():                  # first: Dynamo folds it, and traces nothing below
        return False
    for t in tensors:
        if type(t) is not Tensor or not t.is_cuda or _functorch_wrapped(t):
            return False
    return _current_dispatch_mode() is None


_functorch_wrapped = torch._C._functorch.is_functorch_wrapped_tensor


class _Eager(torch.autograd.Function):
    """The eager path of :func:`attention` and :func:`cupy_dash.torch.attention_varlen`: ``fns`` = cupy_dash's
    (forward, backward) functions, ``extra`` the positional arguments after q, k, v (varlen: cu_seqlens_q,
    cu_seqlens_k, max_seqlen_q, max_seqlen_k), ``options`` = (causal, softmax_scale, schedule, deterministic, window,
    softcap); the forward and its gradient as the ops compute them (:func:`register_gradient`), without the
    dispatcher."""

    @staticmethod
    def forward(ctx, fns, extra, options, q, k, v):
        causal, softmax_scale, _, _, window, softcap = options
        out, lse = fns[0](q, k, v, *extra, causal=causal, softmax_scale=softmax_scale, window=window,
                          softcap=softcap)
        # NOTES: the varlen cu_seqlens (extra[:2]) are saved tensors too: one changed in place before the backward
        # (a buffer refilled for the next micro-batch) raises, as on the op path, instead of giving other lengths
        ctx.save_for_backward(q, k, v, out, lse, *extra[:2])
        ctx.fns, ctx.rest, ctx.options = fns, extra[2:], options
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        if dout is None:
            return (None,) * 6
        refuse_double_backward()
        q, k, v, out, lse, *cu_seqlens = ctx.saved_tensors
        causal, softmax_scale, schedule, deterministic, window, softcap = ctx.options
        dq, dk, dv = ctx.fns[1](dout.contiguous(), q, k, v, out, lse, *cu_seqlens, *ctx.rest, causal=causal,
                                softmax_scale=softmax_scale, schedule=schedule, deterministic=deterministic,
                                window=window, softcap=softcap)
        return None, None, None, dq, dk, dv


def refuse_double_backward() -> None:
    """Raise where autograd records the gradient for a second derivative (``create_graph=True``): the backward is
    a kernel without a derivative of its own, and the gradient's graph would silently lack its terms."""
    if torch.is_grad_enabled():
        raise RuntimeError("cupy_dash.torch: a second derivative through attention (autograd.grad or backward with "
                           "create_graph=True) is not supported: the backward kernel has no derivative")


# ------------------------------------------------------------------------------------------------------------
# argument checks on metadata (fake / meta tensors): the checks of problem.validate, without a data pointer
# ------------------------------------------------------------------------------------------------------------
# DLPack device types; "meta" counts as CUDA so that shape inference on the meta device passes
_DLPACK_TYPES = {"cpu": 1, "cuda": 2, "meta": 2}


class _Dtype(typing.NamedTuple):
    """A torch dtype as interop.describe reads a dtype: its name, as interop gives a torch tensor's (``bfloat16``,
    ``float64``, ``int32``, ...), and its size in bytes; hashable, so that interop's dtype cache serves repeats."""
    name: str
    itemsize: int


class _Meta:
    """What :func:`cupy_dash.core.interop.describe` reads of an array (shape, dtype, byte strides, DLPack device),
    taken from a torch tensor's metadata only; its address stays unknown, so alignment is not checked."""
    __slots__ = ("shape", "dtype", "strides", "_device")

    def __init__(self, t: Tensor):
        self.shape = tuple(t.shape)
        self.dtype = _Dtype(str(t.dtype).rpartition(".")[2], t.element_size())
        self.strides = tuple(s * t.element_size() for s in t.stride())
        self._device = (_DLPACK_TYPES.get(t.device.type, 0), t.device.index or 0)

    def __dlpack_device__(self):
        return self._device


def _concrete(*tensors) -> bool:
    return all(isinstance(n, int) for t in tensors for n in (*t.shape, *t.stride()))


def _check_dims(layouts, **tensors):
    """Raise ValueError naming the first tensor whose rank is not that of its layout (``layouts``: name ->
    layout text, "" for the default entry)."""
    for name, t in tensors.items():
        layout = layouts.get(name, layouts[""])
        want = layout.count(",") + 1
        if t.dim() != want:
            raise ValueError(f"{name}: expected a {want}-D tensor {layout}, got shape {tuple(t.shape)}")


def check_options(schedule, causal, window, softcap) -> None:
    """The fake implementations' checks of the non-tensor arguments (the real ops' checks)."""
    problem.check_schedule(schedule)
    check_window(window, causal)
    problem.check_softcap(softcap)


def _check_meta(q, k, v, softmax_scale, schedule, causal, window, dout=None, out=None, lse=None, softcap=0.0):
    """The checks of the real op, as far as metadata allows: all of them when every size and stride is a plain
    int; with symbolic sizes (dynamic shapes) only the ranks (the real op checks the rest at run time)."""
    check_options(schedule, causal, window, softcap)
    backward = dout is not None
    tensors = dict(q=q, k=k, v=v, do=dout, out=out, lse=lse) if backward else dict(q=q, k=k, v=v)
    if not _concrete(*tensors.values()):
        _check_dims({"lse": "(B, H, Sq)", "": "(B, S, H, D)"}, **tensors)
        return
    views = {name: _Meta(t) for name, t in tensors.items()}
    problem.validate(views["q"], views["k"], views["v"], views.get("do"), views.get("out"), views.get("lse"),
                 softmax_scale=softmax_scale, backward=backward)


# ------------------------------------------------------------------------------------------------------------
# forward
# ------------------------------------------------------------------------------------------------------------
# NOTES: the two hot ops are defined with torch.library.Library (schema, one CompositeExplicitAutograd kernel,
# register_fake, register_autograd), not torch.library.custom_op, whose per-call Python wrapper (an output
# aliasing check; an autograd wrapper on the backward op too) cost ~90 µs of host time per backward
# (docs/architecture.md, "Where a call's host time goes"). The schemas are the ones custom_op inferred.
_lib = torch.library.Library("cupy_dash", "FRAGMENT")
_lib.define("attention_forward(Tensor q, Tensor k, Tensor v, bool causal=False, float? softmax_scale=None, "
            "str schedule=\"auto\", bool deterministic=True, SymInt window_left=-1, SymInt window_right=-1, "
            "float softcap=0.0) -> (Tensor, Tensor)")
_lib.define("attention_backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
            "bool causal=False, float? softmax_scale=None, str schedule=\"auto\", bool deterministic=True, "
            "SymInt window_left=-1, SymInt window_right=-1, float softcap=0.0) -> (Tensor, Tensor, Tensor)")
attention_forward = torch.ops.cupy_dash.attention_forward
attention_backward = torch.ops.cupy_dash.attention_backward
attention_forward.__doc__ = """The op ``torch.ops.cupy_dash.attention_forward``: q ``(B, Sq, H, D)``, k/v
    ``(B, Sk, Hkv, D)`` -> ``(out (B, Sq, H, D), lse (B, H, Sq) float32)``, as :func:`cupy_dash.attention_forward`
    with ``window=(window_left, window_right)``. ``schedule`` and ``deterministic`` are checked here and used by
    its gradient, :func:`attention_backward`."""
attention_backward.__doc__ = """The op ``torch.ops.cupy_dash.attention_backward``: dout, q, out ``(B, Sq, H, D)``,
    k/v ``(B, Sk, Hkv, D)``, lse ``(B, H, Sq)`` float32 -> ``(dq (B, Sq, H, D), dk, dv (B, Sk, Hkv, D))``, as
    :func:`cupy_dash.attention_backward` with ``window=(window_left, window_right)`` (contiguous, dtype of q)."""


def _attention_forward_impl(q, k, v, causal=False, softmax_scale=None, schedule="auto", deterministic=True,
                            window_left=-1, window_right=-1, softcap=0.0):
    problem.check_schedule(schedule)
    return api.attention_forward(q, k, v, causal=causal, softmax_scale=softmax_scale,
                                 window=(window_left, window_right), softcap=softcap)


_lib.impl("attention_forward", _attention_forward_impl, "CompositeExplicitAutograd")


@torch.library.register_fake("cupy_dash::attention_forward", lib=_lib)
def _attention_forward_fake(q, k, v, causal=False, softmax_scale=None, schedule="auto", deterministic=True,
                            window_left=-1, window_right=-1, softcap=0.0):
    _check_meta(q, k, v, softmax_scale, schedule, causal, (window_left, window_right), softcap=softcap)
    B, Sq, H, _ = q.shape
    return q.new_empty((B, Sq, H, v.shape[-1])), q.new_empty((B, H, Sq), dtype=torch.float32)


def register_gradient(name, backward, tensors=0) -> None:
    """Register the gradient of the forward op ``name``: its backward op ``backward`` called with dout, the
    forward's q, k, v, out, lse, its ``tensors`` tensor arguments after v (varlen: cu_seqlens_q, cu_seqlens_k) and
    the rest of its arguments (varlen: max_seqlen_q, max_seqlen_k; then causal ... softcap) as given."""
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs[:3], *output, *inputs[3:3 + tensors])
        ctx.options = inputs[3 + tensors:]
        ctx.mark_non_differentiable(output[1])
        ctx.set_materialize_grads(False)

    def gradient(ctx, dout, dlse):            # dlse is always None: lse is not differentiable
        if dout is None:
            return (None,) * (3 + tensors + len(ctx.options))
        refuse_double_backward()
        q, k, v, out, lse, *extra = ctx.saved_tensors
        # the kernels read dout through TMA: last dim contiguous, 16-byte strides (an expanded grad has stride 0)
        dq, dk, dv = backward(dout.contiguous(), q, k, v, out, lse, *extra, *ctx.options)
        return (dq, dk, dv) + (None,) * (tensors + len(ctx.options))

    torch.library.register_autograd(f"cupy_dash::{name}", gradient, setup_context=setup_context, lib=_lib)


register_gradient("attention_forward", attention_backward)


# ------------------------------------------------------------------------------------------------------------
# backward
# ------------------------------------------------------------------------------------------------------------
def _attention_backward_impl(dout, q, k, v, out, lse, causal=False, softmax_scale=None, schedule="auto",
                             deterministic=True, window_left=-1, window_right=-1, softcap=0.0):
    return api.attention_backward(dout, q, k, v, out, lse, causal=causal, softmax_scale=softmax_scale,
                                  schedule=schedule, deterministic=deterministic,
                                  window=(window_left, window_right), softcap=softcap)


_lib.impl("attention_backward", _attention_backward_impl, "CompositeExplicitAutograd")


@torch.library.register_fake("cupy_dash::attention_backward", lib=_lib)
def _attention_backward_fake(dout, q, k, v, out, lse, causal=False, softmax_scale=None, schedule="auto",
                             deterministic=True, window_left=-1, window_right=-1, softcap=0.0):
    _check_meta(q, k, v, softmax_scale, schedule, causal, (window_left, window_right), dout, out, lse,
                softcap=softcap)
    return q.new_empty(tuple(q.shape)), q.new_empty(tuple(k.shape)), q.new_empty(tuple(v.shape))

