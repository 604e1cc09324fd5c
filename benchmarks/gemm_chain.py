"""Cycles per visit of the backward's 80-query loop, rebuilt in layers (benchmarks/kernels/gemm_chain.cu): the five
GEMMs alone (level 0), then the dS^T store and barrier (1), the softmax and dS math (2), the dQ hand-off to a writer
warp (3) and a Q / dO load per visit (4), or instead of those loads the stages' protocol with a producer that runs
ahead, the visit slot and the mask dispatch (5), and that with a real problem's spread of addresses in L2 (6),
and that with a schedule table and the kernel's two dQ writer warps (7), and with KV tiles that change every --run
visits (48), their K / V loads and releases, but no dK / dV epilogue (8), and with the kernel's dK / dV epilogue at
each run's end (9), and with the kernel's TMA tensor loads from 16-head tensors instead of bulk copies (10), and
that in deterministic mode, the dQ writers waiting for each tile's rank chain (11), and with the kernel's own MMA
warpgroups (bwd/consume.cuh) instead of the rebuilt visit (12), deterministic (13), and the kernel's three roles on a
real problem (--real: the package's parameter block, tables and tensors for a bench shape; 14, deterministic 15),
which is the kernel itself with clock64 around its MMA warpgroups.
With --stamps the levels (5 and above) are built with the kernel's timeline stamps (DASH_TIMELINE) and print the
phase table of benchmarks/timeline_phases.py, the one benchmarks/timeline.py prints for the real kernel, so the two
compare phase by phase under the same stamps.
One CTA per SM, 512 visits each (levels 14-15: the package's table); the cycles of each MMA warpgroup come from
clock64, so the SM clock does not enter. Against the 3,200 cycles of tensor work per visit
(ten 64 x 80 x 128 GEMMs at 2,048 multiply-adds per cycle) and the kernel's ~4,630 (level 15 at full 3840; Nsight
Compute's elapsed cycles per visit, 4,890, also count the tail and run at its locked clock), each level's excess says
what opens the tensor pipe's idle time (docs/decisions/bwd-engine.md).

    python benchmarks/gemm_chain.py [--levels 0 1 ... 15] [--real full:3840 full:15360] [--run 48]
                                    [--exp2-early 0 3 5] [--dv-early] [--early-wgs 1] [--phases]
                                    [--stamps] [--repeats 5] [--json out.json]
    python benchmarks/gemm_chain.py --compile-only      # no GPU: every level compiles without spills
"""
from __future__ import annotations

import argparse
import datetime
import json
import shlex
import statistics
import sys
from pathlib import Path

import numpy as np

from measure import commit, compile_probe, load_probe

SOURCE = Path(__file__).parent / "kernels" / "gemm_chain.cu"
LEVELS = tuple(range(16))
DETERMINISTIC = {11: 10, 13: 12, 15: 14}   # level -> the level whose build it launches with the rank chain
REAL = (14, 15)                            # the levels that run a real problem (--real)
QDO_TILES, DQ_TILES = 256, 512   # gemm_chain.cu's kQdoTiles, kDqTiles (level 6)
TENSOR_CYCLES = 10 * 64 * 80 * 128 // 2048   # one visit's GEMMs at the SM's dense bf16 rate


PHASES = ("top", "math", "dV issue, dS barrier", "dQ, dK issue", "dV, dQ wait", "dQ hand-off", "dK wait")


def source(level: int, exp2_early: int = 0, dv_early: bool = False, phases: bool = False,
           stamps: bool = False, early_wgs: int = 3, run: int = 48, run_logic: int = 7) -> str:
    """gemm_chain.cu with the defines of the bf16 head-dim-128 full-mask 80-query bwd_main variant, CHAIN_LEVEL,
    CHAIN_EXP2_EARLY, CHAIN_DV_EARLY, CHAIN_EARLY_WGS, CHAIN_RUN, CHAIN_RUN_LOGIC, CHAIN_PHASES and, with ``stamps``,
    DASH_TIMELINE; below level 12 (the rebuilt loops) DASH_LSE_EARLY_GROUPS 4: four early lse_log2 groups, not the
    kernel's six, which spill 8 bytes in some of their legs under NVRTC 13.0 or 13.5."""
    from cupy_dash.cuda import kernels
    spec = kernels.bwd_specs("bfloat16", 128, False, seqlen_q=8192).main
    assert dict(spec.defines)["DASH_BLOCK_M"] == 80, spec
    chain = (("CHAIN_LEVEL", DETERMINISTIC.get(level, level)), ("CHAIN_EXP2_EARLY", exp2_early),
             ("CHAIN_DV_EARLY", int(dv_early)), ("CHAIN_EARLY_WGS", early_wgs), ("CHAIN_RUN", run),
             ("CHAIN_RUN_LOGIC", run_logic), ("CHAIN_PHASES", int(phases)), ("DASH_TIMELINE", int(stamps)))
    if level < 12:   # the rebuilt loops: the kernel's six early lse_log2 groups spill 8 bytes in some of their legs
        chain += (("DASH_LSE_EARLY_GROUPS", 4),)
    defines = "".join(f"#define {k} {v}\n" for k, v in (*spec.defines, *chain))
    return defines + SOURCE.read_text()


