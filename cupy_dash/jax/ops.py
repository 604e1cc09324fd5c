"""The machinery of :mod:`cupy_dash.jax` (the module users import, whose docstring describes the API): the
fixed-length entry points and what every JAX call of cupy_dash shares (the trace-time configuration and
checks, the per-device preparation cache, the Python callbacks' base classes). :mod:`cupy_dash.jax._ffi` (the C
handler), :mod:`cupy_dash.jax.varlen` and :mod:`cupy_dash.jax.varlen_dyn` build on it; it imports none of them
at module level (the C handler is loaded on use, as the mechanism a call picks).
"""

from __future__ import annotations

import collections
import functools
import sys
import threading

import jax
import numpy as np

from .. import config
from .. import schedule as _schedule
from ..core import api, interop
from ..cuda import jit, kernels, launchers
from ..cuda.errors import jit_record, record_shared
from ..schedule import compact_device

__all__ = ["attention", "attention_forward", "attention_backward"]

_lock = threading.RLock()
_prepared: dict = {}                           # key -> _Forward / _Backward, kept for the life of the process
callback_runs = collections.Counter()          # executions of the Python callbacks, by "forward" / "backward"


# ------------------------------------------------------------------------------------------------------------
# public functions
# ------------------------------------------------------------------------------------------------------------
def attention(q, k, v, causal=False, softmax_scale=None, schedule="auto", deterministic=True, window=(-1, -1),
              softcap=0.0):
    """Differentiable attention: q ``(B, Sq, H, D)``, k/v ``(B, Sk, Hkv, D)`` with ``H % Hkv == 0`` (GQA / MQA;
    the cotangents of k, v are ``(B, Sk, Hkv, D)``) -> out ``(B, Sq, H, D)``, dtype of q. Arguments as in
    :func:`cupy_dash.attention_forward` / :func:`cupy_dash.attention_backward` (``schedule``, ``deterministic``:
    the backward's; ``window`` and ``softcap``: the sliding window and logit cap of both passes). Works eagerly
    and under ``jax.jit`` / ``grad`` / ``vmap`` (module docstring)."""
    cfg = _config(causal, softmax_scale, window=window, schedule=schedule, deterministic=deterministic,
                  softcap=softcap)
    return _attention_jit(q, k, v, cfg)


def attention_forward(q, k, v, *, causal=False, softmax_scale=None, window=(-1, -1), softcap=0.0):
    """Forward: q ``(B, Sq, H, D)``, k/v ``(B, Sk, Hkv, D)`` -> ``(out (B, Sq, H, D), lse (B, H, Sq) float32)``,
    as :func:`cupy_dash.attention_forward` (``window``: FlashAttention's sliding window). ``out`` is
    differentiable (gradient: :func:`attention_backward` with this window and cap, default schedule); ``lse`` is
    not."""
    cfg = _config(causal, softmax_scale, window=window, softcap=softcap)
    return _forward_jit(q, k, v, cfg)


def attention_backward(dout, q, k, v, out, lse, *, causal=False, softmax_scale=None, schedule="auto",
                       deterministic=True, window=(-1, -1), softcap=0.0):
    """Backward: dout, q, out ``(B, Sq, H, D)``, k/v ``(B, Sk, Hkv, D)``, lse ``(B, H, Sq)`` float32 ->
    ``(dq (B, Sq, H, D), dk, dv (B, Sk, Hkv, D))``, dtype of q, as :func:`cupy_dash.attention_backward` (``window``:
    and ``softcap``: the forward's)."""
    cfg = _config(causal, softmax_scale, window=window, schedule=schedule, deterministic=deterministic,
                  softcap=softcap)
    return _backward_jit(dout, q, k, v, out, lse, cfg)


_Config = collections.namedtuple("_Config", "causal scale window schedule deterministic ffi compact_env softcap")


def _config(causal, softmax_scale, window=(-1, -1), schedule="auto", deterministic=True, softcap=0.0) -> _Config:
    """The static (hashable) arguments, checked as :mod:`cupy_dash.core.api` checks them (window: right side 0 when
    causal; its canonical form depends on the shapes, see :func:`_problem`); ``ffi``: whether the calls go
    through the C handler (:func:`_use_ffi`); ``compact_env``: CUPY_DASH_COMPACT_TABLES, which a traced backward
    reads (compact_device.table_form), so that a change of it retraces."""
    causal = api.check_flag("causal", causal)
    deterministic = api.check_flag("deterministic", deterministic)
    api.check_schedule(schedule)
    scale = None if softmax_scale is None else api.check_scale(softmax_scale, None)
    return _Config(causal, scale, _schedule.check_window(window, causal), schedule, deterministic, _use_ffi(),
                   config.COMPACT_TABLES.get(), api.check_softcap(softcap))


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
# differentiation: custom_vjp around the two calls
# ------------------------------------------------------------------------------------------------------------
@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _attention(q, k, v, cfg):
    return _forward_op(cfg)(q, k, v)[0]


