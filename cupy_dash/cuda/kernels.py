"""Kernel variants, their tile plans, and how they are launched: every variant the dispatcher can launch is a
:class:`KernelSpec` built from the one tile table :data:`TILES`, and ``compile --all`` compiles exactly
:func:`all_specs` (docs/architecture.md, "The kernels"). Re-exports :mod:`cupy_dash.cuda.params`' packing names.
Needs no GPU except :func:`launch`, :func:`max_resident_ctas` and :func:`bwd_entry`.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import itertools

import numpy as np

from .. import config, gpu
from . import executor
from .params import (BWD_PARAMS_DTYPE, FWD_PARAMS_DTYPE, PARAMS_STRUCTS, pack_bwd_params,  # noqa: F401
                     pack_fwd_params, params_layout_check_source)
from .params import CONSTANTS as K

SUPPORTED_HEAD_DIMS = (64, 96, 128, 192, 256)   # the forward's
BWD_HEAD_DIMS = (64, 96, 128, 192, 256)          # the backward's
# NOTES: backward head dims built (in all_specs) but refused by the API until their GPU tests pass on the H200,
# which enable them (tests/gpu/conftest.py); docs/decisions/head-dim-plans.md records when each head dim moved.
BWD_PENDING_HEAD_DIMS = ()
BWD_BUILT_HEAD_DIMS = BWD_HEAD_DIMS + BWD_PENDING_HEAD_DIMS   # every backward head dim that has kernels
SUPPORTED_DTYPES = ("bfloat16", "float16")
# NOTES: the value head dims (v, out, dout, dv) that differ from the query / key head dim: 128 with 192
# (DeepSeek-style MLA training), tiles 192 wide as kernels_src/tile_tma.cuh says; other calls have equal head dims.
VALUE_HEAD_DIMS = {192: (128,)}


def value_head_dims(head_dim: int) -> tuple:
    """The value head dims the kernels take with query / key head dim ``head_dim``: itself, then VALUE_HEAD_DIMS'."""
    return (head_dim, *VALUE_HEAD_DIMS.get(head_dim, ()))


@dataclasses.dataclass(frozen=True)
class TileConfig:
    block_m: int     # query rows per tile
    block_n: int     # key rows per tile
    threads: int     # threads per CTA


def padded_head_dim(head_dim: int) -> int:
    """The kernels' compute width for ``head_dim``: head dim 96 runs the head-dim-128 kernels, tiles and dq_accum
    rows padded to 128 columns (kernels_src/tile_tma.cuh); the others run as they are."""
    return 128 if head_dim == 96 else head_dim


PIECES_HEAD_DIMS = (64, 96, 128)


def pieces_built(head_dim: int, head_dim_v: int, softcap: bool) -> bool:
    """Whether the backward kernels for these take tables with split KV columns (kernels_src/bwd/pieces.cuh
    kPiecesBuilt: the loop per run, head dims 64, 96 and 128; per-visit tables, which the caller checks)."""
    return head_dim in PIECES_HEAD_DIMS and head_dim_v == head_dim and not softcap


def piece_slot_bytes(head_dim: int) -> int:
    """Bytes of one piece's slot (pieces.cuh kPieceSlotFloat4 float4s): fp32 dK and dV of 128 keys by the head dim
    (96 unpadded: the accumulators' width)."""
    return 2 * 128 * head_dim * 4