def smem_bytes() -> int:
    from cupy_dash.cuda import kernels
    return kernels.bwd_specs("bfloat16", 128, False, seqlen_q=8192).main.smem_bytes


def legs(levels, exp2_early, dv_early=False) -> list:
    """(level, exp2_early, dv_early) legs: every level with the kernel's own order, each other k at levels 2-11,
    and with ``dv_early`` the dV-before-the-dP^T-wait leg at levels 2-11 (the rebuilt visit's; levels 12 and 13 run
    the kernel's own)."""
    rebuilt = range(2, 12)
    out = [(level, k, False) for level in levels for k in sorted(set(exp2_early) | {0}) if k == 0 or level in rebuilt]
    return out + [(level, 0, True) for level in levels if dv_early and level in rebuilt]


def chain_tiles(sms: int, visits: int = 512) -> tuple:
    """Level 7's schedule: visit j of CTA c goes to dQ tile (7 c + j) % DQ_TILES. (tile, j), each (sms, visits)."""
    c, j = np.meshgrid(np.arange(sms), np.arange(visits), indexing="ij")
    return (7 * c + j) % DQ_TILES, j


def chain_ranks(sms: int, visits: int = 512) -> np.ndarray:
    """(sms * visits,) int32: level 11's rank of each visit on its dQ tile (chain_tiles), the number of visits to
    that tile with a smaller j (no two CTAs visit one tile at the same j: 7 is invertible mod 512)."""
    tile, j = (x.ravel() for x in chain_tiles(sms, visits))
    order = np.lexsort((j, tile))
    sorted_tiles = tile[order]
    starts = np.searchsorted(sorted_tiles, sorted_tiles, side="left")
    rank = np.empty(len(order), dtype=np.int32)
    rank[order] = np.arange(len(order)) - starts
    return rank


