"""CUDA-event timing and the commit a report names, for the benchmark scripts of ``benchmarks/`` (conventions:
docs/performance.md): a standalone module beside them, imported by name as their other siblings are (``from measure
import time_calls``); the FLOP counts and seeded inputs they share with the demo stay in cupy_dash/cli/measure.py.
"""
from __future__ import annotations

import os
import subprocess
import time

__all__ = ["CupyEvents", "time_calls", "commit", "compile_probe", "load_probe", "write_rows"]


def commit():
    """The commit a report names: ``CUPY_DASH_COMMIT`` if set (the GPU machine's copy of the repository reports a
    stale ``git rev-parse HEAD``), else this checkout's short commit, or None."""
    if os.environ.get("CUPY_DASH_COMMIT"):
        return os.environ["CUPY_DASH_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                             cwd=os.path.dirname(os.path.abspath(__file__)))
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


class CupyEvents:
    """The events :func:`time_calls` records: CuPy's, on the current stream."""

    def __init__(self):
        import cupy
        self.cupy = cupy

    def event(self):
        return self.cupy.cuda.Event()

    def record(self, ev):
        ev.record(self.cupy.cuda.get_current_stream())

    def synchronize(self, ev):
        ev.synchronize()

    def elapsed_ms(self, start, end):
        return float(self.cupy.cuda.get_elapsed_time(start, end))


def time_calls(calls, *, warmup, repeats, events, flush=None, warmup_s=0.0):
    """Median-ready list of per-call GPU times (ms): ``calls[i % len(calls)]`` is call i (rotating input sets).

    Every call is bracketed by two events on the current stream; calls are enqueued back to back and the host
    synchronizes once at the end. ``events``: :class:`CupyEvents` or any object with the same four methods
    (the benchmark's torch peer passes torch's); ``flush``: called before every timed call, outside the events.
    ``warmup_s``: after the ``warmup`` calls, more untimed calls until that many seconds of wall time have passed
    since the first (at most two calls in flight): a busy H200 reaches its power limit within ~0.1 s and lowers its
    SM clock (1980 -> ~1700 MHz at 15k tokens), so calls timed right after an idle GPU run faster than a training
    step's would.
    """
    n = len(calls)
    t0 = time.perf_counter()
    for i in range(warmup):
        calls[i % n]()
    i, prev = warmup, None
    while time.perf_counter() - t0 < warmup_s:
        calls[i % n]()
        ev = events.event()
        events.record(ev)
        if prev is not None:
            events.synchronize(prev)
        prev, i = ev, i + 1
    starts = [events.event() for _ in range(repeats)]
    ends = [events.event() for _ in range(repeats)]
    for i in range(repeats):
        if flush is not None:
            flush()
        events.record(starts[i])
        calls[i % n]()
        events.record(ends[i])
    events.synchronize(ends[-1])
    return [events.elapsed_ms(s, e) for s, e in zip(starts, ends)]


def compile_probe(source: str, entry: str) -> bytes:
    """The sm_90a cubin of a probe kernel's CUDA ``source`` (entry point ``entry``; it may include the package's
    kernels_src headers), compiled with NVRTC as the package's kernels are (no GPU needed); RuntimeError on a
    compile error, a spill or a ptxas performance warning, as ``compile --all`` refuses them."""
    from cupy_dash.cuda import jit
    cubin, log, ok = jit.compile_source(source, f"{entry}.cu", [*jit.BASE_OPTIONS, f"-I{jit.kernel_dir()}"])
    if not ok:
        raise RuntimeError(log)
    stats = jit.parse_ptxas_log(log, entry)
    if stats["spill_stores"] or stats["spill_loads"] or stats["stack_frame"] or jit.perf_warnings(log):
        raise RuntimeError(f"{entry} spills or has ptxas performance warnings: {log}")
    return cubin


def load_probe(cubin: bytes, entry: str, smem_bytes: int):
    """(CuPy function of ``entry``, its module, the GPU's name) with ``smem_bytes`` of dynamic shared memory allowed;
    the module must outlive the function's launches."""
    import cupy
    from cupy.cuda import driver, function
    module = function.Module()
    module.load(cubin)
    kernel = module.get_function(entry)
    driver.funcSetAttribute(kernel.ptr, driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem_bytes)
    name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
    return kernel, module, name.decode() if isinstance(name, bytes) else name


def write_rows(path: str, rows: list, gpu: str) -> None:
    """A probe's report: ``rows`` under meta (date, command, commit, gpu), as JSON at ``path``."""
    import datetime
    import json
    import sys
    meta = dict(date=datetime.datetime.now().isoformat(timespec="seconds"), command=" ".join(["python", *sys.argv]),
                commit=commit(), gpu=gpu)
    with open(path, "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
