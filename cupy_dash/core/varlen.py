"""Packed variable-length batches (FlashAttention's varlen layout): the functional API's varlen entry points and
:func:`prepare_varlen_backward`. How the host learns the lengths, their costs and CUDA graphs: docs/api.md
("Packed variable-length batches", "Varlen in a graph").

NOTES: the forward never reads the lengths on the host (its grid covers ``max_seqlen_q``; each CTA reads its
sequence's bounds and exits past its end); the backward's schedule table needs them there. The kernels clamp every
bound to the packed lengths. A captured backward enqueues only its kernels and waits for nothing: it needs lengths
known without a wait (else RuntimeError before enqueueing anything) and replays the captured packing's table and
lengths whatever the ``cu_seqlens`` buffers hold by then.
"""
from __future__ import annotations

import functools
import numbers

import cupy
import numpy as np

from .. import config, gpu
from .. import schedule as _schedule
from ..cuda import kernels, varlen_device
from . import api, fastpath_varlen, interop, problem, varlen_host_cu
from .varlen_launch import (_tables, check_max_seqlen, check_max_within, check_same_count, check_sequence_count,
                            cu_seqlens_values, packing_launch)


def _check_cu_seqlens(name, cu) -> tuple:
    """(info, number of sequences) of a ``cu_seqlens`` argument: int32, 1-D, at least 2 entries, contiguous (its
    device is checked against q's by :func:`_check_device`)."""
    info = interop.describe(cu, name)
    if info.dtype != "int32":
        raise ValueError(f"{name}: expected dtype int32, got {info.dtype}")
    if len(info.shape) != 1 or info.shape[0] < 2:
        raise ValueError(f"{name}: expected a 1-D tensor (B + 1,) with B >= 1, got shape {info.shape}")
    interop.check_contiguous(info)
    return info, info.shape[0] - 1


def _check_device(info, device_id) -> None:
    if not info.is_cuda or info.device_id != device_id:
        raise ValueError(f"{info.name}: expected a tensor on the CUDA device of q (device {device_id}), got one on "
                         f"{info.device}")


def _packed(x, name):
    """A (total, H, D) operand as the (1, total, H, D) view the kernels read (zero-copy for torch / CuPy), and
    its length ``total``."""
    info = interop.describe(x, name)
    if len(info.shape) != 3:
        raise ValueError(f"{name}: expected a 3-D packed tensor (total, heads, head_dim), got shape {info.shape}")
    return x[None], info.shape[0]


