"""Per-call times of the backward on one shape, to explain a bimodal median (benchmarks/bench.py rotates two input
sets; at 15-16k tokens and B = 1 its deterministic and atomic backward times split into two modes ~10 % apart).

Each variant runs ``--calls`` backward calls back to back (CUDA events around each) and records, per call, the
input set, the addresses of the inputs and of the returned dq, dk, dv, and the time; ``nvidia-smi`` samples the SM
clock, power and temperature in the background. Variants: ``sets2`` (as bench.py: two input sets, each call's
results dropped after the next call), ``sets1`` (one input set), ``keep`` (two input sets, every result kept
alive, so the memory pool never hands a call an address an earlier call used), ``sync`` (two input sets, the host
synchronizes after every call).

    python benchmarks/timing_modes.py --seqlen 15360 --json out.json
    python benchmarks/timing_modes.py --seqlen 16384 --causal --json out.json
    python benchmarks/timing_modes.py --seqlen 16384 --causal --loop-s 2 --fa3 --variants --json out.json

``--loop-s``: also one loop of back-to-back calls per implementation (ours deterministic and atomic; with ``--fa3``
FlashAttention-3's non-deterministic and deterministic backward from the flash-attn3-jax wheel, on the same
inputs) for that many seconds, with nvidia-smi's SM clock and power over the loop's second half beside its time
per call: at the power limit, whether a kernel is faster per cycle or per joule.

Shapes are (tokens // seqlen, seqlen, hidden // hdim, hdim), bf16, random normal inputs as bench.py's.
"""
import argparse
import datetime as _dt
import json
import os
import shlex
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from steady_bench import Smi  # noqa: E402


def run_variant(name, sets, calls, opts, events):
    import cupy

    import cupy_dash
    kw = dict(causal=opts.causal, schedule="auto", deterministic=not opts.atomic)
    kept, last, rows = [], None, []
    for i in range(opts.warmup + calls):
        idx = 0 if name == "sets1" else i % len(sets)
        s = sets[idx]
        start, end = events.event(), events.event()
        events.record(start)
        res = cupy_dash.attention_backward(s["do"], s["q"], s["k"], s["v"], s["out"], s["lse"], **kw)
        events.record(end)
        if name == "keep":
            kept.append(res)
        if name == "sync":
            cupy.cuda.get_current_stream().synchronize()
        if i >= opts.warmup:
            rows.append(dict(set=idx, q=s["q"].data.ptr, dq=res[0].data.ptr, dk=res[1].data.ptr,
                             dv=res[2].data.ptr, events=(start, end)))
        last = res
    events.synchronize(rows[-1]["events"][1])
    del last, kept
    for r in rows:
        r["ms"] = events.elapsed_ms(*r.pop("events"))
    cupy_dash.check_errors()
    return rows


def steady_loops(impls, loop_s, smi):
    """{name: ms per call, SM clock and power medians} over the second half of a ``loop_s`` loop of each of
    ``impls`` ({name: (call, sync)}: ``sync()`` waits for the calls made so far); ``smi``: a running
    :class:`steady_bench.Smi`."""
    import datetime as dt
    out = {}
    for name, (call, sync) in impls.items():
        call()
        sync()
        t0, half, n_half, t_half = time.perf_counter(), None, 0, 0.0
        wall0 = dt.datetime.now()
        while True:
            for _ in range(4):
                call()
            sync()
            now = time.perf_counter()
            if half is None and now - t0 >= loop_s / 2:
                half, wall_half = now, dt.datetime.now()
            elif half is not None:
                n_half += 4
                t_half = now - half
                if now - t0 >= loop_s:
                    break
        mhz, watt, samples = smi.window(wall_half, dt.datetime.now())
        out[name] = dict(ms_per_call=t_half / n_half * 1e3, calls=n_half, started=wall0.isoformat(),
                         sm_mhz_median=mhz, power_w_median=watt, samples=samples)
        print(f"{name:12s} {out[name]['ms_per_call']:.3f} ms per call over {n_half} calls, SM clock "
              f"{out[name]['sm_mhz_median']} MHz, power {out[name]['power_w_median']} W", flush=True)
    return out


