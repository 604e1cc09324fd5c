"""GPU commands of ``python -m cupy_dash``, each ``*_main(argv)`` returning an exit code: ``demo`` (one shape,
forward + backward with every schedule: bitwise repeatability, error against the float64 reference on a slice,
TFLOP/s; peers are ``benchmarks/bench.py``'s) and the default job: the demo on a Hopper GPU, else the schedule
command on a default causal training shape in the engine model (:func:`default_analysis_argv`), named first.
"""
from __future__ import annotations

import argparse
import time

# Default training shape of the GPU-less schedule analysis.
ANALYSIS_SHAPE = dict(seqlen=8192, heads=16, causal=True, num_sms=132, head_dim=128)
FALLBACK_TILE = (64, 128)          # (block_m, block_n) when cupy_dash.cuda.kernels is unavailable


def _gpu_state():
    """:func:`cupy_dash.gpu.state` of CUDA device 0."""
    from .. import gpu
    return gpu.state(0)


def _analysis_tile():
    try:
        from ..cuda import kernels
        tile = kernels.bwd_tile(ANALYSIS_SHAPE["head_dim"], ANALYSIS_SHAPE["causal"],
                                seqlen_q=ANALYSIS_SHAPE["seqlen"])      # the tile the backward takes at this length
        return int(tile.block_m), int(tile.block_n)
    except Exception:
        return FALLBACK_TILE


def default_analysis_argv() -> list:
    """The ``python -m cupy_dash schedule`` arguments of the default job's analysis: ANALYSIS_SHAPE with the
    backward's tiles for its head dim, in the engine model with auto's costs (schedule.AUTO_COSTS)."""
    from ..schedule import AUTO_COSTS
    block_m, block_n = _analysis_tile()
    s = ANALYSIS_SHAPE
    c, r = AUTO_COSTS
    return ["--seqlen-q", str(s["seqlen"]), "--heads", str(s["heads"]), "--num-sms", str(s["num_sms"]),
            "--block-m", str(block_m), "--block-n", str(block_n)] + (["--causal"] if s["causal"] else []) + \
        ["--model", "engine", "--c", f"{c:g}", "--r", f"{r:g}"]


def print_default_analysis(why: str) -> int:
    """The default job without a Hopper GPU (``why``: what there is instead): ``python -m cupy_dash schedule``
    with :func:`default_analysis_argv` (one path: the schedule command itself), after a line that gives that
    command and how it differs from the command's own defaults (a full mask in the paper's DAG model). Returns
    the command's exit status."""
    from . import schedule as cli_schedule
    argv = default_analysis_argv()
    mask = "causal " if ANALYSIS_SHAPE["causal"] else ""
    print(f"{why}, so no demo: showing `python -m cupy_dash schedule {' '.join(argv)}`, a {mask}training shape "
          f"(head dim {ANALYSIS_SHAPE['head_dim']}) in the engine model that auto uses (without these options the "
          f"schedule command shows a full mask in the paper's DAG model).")
    return cli_schedule.main(argv)


def default_main(argv=None):
    state, desc = _gpu_state()
    if state == "hopper":
        return demo_main(argv)
    if state == "none":
        return print_default_analysis(f"No usable CUDA GPU ({desc})")
    return print_default_analysis(f"{desc} is not a Hopper GPU (the kernels need sm_90a)")


# ----------------------------------------------------------------------------------------------------------------
# demo
# ----------------------------------------------------------------------------------------------------------------
def _demo_parser():
    p = argparse.ArgumentParser(prog="python -m cupy_dash demo",
                                description="Forward + backward with every schedule on one shape: bitwise "
                                "repeatability, error against the float64 reference, TFLOP/s.")
    from .schedule import _int_at_least
    positive = _int_at_least(1)
    p.add_argument("--batch", type=positive, default=2)
    p.add_argument("--heads", type=positive, default=16)
    p.add_argument("--seqlen", type=positive, default=2048)
    p.add_argument("--hdim", type=int, default=128, choices=(64, 96, 128, 192, 256))
    p.add_argument("--full", action="store_true", help="no causal mask (default: causal)")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    p.add_argument("--repeats", type=positive, default=20, help="timed calls per measurement (median reported)")
    return p


