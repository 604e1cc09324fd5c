"""Launches into given buffers on a given stream, the layer every entry point shares (eager calls, their fast path,
the JAX custom calls): the same parameter blocks and tables, hence the same bits. Nothing here validates arguments,
allocates device memory or synchronizes. docs/architecture.md, "Launchers and launch plans".
"""
from __future__ import annotations

import functools

import cupy
import numpy as np

from .. import config
from .. import schedule as _schedule
from ..schedule import pieces as _pieces
from . import device_tables, kernels, tensormap
from .errors import _track

_LOG2E = 1.4426950408889634
_WORKSPACE_ALIGN = 256
FOLD_ENV = config.FOLD.name
# NOTES: a folded backward (kernels_src/bwd/fold.cuh) saves two launches' host time but costs 1-7 % of GPU time, so
# only backwards of at most FOLD_MAX_TILES (Q tile, KV tile) pairs, bound by the host, fold
# (docs/decisions/fold-size.md).
FOLD_MAX_TILES = 256


def bsh_strides(shape) -> tuple:
    _, S, H, D = shape
    return (S * H * D, H * D, D)


# ------------------------------------------------------------------------------------------------------------
# forward
# ------------------------------------------------------------------------------------------------------------
def enqueue_forward(plan, stream, buffers) -> None:
    """Run the forward's launch plan ``plan`` (:func:`cupy_dash.cuda.plans.forward_plan`) on the CuPy ``stream``
    with the addresses ``buffers`` (q, k, v, out, lse, and cu_seqlens_q, cu_seqlens_k for a varlen launch): every
    forward but the JAX FFI handler's launches here. Never synchronizes or allocates device memory."""
    plan.run(stream.ptr, buffers)


def fwd_persistent_grid(p, grid) -> tuple:
    """The persistent build's grid: one CTA per SM, at most one per tile of the tile ``grid``."""
    return (min(grid[0] * grid[1] * grid[2], kernels.sm_count(p.device_id)),)


