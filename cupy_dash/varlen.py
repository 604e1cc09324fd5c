"""Packed variable-length batches, FlashAttention's varlen layout: the sequences of a batch are concatenated
along the row axis and ``cu_seqlens`` (int32, ``(B + 1,)``, on the device) gives where each starts.

The forward is here (:func:`attention_forward_varlen`); the varlen backward needs schedule tables built from the
lengths and is not implemented yet (benchmarks/NOTES.md, "design for compact tables and varlen").

How the host learns the lengths: it does not need them for the forward. The grid covers ``max_seqlen_q`` (given
by the caller, as in FlashAttention) for every sequence, and each CTA reads its sequence's bounds from
``cu_seqlens`` on the device (a CTA past the end of its sequence exits at once), so there is no device-to-host
copy and no synchronisation. The kernel clamps every bound to the packed lengths, so inconsistent ``cu_seqlens``
give wrong results for the rows they describe but never a load or store outside the buffers.
"""
from __future__ import annotations

import numbers

import cupy

from . import api, interop, kernels, launchers
from . import schedule as _schedule
from .errors import _keep_alive, poll_errors as _poll_errors


def _check_max_seqlen(name, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected an int >= 1, got {type(value).__name__} {value!r}")
    if not 1 <= int(value) < 1 << 31:
        raise ValueError(f"{name}: expected an int >= 1 (the longest sequence), got {value}")
    return int(value)


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
    """A (total, H, D) operand as the (1, total, H, D) view the kernels read (zero-copy for torch / CuPy)."""
    info = interop.describe(x, name)
    if len(info.shape) != 3:
        raise ValueError(f"{name}: expected a 3-D packed tensor (total, heads, head_dim), got shape {info.shape}")
    return x[None]


def attention_forward_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal=False,
                             softmax_scale=None, window=(-1, -1)):
    """Attention forward over packed variable-length sequences. Returns ``(out, lse)`` in the caller's type.

    Args:
        q: ``(total_q, H, D)`` bf16/fp16, the B sequences' queries back to back; k, v: ``(total_k, Hkv, D)``.
        cu_seqlens_q, cu_seqlens_k: int32 ``(B + 1,)`` on q's device: sequence b is rows
            ``[cu_seqlens[b], cu_seqlens[b + 1])`` (0 = cu_seqlens[0] <= ... <= cu_seqlens[B] = total).
            Empty sequences are allowed.
        max_seqlen_q, max_seqlen_k: ints >= the longest sequence (the grid is sized by max_seqlen_q).
        causal, softmax_scale, window: as in :func:`cupy_dash.attention_forward`, per sequence (causal is
            bottom-right aligned within each sequence).

    Returns:
        out ``(total_q, H, D)`` and lse ``(H, total_q)`` float32 (FlashAttention's varlen lse layout); rows that
        see no key get out 0 and lse -inf. Each sequence's rows are bitwise those of
        :func:`cupy_dash.attention_forward` on that sequence alone.
    """
    if not interop.capturing(q):
        _poll_errors()
    causal = api._check_flag("causal", causal)
    window = api._check_window(window, causal)
    max_q = _check_max_seqlen("max_seqlen_q", max_seqlen_q)
    max_k = _check_max_seqlen("max_seqlen_k", max_seqlen_k)
    cu_q_info, num_seqs = _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q)
    cu_k_info, num_seqs_k = _check_cu_seqlens("cu_seqlens_k", cu_seqlens_k)
    if num_seqs_k != num_seqs:
        raise ValueError(f"cu_seqlens_k: expected {num_seqs + 1} entries (as cu_seqlens_q), got {num_seqs_k + 1}")
    q4, k4, v4 = _packed(q, "q"), _packed(k, "k"), _packed(v, "v")
    p = api._validate(q4, k4, v4, softmax_scale=softmax_scale)
    _check_device(cu_q_info, p.device_id)
    _check_device(cu_k_info, p.device_id)
    if max_q > p.Sq or max_k > p.Sk:
        raise ValueError(f"max_seqlen_q / max_seqlen_k ({max_q}, {max_k}) exceed the packed lengths "
                         f"({p.Sq}, {p.Sk})")
    window = _schedule.canonical_window(window, max_q, max_k, causal)   # vacuous for every sequence -> -1
    spec, block_m, block_n = kernels.fwd_entry(p.dtype, p.D, causal, varlen=True)
    total_q, H, D = p.Sq, p.H, p.D
    qi, ki, vi = p.infos
    fw, dev = interop.framework_of(q), p.device_id
    stream = interop.caller_stream(q, dev)
    with cupy.cuda.Device(dev), stream:
        keep = []
        operands = api._resolve(qi, q4, keep), api._resolve(ki, k4, keep), api._resolve(vi, v4, keep)
        cu_q_ptr, _ = api._resolve(cu_q_info, cu_seqlens_q, keep)
        cu_k_ptr, _ = api._resolve(cu_k_info, cu_seqlens_k, keep)
        out, out_ptr = api._new(fw, dev, (total_q, H, D), p.dtype)
        lse, lse_ptr = api._new(fw, dev, (H, total_q), "float32")
        params = launchers.fwd_params(block_m, block_n, p, window, operands, out_ptr, lse_ptr,
                                      varlen=(num_seqs, cu_q_ptr, cu_k_ptr))
        kernels.launch(spec, (-(-max_q // block_m), H, num_seqs), params, stream)
        if keep:
            _keep_alive(keep, stream)
        return api._export(fw, out, q), api._export(fw, lse, q)