def fa3_impls(sets, causal):
    """FlashAttention-3's backward (bench_peers.Fa3Peer) on input set 0: {name: (call, sync)}."""
    from bench_peers import Fa3Peer
    peer = Fa3Peer()
    jax = peer.jax
    args = tuple(jax.dlpack.from_dlpack(sets[0][n]) for n in ("do", "q", "k", "v", "out", "lse"))
    impls = {}
    for det, name in ((False, "fa3_nondet"), (True, "fa3_det")):
        fn, last = peer._bwd_fn(causal, det), []

        def call(fn=fn, last=last):
            last[:] = [fn(*args)]

        impls[name] = (call, lambda last=last: jax.block_until_ready(last[0]))
    return impls


def summary(rows, flops):
    ms = [r["ms"] for r in rows]
    by_set = {}
    for r in rows:
        by_set.setdefault(r["set"], []).append(r["ms"])
    by_dq = {}
    for r in rows:
        by_dq.setdefault(hex(r["dq"]), []).append(r["ms"])
    med = statistics.median(ms)
    return dict(median_ms=med, min_ms=min(ms), max_ms=max(ms), tflops=flops / med / 1e9,
                median_ms_by_set={k: statistics.median(v) for k, v in by_set.items()},
                median_ms_by_dq_address={k: (len(v), statistics.median(v)) for k, v in by_dq.items()})


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqlen", type=int, default=15360)
    ap.add_argument("--tokens", type=int, default=None, help="default: the sequence length (B = 1)")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--hdim", type=int, default=128)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--atomic", action="store_true", help="the non-deterministic backward")
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--variants", nargs="*", default=["sets2", "sets1", "keep", "sync"])
    ap.add_argument("--loop-s", type=float, default=0.0, help="seconds of each steady loop (default 0: none)")
    ap.add_argument("--fa3", action="store_true", help="FA3's backward in the steady loops too")
    ap.add_argument("--json", required=True)
    opts = ap.parse_args()

    import cupy

    import cupy_dash
    from cupy_dash.cli.measure import attention_flops, random_tensor
    from measure import CupyEvents

    B = (opts.tokens or opts.seqlen) // opts.seqlen
    H, D, S = opts.hidden // opts.hdim, opts.hdim, opts.seqlen
    shape = (B, S, H, D)
    sets = []
    for i in range(2):
        s = {n: random_tensor(shape, "bf16", seed=10 * i + j) for j, n in enumerate(("q", "k", "v", "do"))}
        s["out"], s["lse"] = cupy_dash.attention_forward(s["q"], s["k"], s["v"], causal=opts.causal)
        sets.append(s)
    cupy.cuda.Device().synchronize()
    flops = attention_flops(B, H, S, S, D, opts.causal, "bwd")
    smi = Smi()
    report = dict(meta=dict(date=_dt.datetime.now().isoformat(timespec="seconds"),
                            command=" ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
                            commit=os.environ.get("CUPY_DASH_COMMIT"), shape=shape, causal=opts.causal,
                            deterministic=not opts.atomic), variants={})
    try:
        for name in opts.variants:
            rows = run_variant(name, sets, opts.calls, opts, CupyEvents())
            report["variants"][name] = dict(summary(rows, flops), calls=rows)
            s = report["variants"][name]
            print(f"{name:6s} median {s['median_ms']:.3f} ms ({s['tflops']:.0f} TFLOP/s), min {s['min_ms']:.3f}, "
                  f"max {s['max_ms']:.3f}; by set {s['median_ms_by_set']}; by dq address "
                  f"{s['median_ms_by_dq_address']}", flush=True)
            print("   per call: " + " ".join(f"{r['set']}:{r['ms']:.2f}" for r in rows), flush=True)
        if opts.loop_s:
            s0, kw = sets[0], dict(causal=opts.causal, schedule="auto")
            stream = cupy.cuda.get_current_stream()
            operands = tuple(s0[n] for n in ("do", "q", "k", "v", "out", "lse"))
            impls = {f"dash_{name}": (lambda d=det: cupy_dash.attention_backward(*operands, deterministic=d, **kw),
                                      stream.synchronize) for det, name in ((True, "det"), (False, "atomic"))}
            if opts.fa3:
                impls.update(fa3_impls(sets, opts.causal))
            report["steady_loops"] = steady_loops(impls, opts.loop_s, smi)
            for v in report["steady_loops"].values():
                v["tflops"] = flops / v["ms_per_call"] / 1e9
    finally:
        report["nvidia_smi"] = smi.lines()
        smi.close()
    with open(opts.json, "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