def _max_err(actual, ref):
    import numpy as np
    a = np.asarray(actual, dtype=np.float64)
    r = np.asarray(ref, dtype=np.float64)
    fin = np.isfinite(r)
    d = np.abs(np.where(fin, a, 0.0) - np.where(fin, r, 0.0))
    return float(np.where(np.isnan(d), np.inf, d).max()) if d.size else 0.0


def _within_fa3(actuals, refs, lowps):
    from .. import reference
    try:
        for a, r, lp in zip(actuals, refs, lowps):
            reference.assert_close_fa3("x", a, r, lp)
    except AssertionError:
        return False
    return True


def _same_bits(xs, ys):
    import cupy
    return all(bool(cupy.array_equal(x.view(cupy.int16), y.view(cupy.int16))) for x, y in zip(xs, ys))


def _median_ms(call, repeats):
    """Median GPU time (ms) of ``call`` over ``repeats`` timed calls after 2 untimed ones: each call bracketed by
    two CUDA events on the current stream, the calls enqueued back to back, one synchronization at the end."""
    import cupy
    import numpy as np
    for _ in range(2):
        call()
    stream = cupy.cuda.get_current_stream()
    pairs = [(cupy.cuda.Event(), cupy.cuda.Event()) for _ in range(repeats)]
    for start, end in pairs:
        start.record(stream)
        call()
        end.record(stream)
    pairs[-1][1].synchronize()
    return float(np.median([cupy.cuda.get_elapsed_time(start, end) for start, end in pairs]))