def real_problem(shape: str, deterministic: bool, stamps: bool = False) -> tuple:
    """Levels 14-15's launch for the bench shape ``shape`` ("full:S": bf16, 16k tokens, 16 heads of 128, the 80-query
    tile): (the BwdParams block the package packs for it, the grid, each CTA's visit count, the timeline buffer or
    None, the arrays to keep alive). Its tables are the package's (``auto``); lse_log2 and dpsum stay zero (no
    preprocess: the values do not enter the cycles); cycles are written over the first words of dq."""
    import cupy
    import cupy_dash
    from cupy_dash import config, schedule
    from cupy_dash.cli.measure import random_tensor
    from cupy_dash.core.problem import validate
    from cupy_dash.cuda import kernels, launchers
    from cupy_dash.cuda.params import CONSTANTS
    mask, S = shape.split(":")
    S = int(S)
    if mask != "full":
        raise ValueError(f"--real {shape}: the rebuilt kernel is the full-mask build")
    B, H, D = 16384 // S, 16, 128
    q, k, v, do = (random_tensor((B, S, H, D), "bf16", seed=i) for i in range(4))
    out, lse = cupy_dash.attention_forward(q, k, v)
    p = validate(q, k, v, do, out, lse, backward=True)
    dev = cupy.cuda.Device().id
    specs, bm, bn, max_ctas = kernels.bwd_entry(dev, p.dtype, D, False, stamps, seqlen_q=S)
    if (bm, bn) != (80, 128):
        raise ValueError(f"--real {shape}: the package takes the {bm} x {bn} tile there, not the rebuilt 80 x 128")
    window = schedule.canonical_window((-1, -1), S, S, False)
    c = launchers.BwdLaunch(specs, bm, bn, p, deterministic, config.spin_timeout_ns(), False, window)
    stream = cupy.cuda.get_current_stream()
    c.tables = launchers.bwd_tables("auto", c, max_ctas, dev, stream)
    work = cupy.zeros(c.work_bytes, dtype=cupy.uint8)
    grads = [cupy.zeros((B, S, H, D), dtype=cupy.uint16) for _ in range(3)]
    error = cupy.zeros(8, dtype=cupy.int32)
    strides = launchers.bsh_strides((B, S, H, D))
    operands = tuple((x.data.ptr, strides) for x in (q, k, v, out, do))
    timeline = (cupy.zeros((int(c.tables.cta_start[-1].get()), CONSTANTS.kTimelineCols), dtype=cupy.int64)
                if stamps else None)
    params = launchers.bwd_params(c, operands, lse.data.ptr, work.data.ptr, tuple(g.data.ptr for g in grads),
                                  (error.data.ptr, 0), timeline_ptr=0 if timeline is None else timeline.data.ptr)
    cta_start = np.asarray(c.tables.cta_start.get(), dtype=np.int64)
    semaphores = work[c.offsets[3]:c.offsets[3] + c.num_m_blocks * B * H * 4]
    dq_accum = work[c.offsets[2]:c.offsets[3]]
    return dict(params=params, grid=int(c.tables.num_ctas), cta_start=cta_start, timeline=timeline,
                semaphores=semaphores, error=error, cycles=grads[0].ravel().view(cupy.int64),
                results=(dq_accum, grads[1], grads[2]), keep=[q, k, v, do, out, lse, work, grads, c.tables])


def timed_launches(kernel, grid: int, smem: int, params: np.ndarray, repeats: int, semaphores, error, label: str):
    """A generator: launches the probe ``repeats`` + 1 times (the caller drops the first, a warm-up) with
    ``params`` in its parameter space, the rank chains' ``semaphores`` zeroed before each, and yields once each launch
    is done; RuntimeError when the kernel recorded an error in ``error`` (a rank-chain or pipeline wait timed
    out)."""
    import cupy
    from cupy_dash.cuda import executor
    stream = cupy.cuda.get_current_stream()
    for _ in range(repeats + 1):
        semaphores.fill(0)
        executor.launch(kernel.ptr, grid, 1, 1, 384, smem, stream.ptr, params.view(np.uint8))
        cupy.cuda.Device().synchronize()
        if int(error[0].get()) != 0:
            raise RuntimeError(f"{label}: the kernel recorded an error {error.get().tolist()} (a rank chain or "
                               "pipeline wait timed out)")
        yield


def cycle_stats(runs: list) -> dict:
    """Per repeat, over every MMA warpgroup of every CTA (``runs``: arrays of cycles per visit, warpgroups of a CTA
    side by side): the median, the p90 and the median gap between a CTA's two warpgroups."""
    return dict(cycles_per_visit_median=[float(np.median(x)) for x in runs],
                cycles_per_visit_p90=[float(np.percentile(x, 90)) for x in runs],
                wg_gap_median=[float(np.median(np.abs(x[0::2] - x[1::2]))) for x in runs])


def stamps_fields(timeline, cta_start: np.ndarray) -> dict:
    """The last launch's stamps read as benchmarks/timeline.py reads the kernel's: the phase report and its text."""
    from cupy_dash.cuda.params import CONSTANTS
    from timeline_phases import format_report, phase_report
    rep = phase_report(timeline.get(), cta_start, CONSTANTS.kBwdStages)
    return dict(stamps=rep, stamps_report=format_report(rep))