# ---------------------------------------------------------------------------------------------------------
# THE tile table, (kernel, head_dim[, "full80"]) -> TileConfig: a tile plan is a one-line edit here. bwd_preprocess
# / bwd_postprocess take bwd_main's block_m, block_n (their rows follow its dq_accum / dpsum / lse_log2 layout) with
# AUX_THREADS and no dynamic smem. Thread counts are kernels_src/constants.cuh's (static_asserted by the kernels).
MAIN_THREADS = K.kMainThreads
MAIN_THREADS_3MMA = K.kMainThreads3Mma   # the head-dim-192 backward: three MMA warpgroups
TILES = {
    ("fwd", 64): TileConfig(block_m=128, block_n=128, threads=MAIN_THREADS),
    ("fwd", 96): TileConfig(block_m=128, block_n=128, threads=MAIN_THREADS),
    ("fwd", 128): TileConfig(block_m=128, block_n=128, threads=MAIN_THREADS),
    ("fwd", 192): TileConfig(block_m=128, block_n=64, threads=MAIN_THREADS),
    ("fwd", 256): TileConfig(block_m=128, block_n=64, threads=MAIN_THREADS),
    ("bwd_main", 64): TileConfig(block_m=128, block_n=128, threads=MAIN_THREADS),
    ("bwd_main", 96): TileConfig(block_m=64, block_n=128, threads=MAIN_THREADS),
    ("bwd_main", 96, "full80"): TileConfig(block_m=80, block_n=128, threads=MAIN_THREADS),
    ("bwd_main", 128): TileConfig(block_m=64, block_n=128, threads=MAIN_THREADS),
    ("bwd_main", 128, "full80"): TileConfig(block_m=80, block_n=128, threads=MAIN_THREADS),
    ("bwd_main", 192): TileConfig(block_m=64, block_n=96, threads=MAIN_THREADS_3MMA),
    ("bwd_main", 192, "compact"): TileConfig(block_m=96, block_n=64, threads=MAIN_THREADS_3MMA),
    ("bwd_main", 256): TileConfig(block_m=64, block_n=64, threads=MAIN_THREADS),
}
# NOTES: head dim 96 runs head dim 128's kernels padded (padded_head_dim). Head dims 192 and 256 take 64 keys per
# forward tile (128 would not fit shared memory) and split the head dim between the MMA warpgroups of the backward,
# kernels_src/bwd/split_step.cuh (docs/decisions/head-dim-plans.md); head dim 192's backward takes FA3's 64 x 96
# tile, kernels_src/bwd/keys_step.cuh (S and dP split by keys), except with compact tables: their MMA warpgroups get
# 152 registers (kernels_src/warp_roles.cuh), in which the 64 x 96 visit spills (ptxas serializes its wgmmas), so
# they keep the 96 x 64 tile (split_step.cuh), as the 80-query tile of head dim 128 has no compact build.
AUX_THREADS = K.kAuxThreads


# NOTES: dynamic shared memory as each kernel's SmemLayout (fwd/config.cuh, bwd/config.cuh) lays it out, with
# kernels_src/constants.cuh's stage counts and sizes, needed before compiling (KernelSpec, DASH_SMEM_BYTES); each
# kernel static_asserts its layout's size equals DASH_SMEM_BYTES, so
# that `python -m cupy_dash compile --all` fails on any disagreement. Tiles are padded_head_dim columns wide.
def _fwd_smem(t: TileConfig, d: int, stages: int | None = None) -> int:
    """kernels_src/fwd/config.cuh SmemLayout: Q; K, V x stages (default kFwdKvStages; DASH_KV_STAGES overrides it
    in benchmarks/fwd_tiles.py's sweeps); 6 + 4 x stages mbarriers and two 8-byte tile slots; the alignment slack."""
    stages, d = K.kFwdKvStages if stages is None else stages, padded_head_dim(d)
    return (t.block_m + 2 * stages * t.block_n) * d * 2 + K.kMbarrierBytes * (6 + 4 * stages) + 16 + K.kSmemAlign


