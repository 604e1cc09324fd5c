"""The causal forward's launch order, A/B at a steady clock: the same kernel and inputs, only FwdParams.head_section
differs between legs (the order in which the grid's tiles start; the results are bitwise equal, checked here).

Legs (``--sections``): ``rule`` (the shipped rule, ``launchers.fwd_head_section``: the longest tiles of every head
in an L2 section first), ``1`` (each (b, h) pair's tiles longest first, pair after pair: the order before sections;
always measured, the yardstick), ``all`` (every pair in one section: longest first over the whole grid, K and V of
all heads in flight at once), any section size N (clamped to B * H), or ``persistent:N`` (the DASH_PERSISTENT build:
one CTA per SM claiming the tiles of the section-N order from a zeroed counter; ``persistent``: the rule's
sections; fixed length only). Each leg is launched straight from its packed block (no API, no host work between
calls but the counter's memset), timed in interleaved loops of back-to-back launches with the order rotated every
round (steady_bench.pipelined_loop, nvidia-smi's clock per loop).

    python benchmarks/fwd_order.py --shapes causal:1024 causal:2048 causal:4096 causal:8192 causal:16384 \\
        --hdim 128 --sections rule 1 2 4 8 16 all --rounds 3 --loop-s 0.5 --json fwd_order.json \\
        --md fwd_order.md
    python benchmarks/fwd_order.py --shapes varlen:8 varlen:mixed --sections rule 1 --json v.json   # packings
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import os
import shlex
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import measure  # noqa: E402  (beside this script)

def legs_of(shape, sections, dtype="bf16"):
    """{leg: (enqueue, done, result)} for one seeded input set of ``shape`` (steady_bench.parse_shape's dict)."""
    import cupy

    from cupy_dash import schedule
    from cupy_dash.cli.measure import random_tensor
    from cupy_dash.core import problem
    from cupy_dash.cuda import kernels, launchers
    B, S, H, D, causal = shape["batch"], shape["seqlen"], shape["heads"], shape["hdim"], shape["causal"]
    lengths = shape.get("lengths")                 # a varlen packing: one batch of these sequences
    q, k, v = (random_tensor((B, S, H, D), dtype, seed=j) for j in range(3))
    p = problem.validate(q, k, v)
    spec, block_m, block_n = kernels.fwd_entry(p.dtype, p.D, causal, p.Dv)
    strides = (S * H * D, H * D, D)
    operands = tuple((x.data.ptr, strides) for x in (q, k, v))
    varlen = None
    if lengths:
        cu = cupy.asarray(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
        grid = (-(-max(lengths) // block_m), H, len(lengths))
        varlen = (len(lengths), cu.data.ptr, cu.data.ptr)
        window = schedule.canonical_window((-1, -1), max(lengths), max(lengths), causal)
    else:
        cu = None
        grid = launchers.fwd_grid(p, block_m)
        window = schedule.canonical_window((-1, -1), p.Sq, p.Sk, causal)
    sizes = {"rule": launchers.fwd_head_section(p, block_m, grid if lengths else None), "all": grid[1] * grid[2]}
    legs = {}
    for name in dict.fromkeys(["1", *sections]):
        persistent = name.startswith("persistent")      # persistent:<section>, the DASH_PERSISTENT build
        if persistent and lengths:
            continue
        size = name.partition(":")[2] or "rule" if persistent else name
        section = min(sizes[size] if size in sizes else int(size), grid[1] * grid[2])
        out = cupy.empty((B, S, H, p.Dv), dtype=q.dtype)
        lse = cupy.empty((B, H, S), dtype=cupy.float32)
        params = launchers.fwd_params(block_m, block_n, p, window, operands, out.data.ptr, lse.data.ptr, varlen,
                                      grid).copy()
        params["head_section"] = section
        leg_spec, leg_grid, counter = spec, grid, None
        if persistent:
            counter = cupy.zeros(1, dtype=cupy.int32)
            tiles = grid[0] * grid[1] * grid[2]
            params["tile_counter"], params["num_tiles"], params["num_m_blocks"] = counter.data.ptr, tiles, grid[0]
            leg_spec = dataclasses.replace(spec, defines=tuple(sorted(dict(spec.defines, DASH_PERSISTENT=1).items())))
            leg_grid = launchers.fwd_persistent_grid(p, grid)

        def enqueue(params=params, keep=(q, k, v, cu), spec=leg_spec, grid=leg_grid, counter=counter):
            if counter is not None:                      # the tiles are claimed from 0 in every launch
                cupy.cuda.runtime.memsetAsync(counter.data.ptr, 0, 4, cupy.cuda.get_current_stream().ptr)
            kernels.launch(spec, grid, params, None)     # (the launch reads q, k, v by address)
            ev = cupy.cuda.Event(disable_timing=True)
            ev.record()
            return ev

        def result(out=out, lse=lse, enqueue=enqueue):
            enqueue().synchronize()
            return out.view(cupy.uint16).copy(), lse.view(cupy.uint32).copy()
        legs[name] = (enqueue, lambda ev: ev.synchronize(), result, section)
    return legs


def run_shape(shape, opts, smi):
    import cupy

    from cupy_dash.cli.measure import attention_flops
    from steady_bench import pipelined_loop, rotated_orders
    legs = legs_of(shape, opts.sections)
    first = {n: legs[n][2]() for n in legs}
    again = {n: legs[n][2]() for n in legs}
    cupy.cuda.Device().synchronize()

    def differing(x, y):
        return sum(int(cupy.count_nonzero(a != b)) for a, b in zip(x, y))
    same = {n: differing(first[n], first["1"]) for n in legs}
    repeat = {n: differing(first[n], again[n]) for n in legs}
    flops = sum(attention_flops(1, shape["heads"], n, n, shape["hdim"], shape["causal"], "fwd")
                for n in shape.get("lengths") or [shape["seqlen"]] * shape["batch"])
    names = list(legs)
    loops = {n: [] for n in names}
    orders = rotated_orders(names, opts.rounds)
    for r, order in enumerate(orders):
        for name in order:
            enqueue, done = legs[name][:2]
            ms, n, wall0, wall1 = pipelined_loop(enqueue, done, opts.loop_s)
            mhz, watt, _ = smi.window(wall0, wall1)
            loops[name].append(dict(round=r, ms=ms, calls=n, sm_mhz=mhz, power_w=watt,
                                    mcycles=ms * mhz / 1e3 if mhz else None))
    med = statistics.median
    summary = {}
    for name in names:
        ms = med([x["ms"] for x in loops[name]])
        cyc = [x["mcycles"] for x in loops[name] if x["mcycles"]]
        per_round = [b["ms"] / a["ms"] for a, b in zip(loops[name], loops["1"])]
        summary[name] = dict(head_section=legs[name][3], ms_median=ms, tflops=flops / ms / 1e9,
                             mcycles_median=med(cyc) if cyc else None, differing_vs_1=same[name],
                             differing_on_repeat=repeat[name], speed_vs_1=med(per_round))
    return dict(shape=shape, flops=flops, rounds=len(orders), loops=loops, summary=summary)


def _shape(spec, opts):
    """steady_bench.parse_shape's dict, or for ``varlen:N`` (a causal packing of 16k tokens: ``N`` x ``16384 //
    N``, or ``mixed``: seeded lengths of 256-4096 tokens) one batch of the packed sequences with ``lengths``."""
    from steady_bench import parse_shape
    if not spec.startswith("varlen:"):
        return parse_shape(spec, opts.hidden, opts.hdim)
    kind = spec.split(":")[1]
    if kind == "mixed":
        rng, lengths = np.random.default_rng(0), []
        while sum(lengths) < 16384:
            lengths.append(int(rng.integers(256, 4097)))
        lengths[-1] -= sum(lengths) - 16384
    else:
        lengths = [16384 // int(kind)] * int(kind)
    return dict(name=spec, causal=True, batch=1, seqlen=16384, heads=opts.hidden // opts.hdim, hdim=opts.hdim,
                lengths=lengths)


def markdown(report):
    from steady_bench import rounds_run
    meta = report["meta"]
    lines = [f"# The causal forward's launch order ({meta['date']})", "", f"Command: `{meta['command']}`", "",
             f"GPU {meta['gpu']}; commit {meta['commit']}; kernels sha256 {meta['kernels_sha256'][:12]}; "
             f"{rounds_run(report)} interleaved loops of {meta['loop_s']} s per leg.", "",
             "| shape | leg | head_section | TFLOP/s | ms | Mcycles | speed vs 1 | elements differing from 1 / "
             "on a repeat |", "|---|---|---|---|---|---|---|---|"]
    for s in report["shapes"]:
        for name, x in s["summary"].items():
            cyc = f"{x['mcycles_median']:.3f}" if x["mcycles_median"] else "-"
            lines.append(f"| {s['shape']['name']} | {name} | {x['head_section']} | {x['tflops']:.0f} | "
                         f"{x['ms_median']:.4f} | {cyc} | {x['speed_vs_1']:.3f} | "
                         f"{x['differing_vs_1']} / {x['differing_on_repeat']} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", nargs="+", default=["causal:1024", "causal:2048", "causal:4096", "causal:8192",
                                                     "causal:16384"])
    ap.add_argument("--hdim", type=int, default=128)
    ap.add_argument("--sections", nargs="+", default=["rule", "1", "all"],
                    help="legs: rule, all, or a section size (1 is always measured)")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--loop-s", type=float, default=0.5)
    ap.add_argument("--json", required=True)
    ap.add_argument("--md", default=None)
    opts = ap.parse_args()
    import cupy

    from bench import _kernels_digest
    from steady_bench import Smi
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    commit = measure.commit()
    report = dict(meta=dict(date=_dt.datetime.now().isoformat(timespec="seconds"),
                            command=" ".join(shlex.quote(a) for a in ["python", *sys.argv]), commit=commit,
                            kernels_sha256=_kernels_digest(), gpu=props["name"].decode(), rounds=opts.rounds,
                            loop_s=opts.loop_s), shapes=[])
    smi = Smi()
    try:
        for spec in opts.shapes:
            report["shapes"].append(run_shape(_shape(spec, opts), opts, smi))
            s = report["shapes"][-1]["summary"]
            print(spec, {n: (x["head_section"], round(x["tflops"]), round(x["speed_vs_1"], 3), x["differing_vs_1"],
                             x["differing_on_repeat"]) for n, x in s.items()}, flush=True)
            with open(opts.json, "w") as f:
                json.dump(report, f, indent=1, default=str)
    finally:
        smi.close()
    if opts.md:
        with open(opts.md, "w") as f:
            f.write(markdown(report))


if __name__ == "__main__":
    main()