def run_real(level: int, shape: str, repeats: int, stamps: bool = False) -> dict:
    """Levels 14-15 on the bench shape ``shape``: cycles per visit of each MMA warpgroup of every CTA (its clock64
    cycles over its own visit count), median over CTAs, per repeat; with ``stamps`` the phase report, as
    run_level's."""
    cubin = compile_probe(source(level, stamps=stamps), "gemm_chain")
    smem = smem_bytes()
    kernel, module, gpu = load_probe(cubin, "gemm_chain", smem)
    r = real_problem(shape, level in DETERMINISTIC, stamps)
    visits = np.maximum(np.repeat(np.diff(r["cta_start"]), 2), 1).astype(np.float64)
    per_visit = [r["cycles"][:2 * r["grid"]].get() / visits
                 for _ in timed_launches(kernel, r["grid"], smem, r["params"], repeats, r["semaphores"], r["error"],
                                         f"level {level} {shape}")]
    del module
    extra = {}
    if level in DETERMINISTIC:   # the bits of the last launch (every launch writes the same): dq_accum, dk, dv
        import hashlib
        extra = dict(digest=hashlib.sha256(b"".join(x.get().tobytes() for x in r["results"])).hexdigest())
    if stamps:
        extra.update(stamps_fields(r["timeline"], r["cta_start"]))
    return dict(level=level, shape=shape, exp2_early=0, dv_early=False, stamps_build=stamps, gpu=gpu,
                ctas=r["grid"], visits=int(r["cta_start"][-1]), **extra, **cycle_stats(per_visit[1:]))


def bwd_params(fields: dict) -> np.ndarray:
    """The BwdParams the kernel reads (one head of DQ_TILES 80-query tiles, full mask, atomic mode: no semaphores)
    with ``fields`` (the buffers), every other field zero."""
    from cupy_dash.cuda.params import BWD_PARAMS_DTYPE
    packed = np.zeros(1, dtype=BWD_PARAMS_DTYPE)
    rows = DQ_TILES * 80
    for name, value in dict(batch=1, seqlen_q=rows, seqlen_k=rows, seqlen_q_rounded=rows, num_heads=1,
                            num_heads_kv=1, window_left=-1, window_right=-1, **fields).items():
        packed[name] = value
    return packed


def dkv_fields(dk: int, dv: int) -> dict:
    """dk, dv of one head of 128 keys, bf16: the pointers, strides and the epilogue's tensor maps (64-row boxes, as
    the kernel's launcher builds them)."""
    from cupy_dash.cuda import tensormap
    shape = (1, 128, 1, 128)
    strides = (128 * 128, 128, 128)
    return dict(dk=dk, dv=dv, dk_stride=strides, dv_stride=strides,
                tma_dk=tensormap.bhsd_map(dk, "bfloat16", shape, strides, 64, "dk"),
                tma_dv=tensormap.bhsd_map(dv, "bfloat16", shape, strides, 64, "dv"))