def _bwd_main_smem(t: TileConfig, d: int) -> int:
    """kernels_src/bwd/config.cuh SmemLayout: K x k_stages, V; Q x stages, dO x do_stages, dS x stages (head dims
    192 and 256: P too, 192 with one P / dS stage); the fp32 dQ staging (192 and 256: half the tile, the whole tile
    with 192's 64 x 96: one dQ piece per MMA warpgroup); lse x stages, dpsum x do_stages; 2 x (k_stages + 1 + stages
    + do_stages) mbarriers; a visit slot per stage; the alignment slack. The 80-query tile has one K buffer, head
    dims 192 and 256 one K buffer and one dO stage."""
    split = d in (192, 256)
    dq_pieces = 2 if split and t.block_n == 64 else 1
    stages, d = K.kBwdStages, padded_head_dim(d)
    k_stages = 1 if t.block_m == 80 or split else K.kBwdKStages
    do_stages = 1 if split else stages
    pds_stages = 1 if d == 192 else stages
    return ((k_stages + 1) * t.block_n * d * 2 + (stages + do_stages) * t.block_m * d * 2
            + (2 if split else 1) * pds_stages * t.block_m * t.block_n * 2
            + t.block_m * d * 4 // dq_pieces + (stages + do_stages) * t.block_m * 4
            + K.kMbarrierBytes * 2 * (k_stages + 1 + stages + do_stages) + K.kVisitSlotBytes * stages + K.kSmemAlign)


# kernel name: (source file, entry point, dynamic smem bytes as a function of (tile, head_dim))
KERNELS = {
    "fwd": ("fwd.cu", "dash_fwd", _fwd_smem),
    "bwd_preprocess": ("bwd_preprocess.cu", "dash_bwd_preprocess", lambda t, d: 0),
    "bwd_main": ("bwd_main.cu", "dash_bwd_main", _bwd_main_smem),
    "bwd_postprocess": ("bwd_postprocess.cu", "dash_bwd_postprocess", lambda t, d: 0),
    "bwd_expand": ("bwd_expand.cu", "dash_bwd_expand", lambda t, d: 0),
}
KERNEL_NAMES = tuple(KERNELS)
# ---------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """One compilable, launchable kernel variant. Hashable (used as a cache/memo key)."""
    source: str              # file name under kernels_src/
    entry: str               # extern "C" entry point
    defines: tuple           # sorted ((name, int), ...), passed as -Dname=value
    threads: int
    smem_bytes: int          # dynamic shared memory at launch (DASH_SMEM_BYTES)

    def __hash__(self):      # NOTES: specs key per-launch caches; hash the fields once
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.source, self.entry, self.defines, self.threads, self.smem_bytes))
            object.__setattr__(self, "_hash", h)
        return h

    @property
    def kernel(self) -> str:
        """The kernel's name in :data:`KERNELS` ("fwd", "bwd_main", ...)."""
        for name, (source, entry, _) in KERNELS.items():
            if source == self.source and entry == self.entry:
                return name
        return self.entry

    @property
    def label(self) -> str:
        """Readable name, e.g. ``bwd_main[bf16,d128,causal]``, ``fwd[fp16,d64,full]`` or
        ``bwd_main[bf16,d128,m80,full]`` (the 80-query tile; ``m96``: head dim 192's 96 x 64 of compact tables)."""
        d = dict(self.defines)
        tags = []
        if "DASH_FP16" in d:
            tags.append("fp16" if d["DASH_FP16"] else "bf16")
        if "DASH_HEAD_DIM" in d:
            tags.append(f"d{d['DASH_HEAD_DIM']}")
        if "DASH_HEAD_DIM_V" in d:
            tags.append(f"v{d['DASH_HEAD_DIM_V']}")
        if d.get("DASH_BLOCK_M") == 80 or (d.get("DASH_HEAD_DIM") == 192 and d.get("DASH_BLOCK_M") == 96):
            tags.append(f"m{d['DASH_BLOCK_M']}")
        if "DASH_CAUSAL" in d:
            tags.append("causal" if d["DASH_CAUSAL"] else "full")
        tags += [flag for flag in ("compact", "persistent", "softcap", "timeline") if d.get(f"DASH_{flag.upper()}")]
        return f"{self.kernel}[{','.join(tags)}]"

    @property
    def params_dtype(self) -> np.dtype:
        return FWD_PARAMS_DTYPE if self.entry == KERNELS["fwd"][1] else BWD_PARAMS_DTYPE