def fwd_grid(p, block_m) -> tuple:
    return -(-p.Sq // block_m), p.H, p.B


def fwd_head_section(p, block_m: int, grid=None, element_bytes: int = 2) -> int:
    """(b, h) pairs per section of the causal forward's launch order (``FwdParams.head_section``): about one wave
    of tiles, the SM count over the tiles per pair (rounded; a pair with as many tiles as SMs is a wave alone, and
    then the per-pair order is already longest first across the SMs), and no more pairs than keep the K and V they
    read (``Sk`` rows of ``D + Dv`` elements per KV head, shared by ``H / Hkv`` query heads) within
    ``schedule.L2_SECTION_SHARE`` of the device's L2; at least 1, at most the number of pairs. ``grid``: a varlen
    launch's (tiles of the longest sequence, H, sequences), whose pairs read ``Sk / sequences`` key rows on
    average. Changes the order in which tiles start, never a result (docs/decisions/fwd-launch-order.md)."""
    tiles, pairs, rows_k = (-(-p.Sq // block_m), p.B * p.H, p.Sk) if grid is None else \
        (grid[0], grid[1] * grid[2], -(-p.Sk // max(1, grid[2])))
    wave = round(kernels.sm_count(p.device_id) / max(1, tiles))
    kv_head = max(1, rows_k) * (p.D + p.Dv) * element_bytes
    in_l2 = int(_schedule.L2_SECTION_SHARE * l2_bytes(p.device_id)) * (p.H // p.Hkv) // kv_head
    return max(1, min(wave, in_l2, pairs))


def logit_factors(p, backward: bool) -> dict:
    """The parameter block's softmax_scale, softmax_scale_log2 and softcap_prescale for ``p`` (its ``scale`` and
    logit cap ``softcap``, 0 for none; kernels_src/params.cuh): with a cap c the kernels compute t = tanh(s * scale
    / c) and take c (forward lse) and c log2(e) (softmax) as the factors from t to logits; the backward keeps the
    caller's scale to scale dK and dQ."""
    c = p.softcap
    if not c:
        return dict(softmax_scale=p.scale, softmax_scale_log2=p.scale * _LOG2E, softcap_prescale=0.0)
    return dict(softmax_scale=p.scale if backward else c, softmax_scale_log2=c * _LOG2E,
                softcap_prescale=p.scale / c)


def check_softcap_build(spec, p) -> None:
    """A launch of the backward main kernel ``spec`` for ``p`` uses the soft-capping build exactly when ``p`` has a
    cap (RuntimeError otherwise: the other build would silently compute other scores; the forward has one build for
    both, its cap a launch parameter)."""
    if (("DASH_SOFTCAP", 1) in spec.defines) != bool(p.softcap):       # NOTES: on every eager launch: no dict
        raise RuntimeError(f"{spec.label}: softcap={p.softcap} needs the {'soft-capping' if p.softcap else 'plain'} "
                           f"build of this kernel")


def fwd_params(block_m, block_n, p, window, operands, out_ptr, lse_ptr, varlen=None, grid=None,
               counter_ptr=0) -> np.ndarray:
    """The forward's packed parameter block. ``operands``: ``(pointer, (batch, row, head) element strides)`` of
    q ``(B, Sq, H, D)``, k ``(B, Sk, Hkv, D)`` and v ``(B, Sk, Hkv, Dv)``; ``out_ptr``: a contiguous
    ``(B, Sq, H, Dv)`` buffer; ``lse_ptr``: a contiguous float32 ``(B, H, Sq)`` buffer. ``varlen``:
    ``(num_sequences, cu_seqlens_q pointer, cu_seqlens_k pointer)`` for a varlen launch; then ``p`` describes the
    packed tensors as one batch (B = 1, Sq = total_q, Sk = total_k) and lse is ``(H, total_q)``; ``grid``: the
    varlen launch's grid (:func:`fwd_head_section`; without it a varlen launch keeps the per-pair order);
    ``counter_ptr``: the persistent build's tile counter (fixed length; the tiles are those of :func:`fwd_grid`)."""
    B, Sq, Sk, H, Hkv, D, Dv = p.B, p.Sq, p.Sk, p.H, p.Hkv, p.D, p.Dv
    (q_ptr, q_stride), (k_ptr, k_stride), (v_ptr, v_stride) = operands
    batch, cu_q, cu_k = (B, 0, 0) if varlen is None else varlen
    m_blocks = -(-Sq // block_m)
    return kernels.pack_fwd_params(
        tma_q=tensormap.bhsd_map(q_ptr, p.dtype, (B, Sq, H, D), q_stride, block_m, "q"),
        tma_k=tensormap.bhsd_map(k_ptr, p.dtype, (B, Sk, Hkv, D), k_stride, block_n, "k"),
        tma_v=tensormap.bhsd_map(v_ptr, p.dtype, (B, Sk, Hkv, Dv), v_stride, block_n, "v"),
        tma_o=tensormap.bhsd_map(out_ptr, p.dtype, (B, Sq, H, Dv), bsh_strides((B, Sq, H, Dv)), 64, "out",
                                 box_panels=1),
        lse=lse_ptr, batch=batch, seqlen_q=Sq, seqlen_k=Sk, num_heads=H, num_heads_kv=Hkv,
        window_left=window[0], window_right=window[1], **logit_factors(p, backward=False),
        cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, out=out_ptr if varlen is not None else 0,
        head_section=fwd_head_section(p, block_m) if varlen is None else
        fwd_head_section(p, block_m, grid) if grid is not None else 0,
        tile_counter=counter_ptr, num_tiles=B * H * m_blocks if counter_ptr else 0,
        num_m_blocks=m_blocks if counter_ptr else 0)


# ------------------------------------------------------------------------------------------------------------
# backward
# ------------------------------------------------------------------------------------------------------------
class BwdLaunch:
    """What a backward launch needs besides buffer addresses: kernels, sizes, mask, workspace layout, schedule
    tables (``tables``, set by the caller).

    Built per call by the eager path and once per traced call by :mod:`cupy_dash.jax` (whose launches must
    depend on nothing but these constants and the buffer addresses). ``window``: (left, right) in
    ``schedule.canonical_window`` form. The workspace (one buffer, ``work_bytes``) holds the fp32 / int32 scratch
    arrays at ``offsets`` (each 256-byte aligned): lse_log2 and dpsum ``(B*H, Sq_rounded)`` float32, dq_accum
    ``(B*H, Sq_rounded, kernels.padded_head_dim(D))`` float32, dq_semaphore ``(B*H, num_m_blocks)`` int32, and for
    tables with split columns (``tables.pieces``) their slots (kernels.piece_slot_bytes each) and int32 counters;
    preprocess initialises them (the slots need none), so the buffer may hold anything. ``zero_kv``: whether dk and
    dv must be zeroed before the kernels run. ``fold``: whether the main kernel runs preprocess and postprocess itself
    (:func:`fold_wanted`; a caller may clear it before packing the block, never set it). ``plan``: its launch plan
    (:func:`cupy_dash.cuda.plans.backward_plan`, set by the caller once the tables are), which
    :func:`enqueue_backward` runs.
    """
    __slots__ = ("specs", "p", "block_m", "block_n", "num_m_blocks", "sq_rounded", "_sizes", "_layout_of", "tables",
                 "deterministic", "spin_timeout_ns", "causal", "window", "zero_kv", "varlen", "row_grid", "fold",
                 "plan")

    def __init__(self, specs, block_m, block_n, p, deterministic, spin_timeout_ns, causal, window, tables=None,
                 varlen=None):
        self.specs, self.block_m, self.block_n, self.p, self.tables = specs, block_m, block_n, p, tables
        self.plan = None
        self.deterministic, self.spin_timeout_ns = deterministic, spin_timeout_ns
        self.causal, self.window, self.varlen = causal, tuple(window), varlen
        if varlen is None:
            # NOTES: a KV tile no query sees is never written by the main kernel: dk, dv are zeroed first (two
            # memsets). Only a left window bound leaves such tiles: the leading keys of schedule.unseen_keys.
            self.zero_kv = _schedule.unseen_keys(p.Sq, p.Sk, causal, self.window) >= block_n
            self.num_m_blocks = -(-p.Sq // block_m)
            self.sq_rounded = self.num_m_blocks * block_m
            self.row_grid = (self.num_m_blocks, p.H, p.B)
        else:
            # varlen = (number of sequences, max_seqlen_q); p is the packed batch (B = 1, Sq = total_q). Scratch
            # rows are padded per sequence (kernels_src/bwd_rows.cuh): total_q + sequences * block_m per head.
            # Sequences without queries, or keys outside every window, leave dk, dv rows unwritten: zeroed.
            num_seqs, max_q = varlen
            self.zero_kv = True
            self.num_m_blocks = -(-(p.Sq + num_seqs * block_m) // block_m)
            self.sq_rounded = self.num_m_blocks * block_m
            self.row_grid = (-(-max_q // block_m), p.H, num_seqs)
        check_softcap_build(specs.main, p)
        self.fold = fold_wanted(p, block_m, block_n, self.zero_kv, varlen)
        rows = p.B * p.H * self.sq_rounded
        # dq_accum rows are the kernels' padded head dim wide (96: 128, kernels.padded_head_dim)
        self._sizes = (rows * 4, rows * 4, rows * kernels.padded_head_dim(p.D) * 4,
                       p.B * p.H * self.num_m_blocks * 4)

    def _layout(self) -> tuple:
        """``(offsets, work_bytes)`` for the tables set now, worked out once per tables object.
        NOTES: the fast path reads work_bytes on every call (0.57 us when worked out each time)."""
        memo, tables = getattr(self, "_layout_of", None), self.tables
        if memo is not None and memo[0] is tables:
            return memo[1]
        sizes = self._sizes
        split = getattr(tables, "pieces", None)
        if split is not None:
            slots = split.num_split * split.num_pieces
            sizes += (slots * kernels.piece_slot_bytes(self.p.D), split.num_split * 4)
        offsets, total = [], 0
        for n in sizes:
            offsets.append(total)
            total += -(-n // _WORKSPACE_ALIGN) * _WORKSPACE_ALIGN
        self._layout_of = (tables, (tuple(offsets), total))
        return self._layout_of[1]

    @property
    def offsets(self) -> tuple:
        """The workspace arrays' byte offsets (the class docstring's order; the tables set decide the last two)."""
        return self._layout()[0]

    @property
    def work_bytes(self) -> int:
        return self._layout()[1]


def varlen_work_bytes(specs, p, deterministic, spin_timeout_ns, causal, window, varlen) -> int:
    """The workspace of a varlen backward of ``p`` fixed before its lengths are known (a traced JAX call): the
    largest over the tiles its launch may take, since the packing's table decides (compact tables have no
    80-query build: :func:`cupy_dash.core.varlen_launch.packing_launch` rebuilds those with 64); the 80-query tile
    where a sequence may reach VARLEN80_MIN_SEQLEN (``varlen`` = (sequences, max_seqlen_q))."""
    tiles = {(t.block_m, t.block_n) for t in (kernels.bwd_tile(p.D, causal, True), *(
        kernels.bwd_tile(p.D, causal, seqlen_q=sq, window=window) for sq in kernels.varlen_tile_seqlens(varlen[1])))}
    return max(BwdLaunch(specs, bm, bn, p, deterministic, spin_timeout_ns, causal, window, varlen=varlen).work_bytes
               for bm, bn in tiles)


def fold_wanted(p, block_m, block_n, zero_kv, varlen) -> bool:
    """Whether a backward of ``p`` is folded into one launch (kernels_src/bwd/fold.cuh): fixed-length batches
    whose dk, dv need no zeroing, of at most FOLD_MAX_TILES tile pairs; ``CUPY_DASH_FOLD`` = 0 never folds, = 1
    folds every such backward whatever its size."""
    if varlen is not None or zero_kv:
        return False
    forced = config.FOLD.get()
    if forced is not None:
        return forced
    return p.B * p.H * -(-p.Sq // block_m) * -(-p.Sk // block_n) <= FOLD_MAX_TILES


@functools.lru_cache(maxsize=None)
def l2_bytes(device_id: int) -> int:
    """The L2 cache size of device ``device_id`` in bytes."""
    return int(cupy.cuda.Device(device_id).attributes["L2CacheSize"])


def head_section(tokens_q: int, head_dim: int, group_size: int, head_dim_v: int | None, device_id: int) -> int:
    """The ``fa3`` policy's head section (:func:`cupy_dash.schedule.l2_head_section`, 16-bit inputs; ``head_dim_v``
    None: ``head_dim``) for ``tokens_q`` query tokens per head (a packed batch: all of them) on ``device_id``."""
    return _schedule.l2_head_section(tokens_q, head_dim, group_size, l2_bytes(device_id), head_dim_v)


def bwd_tables(schedule, c, max_ctas, device_id, stream, capture=False, compact=False):
    """The device tables of ``schedule`` for the fixed-length backward ``c`` (:func:`cupy_dash.cuda.device_tables.
    per_visit`): one KV tile with all the query heads of its group per work unit, at most ``max_ctas``
    (co-resident) CTAs. Every entry point gets its tables here, so equal problems get equal tables, hence equal
    bits. ``compact``: the per-column records of the same schedule (:func:`cupy_dash.cuda.device_tables.compact`) for
    the DASH_COMPACT build. Per-visit tables have their last wave cut into pieces of KV columns where
    :func:`split_pieces` says so."""
    p = c.p
    kv_tiles = p.B * p.Hkv * -(-p.Sk // c.block_n)
    section = head_section(p.Sq, p.D, p.H // p.Hkv, p.Dv, device_id)
    args = (schedule, p.Sq, p.Sk, c.block_m, c.block_n, p.B * p.H, c.causal, min(max_ctas, kv_tiles), device_id,
            stream, p.H // p.Hkv, c.window)
    if compact:
        return device_tables.compact(*args, capture=capture, head_section=section)
    return device_tables.per_visit(*args, capture=capture, head_section=section, split=split_pieces(schedule, c))


def split_pieces(schedule, c) -> int:
    """Pieces per split KV column of the per-visit tables of the fixed-length backward ``c`` under ``schedule``
    (0: uncut): :func:`cupy_dash.schedule.pieces.num_pieces_for` (``auto`` at long full masks; CUPY_DASH_SPLIT_COLUMNS,
    CUPY_DASH_SPLIT_PIECES) where the kernels take split columns (:func:`kernels.pieces_built`)."""
    p = c.p
    forced, num_pieces = config.SPLIT_COLUMNS.get(), config.SPLIT_PIECES.get()    # a bad value raises every call
    if not kernels.pieces_built(p.D, p.Dv, p.softcap > 0):
        return 0
    return _pieces.num_pieces_for(schedule, c.num_m_blocks, c.block_m, c.causal, p.H // p.Hkv, c.window, forced,
                                  num_pieces)


def bwd_kernels(c) -> tuple:
    """``(spec, grid)`` of every kernel of the backward ``c`` (tables set), in launch order: preprocess, main
    (persistent: one CTA per table column list) and postprocess; the main kernel alone when ``c.fold``."""
    main = (c.specs.main, (c.tables.num_ctas,))
    if c.fold:
        return (main,)
    return (c.specs.preprocess, c.row_grid), main, (c.specs.postprocess, c.row_grid)


def enqueue_backward(c, stream, buffers, *, slot=None, call=None) -> None:
    """Run the launch plan of the backward ``c`` (``c.plan``: zero dk and dv when ``c.zero_kv``, then
    :func:`bwd_kernels`, one ``cuLaunchKernel`` each) on the CuPy ``stream`` with the addresses ``buffers``
    (:data:`cupy_dash.cuda.plans.BWD_BUFFERS`' order; the error record's two last where the plan takes them).
    With an error ``slot`` (eager calls, whose block holds its device record and host mirror) the kernels hand the
    record to the host when they end (kernels_src/bwd/error_record.cuh); the slot is then tracked as ``call``,
    or retired if the launch fails. Never synchronizes or allocates device memory.
    NOTES: a failed launch may have enqueued the kernels before the one that failed (a non-sticky error, such as
    too few resources for the last), which will still write the slot's record: it is never handed out again."""
    c.plan.run(stream.ptr, buffers)
    if slot is not None:
        _track(slot, call)


def kv_bytes(p) -> tuple:
    """Bytes of dk and dv: contiguous (B, Sk, Hkv, D) and (B, Sk, Hkv, Dv) 16-bit buffers."""
    return p.B * p.Sk * p.Hkv * p.D * 2, p.B * p.Sk * p.Hkv * p.Dv * 2


# The schedule fields of BwdParams, null / 0: each kind of table sets its own (per-visit rows, compact records,
# compact varlen records) over these.
_NO_SCHEDULE = dict(visits=0, rank=0, cta_start=0, col_records=0, cta_columns=0, cta_col_start=0, scan_bounds=0,
                    n_first=0, columns_per_head=0, tie_sign=0, rank_rule=0, tile_columns=0, seg_col_start=0,
                    seq_n_first=0, seq_tile_start=0, cta_pieces=0, piece_code=0, num_pieces=0, num_split_columns=0)
SCHEDULE_FIELDS = tuple(_NO_SCHEDULE)   # every field bwd_schedule_fields sets


def bwd_schedule_fields(tables) -> dict:
    """Every schedule field of the backward's block (_NO_SCHEDULE's names) for device ``tables``."""
    if hasattr(tables, "params"):            # tables that name their fields: compact records, GPU-expanded rows
        return dict(_NO_SCHEDULE, **tables.params())
    split = getattr(tables, "pieces", None)
    pieces = {} if split is None else dict(
        cta_pieces=split.cta_pieces.data.ptr, piece_code=split.piece_code.data.ptr, num_pieces=split.num_pieces,
        num_split_columns=split.num_split)
    return dict(_NO_SCHEDULE, visits=tables.visits.data.ptr, rank=tables.rank.data.ptr,
                cta_start=tables.cta_start.data.ptr, **pieces)


def check_pieces(c) -> None:
    """ValueError unless the kernels of the backward ``c`` take its tables' split columns, if any
    (kernels_src/bwd/pieces.cuh kPiecesBuilt; the counters are zeroed one per preprocess tile)."""
    split = getattr(c.tables, "pieces", None)
    if split is None:
        return
    p = c.p
    if not kernels.pieces_built(p.D, p.Dv, p.softcap > 0) or c.varlen is not None:
        raise ValueError(f"plan: split KV columns need head dim 64, 96 or 128 (equal value head dim), no "
                         f"soft-capping and fixed lengths, got D={p.D}, Dv={p.Dv}, softcap={p.softcap}")
    if split.num_split > p.B * p.H * c.num_m_blocks:
        raise ValueError(f"plan: {split.num_split} split columns, more than the {p.B * p.H * c.num_m_blocks} tiles "
                         f"whose preprocess zeroes their counters")


def bwd_params(c, operands, lse_ptr, work_base, grads, error, timeline_ptr=0, cu_seqlens=(0, 0)) -> np.ndarray:
    """The backward's packed parameter block (the three kernels share it; window from ``c``). ``operands``:
    ``(pointer, (batch, row, head) element strides)`` of q, k, v, out, dout; ``lse_ptr``: float32 ``(B, H, Sq)``
    contiguous; ``work_base``: ``c.work_bytes`` of scratch; ``grads``: pointers of contiguous dq
    ``(B, Sq, H, D)``, dk ``(B, Sk, Hkv, D)`` and dv ``(B, Sk, Hkv, Dv)``; ``error``: ``(device record, host
    mirror)`` addresses, the main kernel's 32-byte error record and, for eager calls (else 0), its mirror
    (``errors._Slot``).
    Varlen (``c.varlen``): the operands are the packed tensors as one batch, lse is ``(H, total_q)`` and
    ``cu_seqlens`` the device pointers of cu_seqlens_q and cu_seqlens_k."""
    p, tables = c.p, c.tables
    B, Sq, Sk, H, Hkv, D, Dv = p.B, p.Sq, p.Sk, p.H, p.Hkv, p.D, p.Dv
    (q_ptr, q_stride), (k_ptr, k_stride), (v_ptr, v_stride), (o_ptr, o_stride), (do_ptr, do_stride) = operands
    dq_ptr, dk_ptr, dv_ptr = grads
    schedule_fields = bwd_schedule_fields(tables)
    check_pieces(c)
    base, offsets, bm, bn = work_base, c.offsets, c.block_m, c.block_n
    split = getattr(tables, "pieces", None) is not None
    return kernels.pack_bwd_params(
        tma_q=tensormap.bhsd_map(q_ptr, p.dtype, (B, Sq, H, D), q_stride, bm, "q"),
        tma_k=tensormap.bhsd_map(k_ptr, p.dtype, (B, Sk, Hkv, D), k_stride, bn, "k"),
        tma_v=tensormap.bhsd_map(v_ptr, p.dtype, (B, Sk, Hkv, Dv), v_stride, bn, "v"),
        tma_do=tensormap.bhsd_map(do_ptr, p.dtype, (B, Sq, H, Dv), do_stride, bm, "do"),
        tma_dk=tensormap.bhsd_map(dk_ptr, p.dtype, (B, Sk, Hkv, D), bsh_strides((B, Sk, Hkv, D)), 64, "dk"),
        tma_dv=tensormap.bhsd_map(dv_ptr, p.dtype, (B, Sk, Hkv, Dv), bsh_strides((B, Sk, Hkv, Dv)), 64, "dv"),
        q=q_ptr, k=k_ptr, v=v_ptr, out=o_ptr, dout=do_ptr, lse=lse_ptr,
        lse_log2=base + offsets[0], dpsum=base + offsets[1], dq_accum=base + offsets[2],
        dq=dq_ptr, dk=dk_ptr, dv=dv_ptr, dq_semaphore=base + offsets[3] if c.deterministic else 0,
        dkv_pieces=base + offsets[4] if split else 0, piece_count=base + offsets[5] if split else 0,
        **schedule_fields, error=error[0], error_host=error[1], timeline=timeline_ptr,
        q_stride=q_stride, k_stride=k_stride, v_stride=v_stride, o_stride=o_stride, do_stride=do_stride,
        dq_stride=bsh_strides((B, Sq, H, D)), dk_stride=bsh_strides((B, Sk, Hkv, D)),
        dv_stride=bsh_strides((B, Sk, Hkv, Dv)),
        batch=B if c.varlen is None else c.varlen[0], seqlen_q=Sq, seqlen_k=Sk, num_heads=H, num_heads_kv=Hkv,
        window_left=c.window[0], window_right=c.window[1], num_m_blocks=c.num_m_blocks,
        seqlen_q_rounded=c.sq_rounded, spin_timeout_ns=c.spin_timeout_ns,
        **logit_factors(p, backward=True), cu_seqlens_q=cu_seqlens[0],
        cu_seqlens_k=cu_seqlens[1], fold=int(c.fold))
