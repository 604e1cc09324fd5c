"""The host side of one packing's varlen backward, shared by the full path, the fast path's new packings and the JAX
backward: the checks of the lengths and :func:`packing_launch` (checked lengths -> table and launch).
"""
from __future__ import annotations

import numbers

import numpy as np

from .. import config
from ..cuda import capture as capture_mod, kernels, launchers, varlen_device
from ..schedule import compact_device, varlen_pack
from .problem import MAX_GRID_YZ


def check_max_seqlen(name, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected an int >= 1, got {type(value).__name__} {value!r}")
    if not 1 <= int(value) < 1 << 31:
        raise ValueError(f"{name}: expected an int >= 1 (the longest sequence), got {value}")
    return int(value)


def check_max_within(max_q, max_k, total_q, total_k) -> None:
    """max_seqlen_q / max_seqlen_k (checked ints) within the packed lengths ``total_q`` / ``total_k``."""
    if max_q > total_q or max_k > total_k:
        raise ValueError(f"max_seqlen_q / max_seqlen_k ({max_q}, {max_k}) exceed the packed lengths "
                         f"({total_q}, {total_k})")


def check_same_count(cu_q, cu_k) -> None:
    if len(cu_q) != len(cu_k):
        raise ValueError(f"cu_seqlens_k: expected {len(cu_q)} entries (as cu_seqlens_q), got {len(cu_k)}")
    check_sequence_count(len(cu_q) - 1)


def check_sequence_count(num_seqs: int) -> None:
    """At most MAX_GRID_YZ sequences: the varlen grids' z dimension."""
    if num_seqs > MAX_GRID_YZ:
        raise ValueError(f"cu_seqlens_q: {num_seqs} sequences, more than {MAX_GRID_YZ} (a CUDA grid dimension); "
                         f"split the packed batch")


def cu_seqlens_values(name, host, total, max_name, max_len) -> np.ndarray:
    """``host`` checked (1-D, 0 = cu[0] <= ... <= cu[B] = total, no length above max_len) as int32."""
    if host.ndim != 1 or host.shape[0] < 2:
        raise ValueError(f"{name}: expected a 1-D array (B + 1,) with B >= 1, got shape {host.shape}")
    code, longest, checked = varlen_pack.checked_cu_seqlens(np.ascontiguousarray(host, dtype=np.int64), total,
                                                            max_len)
    if code == 1:
        raise ValueError(f"{name}: expected 0 = cu[0] <= cu[1] <= ... <= cu[B] = {total} (the packed length), got "
                         f"{np.array2string(host, threshold=12)}")
    if code == 2:
        raise ValueError(f"{name}: a sequence of {longest} rows exceeds {max_name} ({max_len})")
    return checked


def _entry(dev, dtype, D, causal, compact, softcap, capture, tile_sq=0, window=(-1, -1), head_dim_v=None) -> tuple:
    """kernels.bwd_entry of a varlen backward on device ``dev`` (``tile_sq``: kernels.varlen_tile_seqlen of the
    longest sequence, ``window`` canonical: the tile's choice); ``capture``: kernels not loaded yet are loaded
    outside the capture (capture.loading), as api._backward loads the fixed-length ones."""
    with capture_mod.loading(dev, capture):
        return kernels.bwd_entry(dev, dtype, D, causal, compact=compact, softcap=softcap, seqlen_q=tile_sq,
                                 window=window, head_dim_v=head_dim_v)


def _tables(dev, dtype, D, causal, schedule, lens_q, lens_k, H, Hkv, window, softcap=False,
            capture=False, head_dim_v=None) -> tuple:
    """(host tables, BwdKernels, block_m, block_n) of a varlen backward (``window`` canonical): the one place
    that decides the table form, so that :func:`cupy_dash.core.varlen.prepare_varlen_backward` finds what the
    backward will ask for. ``capture``: the caller's stream is capturing a CUDA graph: kernels not loaded yet load
    outside the capture (:func:`_entry`), and a host plan built anew packs into pageable memory.

    NOTES: the table form is decided as for fixed lengths (CUPY_DASH_COMPACT_TABLES, docs/configuration.md):
    below compact_device.AUTO_VISITS visits compact varlen tables stay opt-in (same bits, slower kernel); the
    per-visit rows are expanded on the GPU from compact records (kernels_src/bwd_expand.cu) unless
    CUPY_DASH_VARLEN_EXPAND=host: docs/decisions/table-forms.md. ``softcap``: soft-capped, the same table forms.
    ``head_dim_v``: the kernels' value head dim (the tables do not depend on it)."""
    form = compact_device.table_form(None, varlen=True)   # size rule: after the build (above)
    above = compact_device.AUTO_VISITS if config.COMPACT_TABLES.get() is None else None
    tile_sq = kernels.varlen_tile_seqlen(int(lens_q.max(initial=0)))   # the tile: by the longest sequence
    _, bm, bn, max_ctas = _entry(dev, dtype, D, causal, False, softcap, capture, tile_sq, window, head_dim_v)
    section = launchers.head_section(int(lens_q.sum()), D, H // Hkv, head_dim_v, dev)
    tables = varlen_device.plan(schedule, lens_q, lens_k, bm, bn, H, Hkv, causal, max_ctas, window,
                                {"compact": True, "expand": "expand", "visits": False}[form], above,
                                pinned=not capture, head_section=section)
    compact = tables.compact is not None and not tables.expand
    specs, cbm, cbn, compact_ctas = _entry(dev, dtype, D, causal, compact, softcap, capture, tile_sq, window,
                                           head_dim_v)
    if (cbm, cbn) != (bm, bn):   # NOTES: the 80-query tile has no compact build (kernels.bwd_tile): 64 rebuilt
        bm, bn = cbm, cbn
        tables = varlen_device.plan(schedule, lens_q, lens_k, bm, bn, H, Hkv, causal, compact_ctas, window, True,
                                    None, pinned=not capture, head_section=section)
    if tables.num_ctas > compact_ctas:
        raise RuntimeError(f"cupy_dash: the compact varlen kernel holds {compact_ctas} co-resident CTAs, fewer than "
                           f"the {tables.num_ctas} of its table")
    return tables, specs, bm, bn


def packing_launch(dev, p, causal, deterministic, schedule, window, spin_timeout_ns, cu_host, max_q, stream,
                   capture=False):
    """``(c, (cu_seqlens_q, cu_seqlens_k) on the device, call)`` of a varlen backward of the packed problem ``p``
    (``window`` canonical) with checked host lengths ``cu_host`` (int32 ``(B + 1,)`` each,
    :func:`checked_cu_seqlens`): its launchers.BwdLaunch with the packing's table (built or cached, uploaded on
    ``stream``, which waits for it) and the tuple naming the call in an error message; ``(None, None, None)`` when
    no sequence sees a key. The one place that turns lengths into a launch: the full path, the torch fast path's
    new packings and the JAX backward with traced lengths.

    ``capture``: ``stream`` is capturing a CUDA graph: nothing is enqueued on it and nothing waits; the kernels and
    this packing's table come from an eager call (or prepare_varlen_backward) on this device, or are made outside
    the capture (capture.find_or_make: uploaded and expanded on a stream of their own, synchronized).

    NOTES: a captured call reads the cached table without an event: an eager call's upload (and expansion) was
    enqueued before the capture began, and torch.cuda.graph (reduce-overhead's too) synchronizes the device on
    entry; one made outside the capture has finished before it goes on. The table is then kept for the life of
    the process (device_tables.cached)."""
    num_seqs = len(cu_host[0]) - 1
    lens_q, lens_k = (np.diff(c).astype(np.int64) for c in cu_host)
    tables, specs, bm, bn = _tables(dev, p.dtype, p.D, causal, schedule, lens_q, lens_k, p.H, p.Hkv, window,
                                    p.softcap > 0, capture, p.Dv)
    if tables.num_visits == 0:
        return None, None, None
    c = launchers.BwdLaunch(specs, bm, bn, p, deterministic, spin_timeout_ns, causal, window,
                            varlen=(num_seqs, max_q))

    def find(side, capture):
        found = varlen_device.device(tables, num_seqs * p.H, dev, side or stream, capture=capture)
        return None if found[0] is None else found
    c.tables, cu_q_dev, cu_k_dev, uploaded = capture_mod.find_or_make(dev, find) if capture else find(None, False)
    if uploaded is not None:                      # never during capture (device_tables.cached)
        stream.wait_event(uploaded)
    return c, (cu_q_dev, cu_k_dev), (c.tables.policy, num_seqs, p.H, p.Sq, p.Sk, p.D, causal, window)


def checked_cu_seqlens(host_q, host_k, total_q, total_k, max_q, max_k) -> tuple:
    """Host cu_seqlens (integer arrays) checked as the backward checks them (:func:`cu_seqlens_values`, the same
    count): ``(cu_seqlens_q, cu_seqlens_k)`` int32. Raises ValueError naming the argument."""
    checked = (cu_seqlens_values("cu_seqlens_q", host_q, total_q, "max_seqlen_q", max_q),
               cu_seqlens_values("cu_seqlens_k", host_k, total_k, "max_seqlen_k", max_k))
    check_same_count(*checked)
    return checked