def check_supported(dtype: str, head_dim: int, backward: bool = True, head_dim_v: int | None = None) -> None:
    """ValueError unless the kernels take ``dtype`` and ``head_dim`` (``backward``: the backward's head dims) and
    the value head dim ``head_dim_v`` (None: ``head_dim``; else ``head_dim`` or one of VALUE_HEAD_DIMS')."""
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r}; expected one of {SUPPORTED_DTYPES}")
    dims = BWD_BUILT_HEAD_DIMS if backward else SUPPORTED_HEAD_DIMS
    if head_dim not in dims:
        raise ValueError(f"unsupported head_dim {head_dim!r}{' for the backward' if backward else ''}; expected "
                         f"one of {dims}")
    if head_dim_v is not None and head_dim_v not in value_head_dims(head_dim):
        raise ValueError(f"unsupported head_dim_v {head_dim_v!r} with head_dim {head_dim}; expected one of "
                         f"{value_head_dims(head_dim)}")


def _value_counts(head_dim: int, head_dim_v: int | None) -> dict:
    """The DASH_HEAD_DIM_V define of a value head dim that differs from ``head_dim`` (none otherwise)."""
    return {} if head_dim_v in (None, head_dim) else {"DASH_HEAD_DIM_V": int(head_dim_v)}


def fwd_tile(head_dim: int) -> TileConfig:
    check_supported("bfloat16", head_dim, backward=False)
    return TILES[("fwd", head_dim)]


# NOTES: head dims 128 and 96 take 80-query tiles (FA3's full-mask plan) from these query lengths on, measured in
# docs/decisions/tile-plans.md ("FA3's full-mask tile", "The 80-query tile under a causal mask", "Full masks from
# 1024 queries"): full from 1024 (a loss at 512), causal from 8k (2-4 % slower at 4k). Varlen
# batches take it by their longest sequence from VARLEN80_MIN_SEQLEN on (equal at 4 x 4096, +2-3 % at 1 x 16k, +5-9 %
# with random lengths; 16 x 1024: equal full, 6 % slower causal); windows keep 64 (not measured), compact tables too
# (spilled).
# NOTES: the functional API's fixed-length causal forwards (and their fast path) take the persistent build (one CTA
# per SM claiming tiles, docs/decisions/fwd-launch-order.md, "The persistent forward": +10 / +6 / +3 / +2 / 0 % at
# causal 1k-16k, -1.4 / -0.3 % at full 3840 / 15360), and so do the JAX custom calls of fixed length (their counter
# is a result of the call); varlen launches keep one CTA per tile.
# The set holds the ``causal`` flags that take it.
FWD_PERSISTENT = frozenset({True})

FULL80_MIN_SEQLEN = 1024
CAUSAL80_MIN_SEQLEN = 8192
VARLEN80_MIN_SEQLEN = 4096


def varlen_tile_seqlen(longest: int) -> int:
    """The ``seqlen_q`` that :func:`bwd_tile` (and bwd_specs, bwd_entry) take for a varlen batch whose longest
    sequence has ``longest`` queries: ``longest`` from VARLEN80_MIN_SEQLEN on, else 0 (the 64-query tile)."""
    return int(longest) if longest >= VARLEN80_MIN_SEQLEN else 0


def varlen_tile_seqlens(max_seqlen_q: int) -> tuple:
    """The :func:`varlen_tile_seqlen` values that stand for every tile a packing of sequences of at most
    ``max_seqlen_q`` queries may take (what a call fixed before its lengths are known prepares for)."""
    return tuple({0, varlen_tile_seqlen(max_seqlen_q)})


