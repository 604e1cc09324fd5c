"""``python -m cupy_dash compile``: compile kernel variants with NVRTC for sm_90a (no GPU needed) and report
registers, spills, stack and shared memory per kernel.

Exit status: 0 if every selected variant compiled with no spills, no stack frame and no ptxas performance
warning (C75xx: serialized wgmma, ignored setmaxnreg), 1 otherwise (each failure is named), 2 on bad arguments.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

from ..cuda import jit, kernels

_DTYPE_ALIASES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "fp16": "float16",
                  "half": "float16"}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m cupy_dash compile",
        description="Compile cupy_dash kernel variants for sm_90a with NVRTC (no GPU needed) and check that "
                    "none spills. Select with --all or with any of the filters.")
    p.add_argument("--all", action="store_true", help="every variant the dispatcher can emit")
    p.add_argument("--timeline", action="store_true",
                   help="the main kernel's timeline debug builds (benchmarks/timeline.py) instead")
    p.add_argument("--head-dim", type=int, action="append", choices=kernels.SUPPORTED_HEAD_DIMS,
                   help="only this head dimension (repeatable)")
    p.add_argument("--dtype", action="append", choices=sorted(_DTYPE_ALIASES),
                   help="only this element type (repeatable)")
    p.add_argument("--kernel", action="append", choices=kernels.KERNEL_NAMES,
                   help="only this kernel (repeatable)")
    p.add_argument("--no-cache", action="store_true", help="rebuild even when a cached cubin exists")
    p.add_argument("-j", "--jobs", type=int, default=None, metavar="N",
                   help=f"compile in N processes (default: every core this process may run on, "
                        f"{available_cores()} here)")
    p.add_argument("-v", "--verbose", action="store_true", help="print each kernel's full ptxas report")
    return p


def available_cores() -> int:
    """CPU cores this process may run on: its affinity mask (taskset, a container's cpuset), else os.cpu_count()."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:          # no sched_getaffinity (macOS, Windows)
        return os.cpu_count() or 1


def select(head_dims=None, dtypes=None, names=None) -> list:
    """The specs of :func:`kernels.all_specs` that match every given filter (None = no filter)."""
    dtypes = None if dtypes is None else {_DTYPE_ALIASES[d] for d in dtypes}
    out = []
    for spec in kernels.all_specs():
        d = dict(spec.defines)
        dtype = "float16" if d.get("DASH_FP16") else "bfloat16"
        if head_dims is not None and d.get("DASH_HEAD_DIM") not in head_dims:
            continue
        if dtypes is not None and dtype not in dtypes:
            continue
        if names is not None and spec.kernel not in names:
            continue
        out.append(spec)
    return out


def _compile_one(args):
    spec, force = args
    t0 = time.perf_counter()
    try:
        return spec, jit.compile_spec(spec, force=force, verbose=False), None
    except jit.CompileError as exc:
        return spec, None, exc.log
    except Exception as exc:  # NVRTC missing, cache dir unwritable, ...: report it for this kernel, go on
        return spec, None, f"{type(exc).__name__}: {exc} (after {time.perf_counter() - t0:.2f} s)"


def main(argv=None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    filtered = args.head_dim or args.dtype or args.kernel
    if args.all and filtered:
        parser.error("--all selects everything; leave out --head-dim/--dtype/--kernel, or drop --all")
    if args.timeline and (args.all or filtered):
        parser.error("--timeline selects the debug builds alone; leave out --all/--head-dim/--dtype/--kernel")
    if not (args.all or filtered or args.timeline):
        parser.error("nothing selected: pass --all, --timeline, or --head-dim/--dtype/--kernel")
    if args.jobs is None:
        args.jobs = available_cores()
    if args.jobs < 1:
        parser.error("--jobs must be >= 1")
    specs = (kernels.timeline_specs() if args.timeline else kernels.all_specs() if args.all
             else select(args.head_dim, args.dtype, args.kernel))
    if not specs:
        parser.error("no kernel variant matches these filters")

    print(f"cupy_dash {jit.__version__}: {len(specs)} kernel(s) for {jit.ARCH}, NVRTC "
          f"{'.'.join(map(str, jit.nvrtc_version()))}, sources {jit.kernel_dir()}, cache {jit.cache_dir()}")
    header = f"{'kernel':<40} {'regs':>5} {'spill st/ld':>12} {'stack':>6} {'smem dyn+st':>12} {'seconds':>8}  cached"
    print(header)
    print("-" * len(header))
    jobs = [(spec, args.no_cache) for spec in specs]
    t0 = time.perf_counter()
    if args.jobs > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(max_workers=min(args.jobs, len(jobs))) as pool:
            results = pool.map(_compile_one, jobs)
            rows = _report(results, args.verbose)
    else:
        rows = _report(map(_compile_one, jobs), args.verbose)
    problems = [problem for problem, _ in rows if problem]
    n_cached = sum(1 for _, cached in rows if cached)
    print("-" * len(header))
    total = time.perf_counter() - t0
    if problems:
        print(f"FAILED: {len(problems)} of {len(specs)} kernel(s) ({total:.1f} s):", file=sys.stderr)
        for line in problems:
            print(f"  {line}", file=sys.stderr)
        return 1
    print(f"OK: {len(specs)} kernel(s) ({n_cached} from the cache), no spills, no stack frame, no ptxas "
          f"performance warnings ({total:.1f} s)")
    return 0


def _report(results, verbose: bool) -> list:
    """Print one table row per result as it arrives; return (problem or '', cached) per kernel."""
    out = []
    for spec, ck, error in results:
        if ck is None:
            print(f"{spec.label:<40} {'COMPILE ERROR':>45}", flush=True)
            print(error.rstrip(), file=sys.stderr)
            out.append((f"{spec.label}: compile error", False))
            continue
        smem = f"{spec.smem_bytes}+{ck.static_smem}"
        print(f"{spec.label:<40} {ck.registers:>5} {f'{ck.spill_stores}/{ck.spill_loads}':>12} "
              f"{ck.stack_frame:>6} {smem:>12} {ck.seconds:>8.2f}  {'yes' if ck.cached else 'no'}", flush=True)
        if verbose:
            print(ck.log.rstrip())
        issues = []
        if ck.spill_stores or ck.spill_loads:
            issues.append(f"spills {ck.spill_stores} bytes stores / {ck.spill_loads} bytes loads")
        if ck.stack_frame:
            issues.append(f"{ck.stack_frame} bytes stack frame")
        issues.extend(ck.perf_warnings)
        out.append((f"{spec.label}: {', '.join(issues)}" if issues else "", ck.cached))
    return out


if __name__ == "__main__":
    sys.exit(main())