def attention_forward_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False,
                             softmax_scale=None, window=(-1, -1), softcap=0.0):
    """Attention forward over packed variable-length sequences. Returns ``(out, lse)`` in the caller's type.

    Args:
        q: ``(total_q, H, D)`` bf16/fp16, the B sequences' queries back to back; k ``(total_k, Hkv, D)``, v
            ``(total_k, Hkv, Dv)`` (head dims as in :func:`cupy_dash.attention_forward`).
        cu_seqlens_q, cu_seqlens_k: int32 ``(B + 1,)`` on q's device: sequence b is rows
            ``[cu_seqlens[b], cu_seqlens[b + 1])`` (0 = cu_seqlens[0] <= ... <= cu_seqlens[B] = total).
            Empty sequences are allowed.
        max_seqlen_q, max_seqlen_k: ints >= the longest sequence (the grid is sized by max_seqlen_q).
        causal, softmax_scale, window, softcap: as in :func:`cupy_dash.attention_forward`, per sequence (causal
            is bottom-right aligned within each sequence).

    Returns:
        out ``(total_q, H, Dv)`` and lse ``(H, total_q)`` float32 (FlashAttention's varlen lse layout); rows that
        see no key get out 0 and lse -inf. Each sequence's rows are bitwise those of
        :func:`cupy_dash.attention_forward` on that sequence alone.
    """
    fast_key = fastpath_varlen.forward_key(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                                           softmax_scale, window, softcap)
    result = fastpath_varlen.forward(fast_key, q, k, v, cu_seqlens_q, cu_seqlens_k)
    if result is not None:
        return result
    capturing = api.call_start(q)
    causal = problem.check_flag("causal", causal)
    window = problem.check_window(window, causal)
    max_q = check_max_seqlen("max_seqlen_q", max_seqlen_q)
    max_k = check_max_seqlen("max_seqlen_k", max_seqlen_k)
    cu_q_info, num_seqs = _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q)
    cu_k_info, num_seqs_k = _check_cu_seqlens("cu_seqlens_k", cu_seqlens_k)
    if num_seqs_k != num_seqs:
        raise ValueError(f"cu_seqlens_k: expected {num_seqs + 1} entries (as cu_seqlens_q), got {num_seqs_k + 1}")
    check_sequence_count(num_seqs)
    (q4, _), (k4, _), (v4, _) = _packed(q, "q"), _packed(k, "k"), _packed(v, "v")
    p = problem.validate(q4, k4, v4, softmax_scale=softmax_scale, softcap=softcap)
    _check_device(cu_q_info, p.device_id)
    _check_device(cu_k_info, p.device_id)
    check_max_within(max_q, max_k, p.Sq, p.Sk)
    window = _schedule.canonical_window(window, max_q, max_k, causal)   # vacuous for every sequence -> -1
    spec, block_m, block_n = kernels.fwd_entry(p.dtype, p.D, causal, p.Dv)
    return api.run_forward(q, p, spec, block_m, block_n, window, (q4, k4, v4), (-(-max_q // block_m), p.H, num_seqs),
                           ((p.Sq, p.H, p.Dv), (p.H, p.Sq)), capturing, fast_key, fastpath_varlen.register_forward,
                           cu=(num_seqs, (cu_q_info, cu_seqlens_q), (cu_k_info, cu_seqlens_k)))


# ------------------------------------------------------------------------------------------------------------
# backward
# ------------------------------------------------------------------------------------------------------------
def prepare_varlen_backward(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, num_heads, num_heads_kv,
                            head_dim, dtype="bfloat16", causal=False, window=(-1, -1), schedule="auto",
                            deterministic=True, device=0, stream=None, softcap=0.0, head_dim_v=None) -> None:
    """Build and upload, ahead of time, the schedule table that :func:`attention_backward_varlen` will need for
    these lengths (host ``cu_seqlens``: numpy, list or CPU tensor), heads, head dim, dtype and flags, so that the
    call finds it cached instead of building it on the training step's critical path: for a data-loader thread
    that knows the next batches' packings (the caches hold 16 packings per device). Thread-safe. The upload is
    enqueued on ``stream`` (a CuPy stream; default: a stream of this call's own) and waited for before this call
    returns (only the calling thread waits: the backward, eager or captured into a CUDA graph, then needs no event
    of it). ``total_q`` / ``total_k`` are the last entries of the cu_seqlens; ``deterministic`` is checked as
    the backward checks it (both modes take the same table and kernels); ``softcap``: the backward's
    (a soft-capped backward may need another table form). Raises ValueError as the
    backward would for bad lengths, flags or sizes (TypeError for a ``device`` that is not an int >= 0 or a
    ``stream`` that is not a CuPy stream, ValueError for a stream of another device; ``head_dim_v``: v's head dim
    where it is not ``head_dim``, as the backward's kernels and tables depend on it), then,
    before touching the device, RuntimeError unless CUDA device ``device`` is a Hopper GPU
    (:func:`cupy_dash.gpu.require`: no GPU, no driver, another GPU)."""
    causal = problem.check_flag("causal", causal)
    deterministic = problem.check_flag("deterministic", deterministic)
    window = problem.check_window(window, causal)
    problem.check_schedule(schedule)
    capped = problem.check_softcap(softcap) > 0
    max_q = check_max_seqlen("max_seqlen_q", max_seqlen_q)
    max_k = check_max_seqlen("max_seqlen_k", max_seqlen_k)
    hosts = []
    for name, cu, max_name, m in (("cu_seqlens_q", cu_seqlens_q, "max_seqlen_q", max_q),
                                  ("cu_seqlens_k", cu_seqlens_k, "max_seqlen_k", max_k)):
        info, host = cu_seqlens_form(name, cu)
        if info is not None:
            raise ValueError(f"{name}: prepare_varlen_backward takes host lengths (numpy, list, CPU tensor)")
        total = int(host.reshape(-1)[-1]) if host.size else 0        # the shape is checked next
        hosts.append(cu_seqlens_values(name, host, total, max_name, m))
    check_same_count(*hosts)
    dtype = {"bf16": "bfloat16", "fp16": "float16"}.get(dtype, dtype)
    kernels.check_supported(dtype, head_dim, head_dim_v=head_dim_v)
    if not (isinstance(num_heads, int) and isinstance(num_heads_kv, int) and num_heads_kv >= 1
            and num_heads >= num_heads_kv and num_heads % num_heads_kv == 0):
        raise ValueError(f"num_heads, num_heads_kv: expected ints with num_heads % num_heads_kv == 0, got "
                         f"{num_heads}, {num_heads_kv}")
    if isinstance(device, bool) or not isinstance(device, numbers.Integral) or device < 0:
        raise TypeError(f"device: expected a CUDA device ordinal (an int >= 0), got {type(device).__name__} "
                        f"{device!r}")
    device = int(device)
    if stream is not None and not isinstance(getattr(stream, "ptr", None), int):
        raise TypeError(f"stream: expected a CuPy stream (cupy.cuda.Stream or ExternalStream), got "
                        f"{type(stream).__name__}")
    if stream is not None and getattr(stream, "device_id", -1) not in (-1, device):
        raise ValueError(f"stream: a stream of device {stream.device_id}, but the tables go to device={device}")
    window = _schedule.canonical_window(window, max_q, max_k, causal)
    lens_q, lens_k = (np.diff(c).astype(np.int64) for c in hosts)
    gpu.require("cupy_dash.prepare_varlen_backward (it builds the schedule table for the GPU's co-resident CTAs "
                "and uploads it)", device)
    with cupy.cuda.Device(device):
        tables, _, _, _ = _tables(device, dtype, head_dim, causal, schedule, lens_q, lens_k,
                                  num_heads, num_heads_kv, window, capped, head_dim_v=head_dim_v)
        if tables.num_visits == 0:
            return
        stream = stream if stream is not None else cupy.cuda.Stream(non_blocking=True)
        # NOTES: waited for here (the caller is a loader thread): a backward on any stream, one being captured
        # into a CUDA graph included (which may wait for no event made outside it), then reads the table as it is
        varlen_device.device(tables, (len(hosts[0]) - 1) * num_heads, device, stream, done=True)


def cu_seqlens_form(name, cu):
    """``(None, host int64 array)`` for host ``cu_seqlens`` (numpy, list, CPU tensor), ``(info, None)`` for a device
    one (1-D int32 contiguous, checked here; its values after the copy)."""
    info = None if isinstance(cu, (list, tuple)) else interop.describe(cu, name)
    if info is not None and info.is_cuda:
        if info.dtype != "int32" or len(info.shape) != 1:
            raise ValueError(f"{name}: expected a 1-D int32 tensor (B + 1,), got {info.dtype} {info.shape}")
        interop.check_contiguous(info)
        return info, None
    host = np.asarray(cu)
    if host.dtype.kind not in "iu":
        raise ValueError(f"{name}: expected integers, got dtype {host.dtype}")
    return None, host.astype(np.int64)


def _device_to_host(info, cu, stream, capture=False) -> np.ndarray:
    """A device cu_seqlens ``(B + 1,)`` on the host: the copy its forward took (:mod:`cupy_dash.core.varlen_host_cu`),
    else one copied after the caller's stream's pending work (a wait). ``capture`` (``stream`` is capturing a CUDA
    graph, where nothing may wait): the forward's copy, already waited for by an eager call, or RuntimeError."""
    keep = []
    ptr, _ = api._resolve(info, cu, keep)
    host = varlen_host_cu.lookup(cu, info, ptr)
    if host is not None:
        return host
    if capture:
        raise RuntimeError(f"cupy_dash: the varlen backward builds its schedule table from the lengths on the host, "
                           f"and during CUDA graph capture device cu_seqlens can be read only if an eager call "
                           f"already took their host copy ({info.name} has none): pass host cu_seqlens, or keep the "
                           f"device ones in place (a module buffer, not a tensor that the graph copies) and run one "
                           f"eager step first")
    host = np.empty(info.shape[0], dtype=np.int32)
    rt = cupy.cuda.runtime
    rt.memcpyAsync(host.ctypes.data, ptr, host.nbytes, rt.memcpyDeviceToHost, stream.ptr)
    stream.synchronize()
    return host


def attention_backward_varlen(do, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *,
                              causal=False, softmax_scale=None, window=(-1, -1), schedule="auto",
                              deterministic=True, softcap=0.0):
    """Attention backward over packed variable-length sequences. Returns ``(dq, dk, dv)`` in the caller's type.

    Args:
        do, out: ``(total_q, H, Dv)``; q ``(total_q, H, D)``; k ``(total_k, Hkv, D)``, v ``(total_k, Hkv, Dv)``
            (GQA as in :func:`cupy_dash.attention_backward`); lse ``(H, total_q)`` float32 from
            :func:`attention_forward_varlen`.
        cu_seqlens_q, cu_seqlens_k: ``(B + 1,)`` int32, as in :func:`attention_forward_varlen`, on q's device
            (copied to the host: one wait on the caller's stream, unless the forward's copy serves) or on the host
            (numpy, list, CPU tensor: no wait). Empty sequences are allowed. During CUDA graph capture: host
            ones, or device ones whose forward copy an eager call already waited for (docs/api.md).
        max_seqlen_q, max_seqlen_k: ints >= the longest sequence.
        causal, softmax_scale, window, softcap: the forward's. schedule, deterministic: as in
            :func:`cupy_dash.attention_backward`; every sequence is its own set of KV columns in one table
            (:func:`cupy_dash.schedule.build_varlen`).

    Returns:
        dq ``(total_q, H, D)``, dk ``(total_k, Hkv, D)`` and dv ``(total_k, Hkv, Dv)``, contiguous. Rows of dq
        whose query sees no key and rows of dk, dv whose key no query sees are 0. With ``schedule="fa3"`` or
        ``"descending"`` (dQ tiles add in KV-tile order) each sequence's gradients are bitwise those of
        :func:`cupy_dash.attention_backward` on that sequence alone where both take the same query tile
        (docs/api.md); every schedule is run-to-run deterministic.

    May be captured into a CUDA graph by torch callers, with lengths known on the host; the graph then replays the
    captured packing's lengths, which the caller keeps fixed.
    """
    fast_key = fastpath_varlen.key(do, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                   causal, softmax_scale, window, schedule, deterministic, softcap)
    result = fastpath_varlen.backward(fast_key, do, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k)
    if result is not None:
        return result
    capturing = api.call_start(q)
    causal = problem.check_flag("causal", causal)
    deterministic = problem.check_flag("deterministic", deterministic)
    window = problem.check_window(window, causal)
    max_q = check_max_seqlen("max_seqlen_q", max_seqlen_q)
    max_k = check_max_seqlen("max_seqlen_k", max_seqlen_k)
    (q4, total_q), (k4, total_k), (v4, _), (do4, _), (out4, _) = (
        _packed(x, n) for x, n in ((q, "q"), (k, "k"), (v, "v"), (do, "do"), (out, "out")))
    li = interop.describe(lse, "lse")
    if len(li.shape) != 2:
        raise ValueError(f"lse: expected a 2-D tensor (H, total_q), got shape {li.shape}")
    check_max_within(max_q, max_k, total_q, total_k)
    cu_args = (("cu_seqlens_q", cu_seqlens_q, total_q, "max_seqlen_q", max_q),
               ("cu_seqlens_k", cu_seqlens_k, total_k, "max_seqlen_k", max_k))
    forms = [cu_seqlens_form(name, cu) for name, cu, *_ in cu_args]
    # host cu_seqlens are checked here, before any GPU work; device ones after their copy to the host
    cu_host = [None if host is None else cu_seqlens_values(name, host, *limits)
               for (name, _, *limits), (_, host) in zip(cu_args, forms)]
    device_cu = any(c is None for c in cu_host)
    if not device_cu:
        check_same_count(*cu_host)
    p = problem.validate(q4, k4, v4, do4, out4, lse[None], softmax_scale=softmax_scale, schedule=schedule,
                     backward=True, softcap=softcap)
    for info, _ in forms:
        if info is not None:
            _check_device(info, p.device_id)
    problem.check_tma_operands(p)
    window = _schedule.canonical_window(window, max_q, max_k, causal)
    total_q, total_k, H, Hkv, D, Dv = p.Sq, p.Sk, p.H, p.Hkv, p.D, p.Dv
    dev = p.device_id
    stream = interop.caller_stream(q, dev)
    with cupy.cuda.Device(dev), stream:
        if device_cu:
            for i, ((name, cu, *limits), (info, _)) in enumerate(zip(cu_args, forms)):
                if info is not None:
                    cu_host[i] = cu_seqlens_values(name, _device_to_host(info, cu, stream, capturing), *limits)
            check_same_count(*cu_host)
        c, cu_dev, call = packing_launch(dev, p, causal, deterministic, schedule, window,
                                         config.spin_timeout_ns(), cu_host, max_q, stream, capture=capturing)
        if c is None:                                     # no sequence sees a key: every gradient is 0
            fw = p.infos[0].framework
            shapes = (total_q, H, D), (total_k, Hkv, D), (total_k, Hkv, Dv)
            grads = [api._new(fw, dev, shape, p.dtype) for shape in shapes]
            for (_, ptr), shape in zip(grads, shapes):
                cupy.cuda.runtime.memsetAsync(ptr, 0, int(np.prod(shape)) * 2, stream.ptr)
            return tuple(api._export(fw, g, q) for g, _ in grads)
        cu_ptrs = cu_dev[0].data.ptr, cu_dev[1].data.ptr
        register = functools.partial(fastpath_varlen.register, fast_key, c, call=call, like=q, stream=stream,
                                     keep=(c.tables, *cu_dev))
        return api.run_backward(c, p, call, stream, (q4, k4, v4, out4, do4), lse[None], capturing, [],
                                ((total_q, H, D), (total_k, Hkv, D), (total_k, Hkv, Dv)), register,
                                cu_seqlens=cu_ptrs)