def bwd_tile(head_dim: int, causal: bool, compact: bool = False, seqlen_q: int = 0,
             window: tuple = (-1, -1)) -> TileConfig:
    """The backward main kernel's tile (preprocess / postprocess share block_m and block_n). Head dim 128 (or 96,
    padded to 128) without a window (``window`` canonical; a causal call's right side is 0), ``seqlen_q`` >=
    FULL80_MIN_SEQLEN (CAUSAL80_MIN_SEQLEN with ``causal``) and per-visit tables: 80 queries.
    ``CUPY_DASH_BWD_FULL_BLOCK_M`` (without a causal mask) and ``CUPY_DASH_BWD_CAUSAL_BLOCK_M`` (with one) = 64 / 80
    force either for any such call without compact tables (varlen calls pass :func:`varlen_tile_seqlen`). Head dim
    192: 64 x 96, or 96 x 64 with compact tables."""
    check_supported("bfloat16", head_dim)
    if head_dim == 192 and compact:
        return TILES[("bwd_main", head_dim, "compact")]
    if head_dim in (96, 128) and not compact:
        forced = (config.BWD_CAUSAL_BLOCK_M if causal else config.BWD_FULL_BLOCK_M).get()
        min_seqlen = CAUSAL80_MIN_SEQLEN if causal else FULL80_MIN_SEQLEN
        if forced == 80 or (forced is None and seqlen_q >= min_seqlen and window[0] == -1
                            and (causal or window[1] == -1)):
            return TILES[("bwd_main", head_dim, "full80")]
    return TILES[("bwd_main", head_dim)]


def _spec(kernel: str, tile: TileConfig, dtype: str, head_dim: int, smem=None, counts=None, **flags) -> KernelSpec:
    """``flags`` become 0 / 1 defines, ``counts`` ({define: int}) are passed as they are; ``smem``: the dynamic
    shared memory when the kernel's formula needs more than (tile, head_dim)."""
    source, entry, smem_fn = KERNELS[kernel]
    smem = int(smem_fn(tile, head_dim) if smem is None else smem)
    defines = {
        "DASH_FP16": int(dtype == "float16"),
        "DASH_HEAD_DIM": head_dim,
        "DASH_BLOCK_M": tile.block_m,
        "DASH_BLOCK_N": tile.block_n,
        "DASH_NUM_THREADS": tile.threads,
        "DASH_SMEM_BYTES": smem,
    }
    defines.update({k: int(bool(v)) for k, v in flags.items()})
    defines.update(counts or {})
    return KernelSpec(source=source, entry=entry, defines=tuple(sorted(defines.items())), threads=tile.threads,
                      smem_bytes=smem)


def fwd_spec(dtype: str, head_dim: int, causal: bool, head_dim_v: int | None = None,
             persistent: bool = False) -> KernelSpec:
    """The forward kernel (``head_dim_v``: the value head dim, None for ``head_dim``). Packed variable-length
    sequences and logit soft-capping are the launch's choices (kernels_src/params.cuh: cu_seqlens_q set,
    softcap_prescale != 0): one build serves every combination. ``persistent``: the build whose CTAs (one per SM)
    claim tiles from a zeroed counter (FwdParams.tile_counter; fixed-length launches of the functional API and the
    fast path, :data:`FWD_PERSISTENT`)."""
    check_supported(dtype, head_dim, backward=False, head_dim_v=head_dim_v)
    flags = {"DASH_PERSISTENT": True} if persistent else {}
    return _spec("fwd", fwd_tile(head_dim), dtype, head_dim, counts=_value_counts(head_dim, head_dim_v),
                 DASH_CAUSAL=causal, **flags)


BwdKernels = collections.namedtuple("BwdKernels", "preprocess main postprocess")


def _main_counts(dq_writers: int, tile: TileConfig) -> dict:
    """The main kernel's integer defines that differ from kernels_src/bwd/config.cuh's and warp_roles.cuh's
    defaults: the dQ writer warps, three MMA warpgroups (head dim 192's 512 threads)."""
    counts = {"DASH_DQ_WRITERS": dq_writers} if dq_writers != 2 else {}
    if tile.threads == MAIN_THREADS_3MMA:
        counts["DASH_NUM_MMA_WG"] = 3
    return counts