def _table(headers, rows):
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(headers)]
    fmt = "| " + " | ".join(f"{{:{w}}}" for w in widths) + " |"
    out = [fmt.format(*headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [fmt.format(*[str(c) for c in r]) for r in rows]
    return "\n".join(out)


def demo_main(argv=None):
    args = _demo_parser().parse_args(argv)
    state, desc = _gpu_state()
    if state != "hopper":
        from .. import gpu
        what = f"No usable CUDA GPU ({desc})" if state == "none" else f"{desc} is not a Hopper GPU"
        print(f"{what}: the demo needs {gpu.NEEDS}. `python -m cupy_dash schedule` works without one.")
        return 1

    import cupy

    import cupy_dash
    from .. import reference
    from .measure import ATOMIC, SCHEDULES, attention_flops, random_tensor

    B, H, S, D = args.batch, args.heads, args.seqlen, args.hdim
    causal = not args.full
    shape = (B, S, H, D)
    f_fwd = attention_flops(B, H, S, S, D, causal, "fwd")
    f_bwd = attention_flops(B, H, S, S, D, causal, "bwd")
    print(f"cupy_dash {cupy_dash.__version__} demo on {desc}")
    print(f"shape: B={B} H={H} S={S} D={D} {'causal' if causal else 'full'} {args.dtype}; "
          f"forward {f_fwd / 1e9:.1f} GFLOP, backward {f_bwd / 1e9:.1f} GFLOP")
    q, k, v, do = (random_tensor(shape, args.dtype, seed=i) for i in range(4))
    dev = cupy.cuda.Device()
    failures = []

    # float64 reference on one (batch, head) slice: heads are independent (no GQA here).
    def host_slice(x):
        x = x[:1, :, :1]
        try:
            return cupy.asnumpy(x)
        except Exception:
            return cupy.asnumpy(x.view(cupy.uint16)).view(x.dtype)

    hq, hk, hv, hdo = (host_slice(x) for x in (q, k, v, do))
    np_dtype = hq.dtype
    out_ref, lse_ref = reference.forward(hq, hk, hv, causal=causal)
    out_lp, lse_lp = reference.forward_lowp(hq, hk, hv, causal=causal, dtype=np_dtype)
    grads_ref = reference.backward(hdo, hq, hk, hv, out_ref, lse_ref, causal=causal)
    grads_lp = reference.backward_lowp(hdo, hq, hk, hv, out_lp, lse_lp, causal=causal, dtype=np_dtype)

    t = time.perf_counter()
    out, lse = cupy_dash.attention_forward(q, k, v, causal=causal)
    dev.synchronize()
    first_fwd = time.perf_counter() - t
    fwd_ms = _median_ms(lambda: cupy_dash.attention_forward(q, k, v, causal=causal), args.repeats)
    out_err = _max_err(host_slice(out), out_ref)
    if not _within_fa3([host_slice(out)], [out_ref], [out_lp]):
        failures.append(f"forward: error above FA3's bound (2x the plain {args.dtype} error + rounding)")
    print(f"\nforward: first call {first_fwd:.2f} s (NVRTC compile, or the disk cache); "
          f"{fwd_ms:.3f} ms = {f_fwd / fwd_ms / 1e9:.0f} TFLOP/s")
    print(f"forward error on batch 0, head 0: max abs err of out = {out_err:.2e} "
          f"(a plain {args.dtype} implementation: {_max_err(out_lp, out_ref):.2e})")

    rows = []
    bits_by_schedule = {}
    for sched in SCHEDULES + (ATOMIC,):
        kw = dict(schedule="auto", deterministic=False) if sched == ATOMIC else dict(schedule=sched,
                                                                                     deterministic=True)
        name = f"{ATOMIC} (deterministic=False)" if sched == ATOMIC else sched

        def call(kw=kw):
            return cupy_dash.attention_backward(do, q, k, v, out, lse, causal=causal, **kw)

        try:
            t = time.perf_counter()
            call()
            dev.synchronize()
            first = time.perf_counter() - t
            run1, run2 = call(), call()
            cupy_dash.check_errors()
            same = _same_bits(run1, run2)
            ms = _median_ms(call, args.repeats)
            cupy_dash.check_errors()
            got = [host_slice(g) for g in run1]
            errs = [_max_err(g, r) for g, r in zip(got, grads_ref)]
            within = _within_fa3(got, grads_ref, grads_lp)
            bits_by_schedule[sched] = run1
        except Exception as exc:
            rows.append([name, "-", "-", "-", f"FAILED: {type(exc).__name__}: {exc}", "-", "-", "-", "-"])
            failures.append(f"{sched}: {exc}")
            continue
        if sched == ATOMIC:
            rep = "yes" if same else "no (allowed)"
        else:
            rep = "yes" if same else "NO"
            if not same:
                failures.append(f"{sched}: two backward passes differ bitwise")
        if not within:
            failures.append(f"{sched}: error above FA3's bound (2x the plain {args.dtype} error + rounding)")
        rows.append([name, f"{first:.2f}", f"{ms:.3f}", f"{f_bwd / ms / 1e9:.0f}", rep] +
                    [f"{e:.2e}" for e in errs] + ["ok" if within else "FAIL"])
    print("\nbackward (the first call of a kernel variant compiles it or loads it from the disk cache):\n")
    print(_table(["schedule", "first call s", "median ms", "TFLOP/s", "2 runs bitwise identical",
                  "dq max err", "dk max err", "dv max err", "FA3 rule"], rows))
    print(f"\nerrors are on batch 0, head 0 against float64; a plain {args.dtype} implementation has "
          + ", ".join(f"{n} {_max_err(lp, r):.2e}" for n, lp, r in zip(("dq", "dk", "dv"), grads_lp, grads_ref)))
    det = [s for s in SCHEDULES if s in bits_by_schedule]
    if len(det) > 1:
        groups = {}
        for s in det:
            key = next((g for g in groups if _same_bits(bits_by_schedule[g], bits_by_schedule[s])), s)
            groups.setdefault(key, []).append(s)
        print("deterministic schedules with identical bits: "
              + "; ".join(" = ".join(g) for g in groups.values())
              + " (schedules may differ from each other: the dQ sum order differs)")
    if failures:
        print("\nFAILED: " + "; ".join(failures))
        return 1
    return 0
