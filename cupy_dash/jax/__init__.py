"""JAX integration: attention that works eagerly and under ``jax.jit``, ``jax.grad`` and ``jax.vmap``.

Imported only on demand (``cupy_dash.jax``, or ``cupy_dash.attention`` with JAX arrays); importing ``cupy_dash``
itself never imports jax. Layout: q ``(B, Sq, H, D)``, k/v ``(B, Sk, Hkv, D)`` with ``H % Hkv == 0``, bf16/fp16,
D 64, 96, 128, 192 or 256 (v's head dim also 128 with D 192), on a Hopper GPU::

    out = cupy_dash.jax.attention(q, k, v, causal=False, softmax_scale=None, schedule="auto", deterministic=True,
                                  window=(-1, -1))
    out, lse = cupy_dash.jax.attention_forward(q, k, v, causal=False, softmax_scale=None, window=(-1, -1))
    dq, dk, dv = cupy_dash.jax.attention_backward(dout, q, k, v, out, lse, causal=False, softmax_scale=None,
                                                  schedule="auto", deterministic=True, window=(-1, -1))

``attention`` is differentiable (``jax.custom_vjp``; its gradient is ``attention_backward`` with the same
``window``), and so is ``out`` of ``attention_forward`` (``lse`` is not: a loss that depends on it raises at trace
time). Results have exactly the
bits of :func:`cupy_dash.attention_forward` / :func:`cupy_dash.attention_backward` on the same inputs: the same
kernels with the same schedule tables.

Mechanism: a C XLA FFI handler built with the package (:mod:`cupy_dash.jax._ffi`, the default where the extension
``cupy_dash.jax._xla_ffi`` is built), or ``jax.experimental.buffer_callback`` (``CUPY_DASH_JAX_FFI=0``, or no
extension). Both share what follows; the handler patches a launch plan per device with the buffer addresses and
launches without Python (no GIL at run time), the callback does the same in Python. Each call is one XLA custom
call whose outputs (out and lse;
dq, dk, dv and the backward's fp32 / int32 scratch workspace) are XLA buffers. At *trace time* (the first call of
a shape, eager calls included: every function here is ``jax.jit``-compiled), the arguments are checked on their
shapes and dtypes (errors name the argument, as in :mod:`cupy_dash.core.api`), and the call is prepared on every
local GPU JAX uses: NVRTC compile (or the disk cache) and module load of its kernels, the occupancy query, the
backward's schedule tables (built, uploaded, synchronized once) and a device error record. At *run time* XLA
calls back into Python on its own stream (``ctx.stream``), and the callback only reads the buffers' addresses,
encodes the TMA tensor maps (host only; they embed the addresses), packs the parameter block and launches the
kernels: no allocation, no host synchronization, no kernel load. The callback is declared
``command_buffer_compatible``: under XLA command buffers (``--xla_gpu_enable_command_buffer=...,CUSTOM_CALL``)
it runs when XLA records its launches (again whenever the buffers' addresses change), and the recording is
replayed otherwise, which is correct because the launches depend only on the addresses and on trace-time
constants. Host cost per call: the Python callback (tens of µs, with the GIL; ``benchmarks/jax_overhead.py``);
:data:`callback_runs` counts its executions. Programs that use these functions cannot be serialized
(``jax.export``; JAX's persistent compilation cache skips them): the callback lives in this process.

``CUPY_DASH_JAX_FFI`` (read when a call is traced): ``0`` selects the callback, ``1`` requires the C handler; both
give the same bits.

``vmap``: a ``jax.custom_batching.custom_vmap`` rule folds the mapped axis into the batch (``(N, B, ...)`` ->
``(N*B, ...)``, broadcasting unmapped arguments) and makes one call: the result equals one call on the folded
batch bit for bit (and a loop over the axis bit for bit for the forward; for the backward with the
``PORTABLE_POLICIES`` schedules, whose addition orders do not depend on the batch size).

``shard_map``: results vary over the manual mesh axes their operands vary over; the differentiable calls first
cast their operands to vary together, so an operand replicated over an axis gets its gradient summed over it.

Packed variable-length batches: :func:`attention_varlen` (:mod:`cupy_dash.jax.varlen`: host cu_seqlens, static;
or JAX arrays, one program for every packing, :mod:`cupy_dash.jax.varlen_dyn`).

Errors: argument errors raise at trace time. A dQ semaphore timeout of a backward (see
:func:`cupy_dash.check_errors`) is written to the call's device record, which only :func:`cupy_dash.check_errors`
reads (it synchronizes the device): call it after a step to make sure none happened; until it is called, later
executions of that call abandon their waits at once (their results are invalid too). A callback failure (for
instance, a program compiled for a non-Hopper device) raises from the jitted call (an XLA runtime error quoting
the Python exception). Memory: everything the kernels use at run time is XLA's, except the small schedule tables
and error records (CuPy's pool, kept for the life of the process).
"""
import jax as _jax_lib

from ..core.varlen_launch import check_max_seqlen as _check_max_seqlen
from . import ops, varlen, varlen_dyn
from .callbacks import callback_runs
from .ops import attention, attention_backward, attention_forward

__all__ = ["attention", "attention_forward", "attention_backward", "attention_varlen", "callback_runs"]


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False,
                     softmax_scale=None, schedule="auto", deterministic=True, window=(-1, -1), softcap=0.0):
    """Differentiable varlen attention -> out ``(total_q, H, D)`` (:mod:`cupy_dash.jax.varlen`'s docstring); q
    ``(total_q, H, D)``, k / v ``(total_k, Hkv, D)``. ``schedule`` and ``deterministic`` apply to the backward,
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