def bwd_specs(dtype: str, head_dim: int, causal: bool, timeline: bool = False, compact: bool = False,
              softcap: bool = False, seqlen_q: int = 0, window: tuple = (-1, -1),
              head_dim_v: int | None = None) -> BwdKernels:
    """The three backward kernels of one variant. ``timeline``: the main kernel's debug build that stamps every
    visit (kernels_src/bwd/timeline.cuh; not emitted by the dispatcher); ``compact``: the main kernel reads
    per-column records (kernels_src/compact_view.cuh) instead of per-visit rows; ``softcap``: the main kernel with
    logit soft-capping; ``seqlen_q``, ``window`` (canonical): the tile's choice (:func:`bwd_tile`); ``head_dim_v``:
    the value head dim (None: ``head_dim``), a define of preprocess and the main kernel. Varlen and deterministic /
    atomic are the launch's choices (cu_seqlens set; a dQ semaphore array or none), not builds. ValueError for
    ``compact`` with ``timeline``, or an unsupported dtype or head dim."""
    if timeline and compact:
        raise ValueError("timeline builds need the per-visit tables: no compact timeline variant")
    check_supported(dtype, head_dim, head_dim_v=head_dim_v)
    value = _value_counts(head_dim, head_dim_v)
    main_tile = bwd_tile(head_dim, causal, compact, seqlen_q, window)
    aux_tile = TileConfig(main_tile.block_m, main_tile.block_n, AUX_THREADS)
    flags = dict(DASH_CAUSAL=causal)
    if timeline:
        flags["DASH_TIMELINE"] = True
    if compact:
        flags["DASH_COMPACT"] = True
    if softcap:
        flags["DASH_SOFTCAP"] = True
    return BwdKernels(
        preprocess=_spec("bwd_preprocess", aux_tile, dtype, head_dim, counts=value),
        main=_spec("bwd_main", main_tile, dtype, head_dim, smem=_bwd_main_smem(main_tile, head_dim),
                   counts={**_main_counts(config.BWD_DQ_WRITERS.get(), main_tile), **value}, **flags),
        postprocess=_spec("bwd_postprocess", aux_tile, dtype, head_dim),
    )


EXPAND_CHUNKS = 4       # bwd_expand's grid: (schedule CTAs, EXPAND_CHUNKS) blocks of AUX_THREADS threads


@functools.lru_cache(maxsize=None)
def expand_spec() -> KernelSpec:
    """The kernel that expands compact records into the per-visit table on the GPU (kernels_src/bwd_expand.cu);
    it depends on no dtype or head dim (built with bf16 / d64's defines); varlen records are the launch's choice
    (seg_col_start set)."""
    tile = bwd_tile(64, False)
    return _spec("bwd_expand", TileConfig(tile.block_m, tile.block_n, AUX_THREADS), "bfloat16", 64, DASH_COMPACT=True)