def _attention_fwd(q, k, v, cfg):
    out, lse = _forward_op(cfg)(q, k, v)
    return out, (q, k, v, out, lse)


def _attention_bwd(cfg, residuals, dout):
    return tuple(_backward_op(cfg)(dout, *residuals))


_attention.defvjp(_attention_fwd, _attention_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _forward(q, k, v, cfg):
    return tuple(_forward_op(cfg)(q, k, v))


def _forward_fwd(q, k, v, cfg):
    q, k, v = (x.value for x in (q, k, v))              # symbolic_zeros: primals arrive wrapped
    out, lse = _forward_op(cfg)(q, k, v)
    return (out, lse), (q, k, v, out, lse)


def _forward_bwd(cfg, residuals, cotangents):
    import jax.numpy as jnp
    from jax.custom_derivatives import SymbolicZero
    dout, dlse = cotangents
    if not isinstance(dlse, SymbolicZero):
        raise ValueError("lse: the output lse of cupy_dash.jax.attention_forward is not differentiable, but the "
                         "differentiated function depends on it; use only out, or stop_gradient(lse)")
    q = residuals[0]
    if isinstance(dout, SymbolicZero):
        dout = jnp.zeros(q.shape, q.dtype)
    return tuple(_backward_op(cfg)(dout, *residuals))


_forward.defvjp(_forward_fwd, _forward_bwd, symbolic_zeros=True)

_attention_jit = jax.jit(_attention, static_argnums=(3,))
_forward_jit = jax.jit(_forward, static_argnums=(3,))
_backward_jit = jax.jit(lambda dout, q, k, v, out, lse, cfg: _backward_op(cfg)(dout, q, k, v, out, lse),
                        static_argnums=(6,))


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
    """``call`` (arrays with a leading batch axis -> tuple of such arrays) with the folding vmap rule."""
    from jax.custom_batching import custom_vmap
    op = custom_vmap(call)

    @op.def_vmap
    def rule(axis_size, in_batched, *args):
        outs = op(*(_fold(x, b, axis_size) for x, b in zip(args, in_batched)))
        return tuple(_unfold(x, axis_size) for x in outs), tuple(True for _ in outs)
    return op


@functools.lru_cache(maxsize=None)
def _forward_op(cfg):
    return _batched(lambda q, k, v: _forward_call(q, k, v, cfg))


@functools.lru_cache(maxsize=None)
def _backward_op(cfg):
    return _batched(lambda dout, q, k, v, out, lse: _backward_call(dout, q, k, v, out, lse, cfg))


# ------------------------------------------------------------------------------------------------------------
# trace time: checks on shapes, preparation, the buffer_callback
# ------------------------------------------------------------------------------------------------------------
class _Aval:
    """What :func:`cupy_dash.core.api.validate` reads of an operand, from its shape and dtype: a contiguous array on
    a CUDA device (placeholder device 0: XLA picks the device at run time) whose address is not known."""
    __slots__ = ("shape", "dtype", "strides")

    def __init__(self, x):
        self.shape = tuple(int(n) for n in x.shape)
        self.dtype = np.dtype(x.dtype)
        self.strides = tuple(int(s) * self.dtype.itemsize for s in interop.contiguous_strides(self.shape))

    def __dlpack_device__(self):
        return interop.DLPACK_CUDA, 0


def _problem(cfg, q, k, v, dout=None, out=None, lse=None):
    """(validated problem, ``cfg`` with the window in canonical form for these lengths)."""
    backward = dout is not None
    views = [_Aval(x) if x is not None else None for x in (q, k, v, dout, out, lse)]
    p = api.validate(*views, softmax_scale=cfg.scale, backward=backward, softcap=cfg.softcap)
    return p, cfg._replace(window=_schedule.canonical_window(cfg.window, p.Sq, p.Sk, cfg.causal))


def _forward_call(q, k, v, cfg):
    p, cfg = _problem(cfg, q, k, v)
    key = ("fwd", cfg.ffi, p.dtype, (p.B, p.Sq, p.Sk, p.H, p.Hkv, p.D), p.scale, p.softcap, cfg.causal, cfg.window)
    return _get(key, lambda: _mechanism(cfg)._Forward(p, cfg)).bind(q, k, v)


def _backward_call(dout, q, k, v, out, lse, cfg):
    p, cfg = _problem(cfg, q, k, v, dout, out, lse)
    spin_timeout_ns = config.spin_timeout_ns()
    key = ("bwd", cfg.ffi, p.dtype, (p.B, p.Sq, p.Sk, p.H, p.Hkv, p.D), p.scale, p.softcap, cfg.causal, cfg.window,
           cfg.schedule, cfg.deterministic, spin_timeout_ns)
    return _get(key, lambda: _mechanism(cfg)._Backward(p, cfg, spin_timeout_ns)).bind(dout, q, k, v, out, lse)


def _mechanism(cfg):
    """The module whose _Forward / _Backward make the calls: this one (buffer_callback) or the C handler's."""
    if not cfg.ffi:
        return sys.modules[__name__]
    from . import _ffi
    return _ffi


def _get(key, make):
    with _lock:
        prepared = _prepared.get(key)
        if prepared is None:
            prepared = _prepared[key] = make()
        return prepared


def _gpus() -> tuple:
    """CUDA ordinals of the local GPUs JAX may run a traced call on (none when JAX has no GPU backend); raises
    RuntimeError when none of them is a Hopper GPU."""
    try:
        devices = jax.local_devices(backend="gpu")
    except RuntimeError:                     # no GPU backend: tracing / lowering only
        return ()
    ids = sorted({d.id if getattr(d, "local_hardware_id", None) is None else d.local_hardware_id for d in devices})
    import cupy
    hopper = tuple(i for i in ids if cupy.cuda.Device(i).compute_capability == "90")
    if ids and not hopper:
        raise RuntimeError(f"cupy_dash.jax: needs an NVIDIA Hopper GPU (sm_90a); JAX's GPUs {ids} are not")
    return hopper


def _load(specs) -> None:
    """Load ``specs`` on the current device, now rather than at their first launch."""
    from cupy.cuda import driver
    for spec in specs:
        # NOTES: with CUDA's lazy loading a kernel is loaded at its first launch, which may come while XLA captures
        # a command buffer; an attribute query loads it here.
        driver.funcGetAttribute(driver.CU_FUNC_ATTRIBUTE_NUM_REGS, jit.load(spec).ptr)


class _Forward:
    """A traced forward: the callback ``(ctx, (out, lse), q, k, v)`` and what it needs besides addresses."""

    def __init__(self, p, cfg):
        self.p, self.causal, self.window = p, cfg.causal, cfg.window
        self.spec, self.block_m, self.block_n = kernels.fwd_entry(p.dtype, p.D, cfg.causal, softcap=p.softcap > 0)
        self.q_strides = interop.contiguous_strides((p.B, p.Sq, p.H, p.D))[:3]
        self.kv_strides = interop.contiguous_strides((p.B, p.Sk, p.Hkv, p.D))[:3]
        self.devices = _gpus()
        import cupy
        for dev in self.devices:
            with cupy.cuda.Device(dev):
                _load([self.spec])

    def types(self):
        p = self.p
        return (jax.ShapeDtypeStruct((p.B, p.Sq, p.H, p.D), api.NP_DTYPES[p.dtype]),
                jax.ShapeDtypeStruct((p.B, p.H, p.Sq), np.float32))

    def bind(self, q, k, v):
        """The custom call on traced q, k, v: ``(out, lse)``."""
        from jax.experimental.buffer_callback import buffer_callback
        return buffer_callback(self, self.types(), command_buffer_compatible=True)(q, k, v)

    def __call__(self, ctx, outs, q, k, v):
        callback_runs["forward"] += 1
        out, lse = outs
        dev = _device(out, self.devices)
        import cupy
        with cupy.cuda.Device(dev):
            operands = (_ptr(q), self.q_strides), (_ptr(k), self.kv_strides), (_ptr(v), self.kv_strides)
            launchers.launch_forward(self.spec, self.block_m, self.block_n, self.p, self.window, operands,
                                     _ptr(out), _ptr(lse), interop.external_stream(ctx.stream, dev))


class _Backward:
    """A traced backward: the callback ``(ctx, (dq, dk, dv, workspace), dout, q, k, v, out, lse)`` and, per device,
    its :class:`cupy_dash.cuda.launchers.BwdLaunch` (kernels loaded, schedule tables uploaded) and error record."""

    def __init__(self, p, cfg, spin_timeout_ns):
        import cupy
        self.p, self.causal, self.window = p, cfg.causal, cfg.window
        tile = kernels.bwd_tile(p.D)
        # NOTES: long problems read compact records, as the eager path does (compact_device.table_form)
        capped = p.softcap > 0
        compact = compact_device.wanted(p.Sq, p.Sk, tile.block_m, tile.block_n, p.B * p.H, cfg.causal, cfg.window,
                                        capped)
        specs = kernels.bwd_specs(p.dtype, p.D, cfg.causal, cfg.deterministic, compact=compact, softcap=capped)
        self.work_bytes = launchers.BwdLaunch(specs, tile.block_m, tile.block_n, p, cfg.deterministic,
                                              spin_timeout_ns, cfg.causal, cfg.window).work_bytes
        self.q_strides = interop.contiguous_strides((p.B, p.Sq, p.H, p.D))[:3]
        self.kv_strides = interop.contiguous_strides((p.B, p.Sk, p.Hkv, p.D))[:3]
        self.devices = _gpus()
        self.launches, self.records = {}, {}
        for dev in self.devices:
            with cupy.cuda.Device(dev):
                specs, bm, bn, max_ctas = kernels.bwd_entry(dev, p.dtype, p.D, cfg.causal, cfg.deterministic,
                                                            compact=compact, softcap=capped)
                _load(specs)
                c = launchers.BwdLaunch(specs, bm, bn, p, cfg.deterministic, spin_timeout_ns, cfg.causal,
                                        cfg.window)
                stream = cupy.cuda.Stream(non_blocking=True)       # the upload waits for nothing of XLA's
                with stream:
                    c.tables = launchers.bwd_tables(cfg.schedule, c, max_ctas, dev, stream, compact=compact)
                self.launches[dev] = c
                self.records[dev] = jit_record(dev, (c.tables.policy, p.B, p.H, p.Sq, p.Sk, p.D, cfg.causal,
                                                     cfg.window))
                if record_shared(dev, self.records[dev]):
                    c.fold = False

    def types(self):
        p = self.p
        kv = jax.ShapeDtypeStruct((p.B, p.Sk, p.Hkv, p.D), api.NP_DTYPES[p.dtype])
        return (jax.ShapeDtypeStruct((p.B, p.Sq, p.H, p.D), api.NP_DTYPES[p.dtype]), kv, kv,
                jax.ShapeDtypeStruct((self.work_bytes,), np.uint8))

    def bind(self, dout, q, k, v, out, lse):
        """The custom call on traced operands: ``(dq, dk, dv)`` (the workspace result is dropped)."""
        from jax.experimental.buffer_callback import buffer_callback
        return buffer_callback(self, self.types(), command_buffer_compatible=True)(dout, q, k, v, out, lse)[:3]

    def __call__(self, ctx, outs, dout, q, k, v, out, lse):
        callback_runs["backward"] += 1
        dq, dk, dv, work = outs
        dev = _device(dq, self.devices)
        qs, kvs = self.q_strides, self.kv_strides
        import cupy
        with cupy.cuda.Device(dev):
            operands = ((_ptr(q), qs), (_ptr(k), kvs), (_ptr(v), kvs), (_ptr(out), qs), (_ptr(dout), qs))
            launchers.launch_backward(self.launches[dev], operands, _ptr(lse), _ptr(work),
                                      (_ptr(dq), _ptr(dk), _ptr(dv)), interop.external_stream(ctx.stream, dev),
                                      error_ptr=self.records[dev])


# ------------------------------------------------------------------------------------------------------------
# run time (inside the callback): buffers
# ------------------------------------------------------------------------------------------------------------
def _device(buffer, prepared) -> int:
    """The CUDA ordinal of an XLA buffer, which must be one the call was prepared on."""
    kind, ordinal = buffer.__dlpack_device__()
    if kind != interop.DLPACK_CUDA:
        raise RuntimeError(f"cupy_dash.jax: runs on CUDA GPUs only, but XLA runs this call on "
                           f"{interop.device_name(kind, ordinal)}")
    if ordinal not in prepared:
        raise RuntimeError(f"cupy_dash.jax: this call was prepared (when traced) for the Hopper GPUs {list(prepared)} "
                           f"JAX had then, but XLA runs it on cuda:{ordinal}")
    return ordinal


def _ptr(buffer) -> int:
    return buffer.__cuda_array_interface__["data"][0]