def load_maps(qdo_ptr: int) -> dict:
    """Level 10's tensor maps: Q (box 80 rows) and K (box 128) over a (1, 1280, 16, 128) bf16 tensor at qdo_ptr,
    dO and V over the next one (gemm_chain.cu's kRowBlocks x 80 rows of kHeads heads)."""
    from cupy_dash.cuda import tensormap
    shape = (1, QDO_TILES // 16 * 80, 16, 128)
    strides = (shape[1] * 16 * 128, 16 * 128, 128)
    do_ptr = qdo_ptr + 2 * shape[1] * 16 * 128
    return dict(tma_q=tensormap.bhsd_map(qdo_ptr, "bfloat16", shape, strides, 80, "q"),
                tma_k=tensormap.bhsd_map(qdo_ptr, "bfloat16", shape, strides, 128, "k"),
                tma_do=tensormap.bhsd_map(do_ptr, "bfloat16", shape, strides, 80, "do"),
                tma_v=tensormap.bhsd_map(do_ptr, "bfloat16", shape, strides, 128, "v"))


def run_level(level: int, exp2_early: int, dv_early: bool, repeats: int, phases: bool = False,
              stamps: bool = False, early_wgs: int = 3, run: int = 48, run_logic: int = 7) -> dict:
    """Cycles per visit of each MMA warpgroup of every CTA, median over CTAs, per repeat; with ``stamps`` also the
    phase report of the last repeat's timeline (``timeline_phases.phase_report``; its text: ``stamps_report``)."""
    import cupy
    cubin = compile_probe(source(level, exp2_early, dv_early, phases, stamps, early_wgs, run, run_logic),
                          "gemm_chain")
    smem = smem_bytes()
    kernel, module, gpu = load_probe(cubin, "gemm_chain", smem)
    sms = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["multiProcessorCount"]
    rng = np.random.default_rng(0)
    import ml_dtypes
    qdo = rng.standard_normal(2 * (QDO_TILES + 1) * 80 * 128).astype(ml_dtypes.bfloat16)
    qdo = cupy.asarray(qdo.view(np.uint16))
    dq = cupy.zeros(max(sms, DQ_TILES) * 80 * 128, dtype=cupy.float32)
    # level 7's schedule table: CTA c visits (bh 0, n_block 0, m_block (7 c + j) % DQ_TILES), j < 512
    tile, _ = chain_tiles(sms)
    c = np.arange(sms)[:, None].repeat(512, axis=1)
    visits = cupy.asarray(np.stack([c, 0 * c, 0 * c, tile], axis=-1).astype(np.int32).ravel())
    deterministic = level in DETERMINISTIC
    rank = cupy.asarray(chain_ranks(sms)) if deterministic else cupy.ones(sms * 512, dtype=cupy.int32)
    semaphores = cupy.zeros(DQ_TILES, dtype=cupy.int32)   # level 11: each dQ tile's rank chain, zeroed per launch
    error = cupy.zeros(8, dtype=cupy.int32)
    det = dict(dq_semaphore=semaphores.data.ptr) if deterministic else {}   # the bounded waits report into error
    cta_start = cupy.asarray(np.arange(sms + 1, dtype=np.int64) * 512)
    cycles = cupy.zeros(2 * sms * (1 + len(PHASES)), dtype=cupy.int64)
    sink = cupy.zeros(384, dtype=cupy.float32)
    dkv = cupy.zeros((2, 128, 128), dtype=cupy.uint16)   # level 9's dK, dV rows of the one KV tile, n_block 0
    from cupy_dash.cuda.params import CONSTANTS
    timeline = cupy.zeros((sms * 512 if stamps else 1, CONSTANTS.kTimelineCols), dtype=cupy.int64)
    params = bwd_params(dict(q=qdo.data.ptr, dq_accum=dq.data.ptr, dq=cycles.data.ptr, dpsum=sink.data.ptr,
                             timeline=timeline.data.ptr,
                             visits=visits.data.ptr, rank=rank.data.ptr, cta_start=cta_start.data.ptr,
                             **dkv_fields(dkv[0].data.ptr, dkv[1].data.ptr), **load_maps(qdo.data.ptr), **det,
                             error=error.data.ptr, spin_timeout_ns=2_000_000_000, num_m_blocks=DQ_TILES))
    per_visit, per_phase = [], []
    for _ in timed_launches(kernel, sms, smem, params, repeats, semaphores, error, f"level {level}"):
        out = cycles.get() / 512
        per_visit.append(out[:2 * sms])
        per_phase.append(out[2 * sms:].reshape(sms, 2, len(PHASES)))
    del module
    extra = {}
    if phases:   # per warpgroup and phase: the median over CTAs, then over the repeats (the first dropped)
        med = np.median(np.stack([np.median(x, axis=0) for x in per_phase[1:]]), axis=0)
        extra = dict(phases={f"wg{wg}": dict(zip(PHASES, map(float, med[wg]))) for wg in range(2)})
    if stamps:
        extra.update(stamps_fields(timeline, np.asarray(cta_start.get())))
    return dict(level=level, exp2_early=exp2_early, dv_early=dv_early, early_wgs=early_wgs, run=run,
                run_logic=run_logic, phases_build=phases, stamps_build=stamps, gpu=gpu, ctas=sms, **extra,
                **cycle_stats(per_visit[1:]))


def wgs(exp2_early: int, dv_early: bool, early_wgs: int) -> str:
    """The label of a leg whose early order only one warpgroup takes."""
    return f" in warpgroup {early_wgs // 2} only" if (exp2_early or dv_early) and early_wgs != 3 else ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--levels", nargs="+", type=int, default=list(LEVELS), choices=LEVELS)
    ap.add_argument("--exp2-early", nargs="+", type=int, default=[0],
                    help="also these CHAIN_EXP2_EARLY k-slice counts (0-5) at levels >= 2")
    ap.add_argument("--dv-early", action="store_true",
                    help="also dV issued before the dP^T wait (dv_before_dp_wait.patch's order) at levels >= 2")
    ap.add_argument("--phases", action="store_true",
                    help="the phase builds instead (CHAIN_PHASES: cycles per visit by phase, per warpgroup; "
                         "levels 3-11)")
    ap.add_argument("--early-wgs", type=int, default=3, choices=(1, 2, 3),
                    help="the MMA warpgroups (a bit each) that take the --exp2-early / --dv-early order; the others "
                         "keep the kernel's (default 3: both)")
    ap.add_argument("--stamps", action="store_true",
                    help="the timeline builds instead (the kernel's stamps; levels >= 5): the phase table of "
                         "benchmarks/timeline.py")
    ap.add_argument("--real", nargs="+", default=["full:3840"],
                    help="levels 14-15's bench shapes (full:S, the 80-query tile)")
    ap.add_argument("--run", type=int, default=48,
                    help="visits per KV tile at levels 8-13 (CHAIN_RUN; 48: full 3840's)")
    ap.add_argument("--run-logic", type=int, default=7, choices=range(8),
                    help="levels 8-11, with --run 512 (one run per CTA): which of the run's logic the visit loop "
                         "keeps (1 the first visit's K / V waits, 2 the last one's releases, 4 the epilogue inside "
                         "the loop; default 7: all)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json")
    ap.add_argument("--compile-only", action="store_true")
    opts = ap.parse_args()
    if any(not 0 <= k <= 5 for k in opts.exp2_early):
        ap.error("--exp2-early: 0 to 5 k-slices (the 80-query tile has five)")
    if opts.phases and (min(opts.levels) < 3 or max(opts.levels) > 11):
        # the sums' registers make levels 1-2 spill; levels 12-13 run the kernel's visit, which has no phase sums
        ap.error("--phases: levels 3 to 11")
    if opts.stamps and (min(opts.levels) < 5 or opts.phases):
        ap.error("--stamps: levels 5 and above, without --phases")
    if opts.run < 2:
        ap.error("--run: at least 2 visits per KV tile")
    if opts.run_logic != 7 and (opts.run < 512 or min(opts.levels) < 8 or max(opts.levels) > 11):
        ap.error("--run-logic: levels 8-11 with --run 512 (one run per CTA)")
    if opts.compile_only:
        for level, k, dv in legs(opts.levels, opts.exp2_early, opts.dv_early):
            compile_probe(source(level, k, dv, opts.phases, opts.stamps, opts.early_wgs, opts.run, opts.run_logic),
                          "gemm_chain")
            print(f"level {level}, exp2 early {k}{', dV early' if dv else ''}{wgs(k, dv, opts.early_wgs)}: compiled, "
                  "no spills")
        return
    rows = []
    for level, k, dv in legs(opts.levels, opts.exp2_early, opts.dv_early):
        for shape in opts.real if level in REAL else [None]:
            row = (run_real(level, shape, opts.repeats, opts.stamps) if shape else
                   run_level(level, k, dv, opts.repeats, opts.phases, opts.stamps, opts.early_wgs, opts.run,
                             opts.run_logic))
            report(row, f"level {level}" + (f" {shape}" if shape else
                                            f", exp2 early {k}{', dV early' if dv else ''}"
                                            f"{wgs(k, dv, opts.early_wgs)}"
                                            f"{f', runs of {opts.run}' if opts.run != 48 and level >= 8 else ''}"
                                            f"{f', run logic {opts.run_logic}' if opts.run_logic != 7 else ''}"))
            rows.append(row)
    if opts.json:
        meta = dict(date=datetime.datetime.now().isoformat(timespec="seconds"), commit=commit(),
                    command=" ".join(shlex.quote(a) for a in ["python", *sys.argv]), gpu=rows[0]["gpu"],
                    tensor_cycles_per_visit=TENSOR_CYCLES)
        Path(opts.json).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))


def report(row: dict, label: str) -> None:
    """Prints one leg's row: cycles per visit, then its phases, stamped phase table and bits where it has them."""
    med = statistics.median(row["cycles_per_visit_median"])
    print(f"{label}: {med:7.0f} cycles per visit "
          f"(tensor work {TENSOR_CYCLES}: {TENSOR_CYCLES / med:.0%}), "
          f"p90 {statistics.median(row['cycles_per_visit_p90']):.0f}, "
          f"warpgroups apart {statistics.median(row['wg_gap_median']):.0f}", flush=True)
    for wg, ph in row.get("phases", {}).items():
        print(f"  {wg}: " + ", ".join(f"{name} {c:.0f}" for name, c in ph.items()), flush=True)
    if "stamps_report" in row:
        print(row["stamps_report"], flush=True)
    if "digest" in row:
        print(f"  dq_accum, dk, dv sha256 {row['digest']}", flush=True)


if __name__ == "__main__":
    main()