def all_specs() -> list:
    """Every distinct variant the dispatcher can emit: per dtype, head dim and mask the forward; per dtype and
    backward head dim (BWD_HEAD_DIMS and the pending BWD_PENDING_HEAD_DIMS) preprocess and postprocess, and per mask
    the main kernel with per-visit tables, with compact tables, with soft-capping and with both; the 80-query tile's
    (head dims 96 and 128: preprocess, postprocess, main with and without soft-capping); bwd_expand
    (docs/architecture.md, "The kernels")."""
    specs = []
    seen = set()
    for dtype, head_dim, causal in itertools.product(SUPPORTED_DTYPES, SUPPORTED_HEAD_DIMS, (False, True)):
        batch = []
        for dv in value_head_dims(head_dim):       # a value head dim of its own shares postprocess (dq's width)
            batch.append(fwd_spec(dtype, head_dim, causal, dv))
            if causal in FWD_PERSISTENT:
                batch.append(fwd_spec(dtype, head_dim, causal, dv, persistent=True))
            if head_dim in BWD_BUILT_HEAD_DIMS:
                batch.extend(bwd_specs(dtype, head_dim, causal, head_dim_v=dv))
                batch.extend(bwd_specs(dtype, head_dim, causal, compact=True, head_dim_v=dv))  # 192: own tile
                batch.append(bwd_specs(dtype, head_dim, causal, softcap=True, head_dim_v=dv).main)  # logit capping
                batch.append(bwd_specs(dtype, head_dim, causal, compact=True, softcap=True, head_dim_v=dv).main)
                for softcap in (False, True):             # the 80-query tile (head dims 96 and 128)
                    batch.extend(bwd_specs(dtype, head_dim, causal, softcap=softcap, seqlen_q=CAUSAL80_MIN_SEQLEN,
                                           head_dim_v=dv))
                batch.append(expand_spec())
        for spec in batch:
            if spec not in seen:
                seen.add(spec)
                specs.append(spec)
    order = {name: i for i, name in enumerate(KERNEL_NAMES)}

    def key(s):
        d = dict(s.defines)
        return (order.get(s.kernel, len(order)), d.get("DASH_SOFTCAP", 0), d["DASH_FP16"], d["DASH_HEAD_DIM"],
                d.get("DASH_HEAD_DIM_V", 0), d.get("DASH_CAUSAL", 0), d.get("DASH_COMPACT", 0))
    return sorted(specs, key=key)


def timeline_specs() -> list:
    """The main kernel's timeline debug builds (``bwd_specs(timeline=True)``, benchmarks/timeline.py): bf16, per
    backward head dim and mask, and the 80-query tile's; not emitted by the dispatcher, so not in
    :func:`all_specs`."""
    specs = {bwd_specs("bfloat16", d, causal, timeline=True, seqlen_q=sq).main
             for d in BWD_BUILT_HEAD_DIMS for causal in (False, True) for sq in (0, CAUSAL80_MIN_SEQLEN)}
    return sorted(specs, key=lambda s: s.label)


# ---------------------------------------------------------------------------------------------------------
# GPU side.
def grid_xyz(grid) -> tuple:
    """``grid`` (int or 1 to 3 ints, each >= 1) as (x, y, z)."""
    grid = (grid,) if isinstance(grid, (int, np.integer)) else tuple(int(g) for g in grid)
    if not 1 <= len(grid) <= 3 or any(g < 1 for g in grid):
        raise ValueError(f"bad grid {grid}: 1 to 3 dimensions, each >= 1")
    return grid + (1,) * (3 - len(grid))


def launch(spec: KernelSpec, grid, params, stream, func=None) -> None:
    """Launch ``spec`` with ``grid`` (int or tuple), ``spec.threads`` threads and ``spec.smem_bytes`` dynamic
    shared memory on the CuPy ``stream`` (None: CuPy's current stream), one ``cuLaunchKernel``
    (:mod:`cupy_dash.cuda.executor`). ``params``: the packed size-1 array, or its bytes (a bytes / bytearray of the
    struct's size: the host fast path's patched copy); the driver copies them during the call. ``func``: the
    kernel's CUfunction handle when the caller holds it (default: ``jit.load(spec)`` on the current device)."""
    if isinstance(params, np.ndarray):
        if not (params.shape == (1,) and params.dtype == spec.params_dtype):
            raise TypeError(f"{spec.label}: params must be a size-1 array of dtype {spec.params_dtype} "
                            f"(use pack_fwd_params / pack_bwd_params)")
        params = params.view(np.uint8)
    elif not (isinstance(params, (bytes, bytearray)) and len(params) == spec.params_dtype.itemsize):
        raise TypeError(f"{spec.label}: params must be a packed size-1 array or its {spec.params_dtype.itemsize} "
                        f"bytes")
    if func is None:
        from . import jit
        func = jit.load(spec).ptr
    if stream is None:
        import cupy
        stream = cupy.cuda.get_current_stream()
    gx, gy, gz = grid_xyz(grid)
    executor.launch(func, gx, gy, gz, spec.threads, spec.smem_bytes, stream.ptr, params)


@functools.lru_cache(maxsize=None)
def sm_count(device_id: int) -> int:
    """The number of SMs of device ``device_id``."""
    from cupy.cuda import runtime
    return int(runtime.deviceGetAttribute(runtime.cudaDevAttrMultiProcessorCount, device_id))


def max_resident_ctas(spec: KernelSpec) -> int:
    """CTAs of ``spec`` that can be resident at once on the current device (occupancy x SM count): the
    upper bound for a persistent grid in which CTAs wait on each other."""
    import cupy
    from cupy.cuda import driver
    from . import jit
    fn = jit.load(spec)
    gpu.bind_context()                    # the query is a driver call; jit.load bound the context only on a miss
    per_sm = driver.occupancyMaxActiveBlocksPerMultiprocessor(fn.ptr, spec.threads, spec.smem_bytes)
    return int(per_sm) * sm_count(cupy.cuda.runtime.getDevice())


# ---------------------------------------------------------------------------------------------------------
# What a call needs per variant, cached: specs, tile rows and (backward) the co-resident CTA count.
_fwd_cache: dict = {}
_bwd_cache: dict = {}


def fwd_entry(dtype: str, head_dim: int, causal: bool, head_dim_v: int | None = None,
              persistent: bool = False) -> tuple:
    """(forward KernelSpec, block_m, block_n), cached; ``head_dim_v``, ``persistent``: as :func:`fwd_spec`."""
    key = (dtype, head_dim, causal, None if head_dim_v == head_dim else head_dim_v, persistent)
    e = _fwd_cache.get(key)
    if e is None:
        tile = fwd_tile(head_dim)
        e = _fwd_cache[key] = (fwd_spec(dtype, head_dim, causal, head_dim_v, persistent), int(tile.block_m),
                               int(tile.block_n))
    return e


def bwd_entry(device_id: int, dtype: str, head_dim: int, causal: bool, timeline: bool = False,
              compact: bool = False, softcap: bool = False, seqlen_q: int = 0, window: tuple = (-1, -1),
              head_dim_v: int | None = None) -> tuple:
    """(BwdKernels, block_m, block_n, max co-resident CTAs of the main kernel) per device and variant, cached;
    ``seqlen_q``, ``window``: as :func:`bwd_tile`; ``head_dim_v``: as :func:`bwd_specs`. The first call loads all
    three kernels on the device (needs the GPU).

    NOTES: all three, though a small eager backward runs the main kernel alone (launchers.fold_wanted): captured
    into a CUDA graph the same call may run unfolded, and after torch.compile's reduce-overhead eager warm-up its
    capture then loads nothing (a capture that must load does it outside, cupy_dash.cuda.capture)."""
    tile = bwd_tile(head_dim, causal, compact, seqlen_q, window)
    # NOTES: a value head dim equal to head_dim is the same build as None (_value_counts): one entry for both, so
    # that prepare_varlen_backward (None) finds what the backward (Problem.Dv) loaded.
    key = (device_id, dtype, head_dim, causal, timeline, compact, softcap, tile.block_m,
           config.BWD_DQ_WRITERS.get(), None if head_dim_v == head_dim else head_dim_v)
    e = _bwd_cache.get(key)
    if e is None:
        import cupy
        from . import jit
        specs = bwd_specs(dtype, head_dim, causal, timeline, compact, softcap=softcap,
                          seqlen_q=seqlen_q, window=window, head_dim_v=head_dim_v)
        with cupy.cuda.Device(device_id):
            max_ctas = int(max_resident_ctas(specs.main))
            for spec in (specs.preprocess, specs.postprocess):
                jit.load(spec)
        if max_ctas < 1:
            raise RuntimeError(f"cupy_dash backward: the main kernel {specs.main.label} cannot be resident on "
                               f"device {device_id} (occupancy 0)")
        e = _bwd_cache[key] = (specs, int(tile.block_m), int(tile.block_n), max_ctas)
    return e
