"""The Python of a torch varlen backward with a new packing (cupy_dash.core.fastpath_varlen's new-packing path), on any
machine: torch tensors imitated and every GPU call replaced (the fakes of tests/fastpath_fakes.py), 300 / 500
tokens in 4 sequences, a new cut per call. Prints the µs per call, the part spent in the host build
(varlen_launch._tables, timed as benchmarks/varlen_step.py times it) and the rest, then a cProfile by own time.

    python -m pytest -q -s benchmarks/host_varlen_python.py
"""
import cProfile
import itertools
import os
import pstats
import sys
import time
import types

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import cupy_dash  # noqa: E402
from cupy_dash.core import api, fastpath, fastpath_varlen  # noqa: E402
from cupy_dash.cuda import errors, launchers  # noqa: E402
import fastpath_fakes as fakes  # noqa: E402
from varlen_step import _Parts  # noqa: E402
from fastpath_fakes import no_gpu, _inputs, _tables_per_packing  # noqa: E402,F401  (fixture)


def _packings(rng, n):
    out = []
    for _ in range(n):
        cq, ck = (np.concatenate([[0], np.sort(rng.choice(np.arange(1, total), 3, replace=False)), [total]]).astype(
            np.int32) for total in (300, 500))
        out.append((cq, ck, int(np.diff(cq).max()), int(np.diff(ck).max())))
    return out


def test_new_packing_host_python(no_gpu, monkeypatch):  # noqa: F811  (the fixture)
    _tables_per_packing(monkeypatch)
    slots, addresses = itertools.count(0xA000, 0x40), itertools.count(0x1000000, 0x10000)
    acquire = lambda dev: types.SimpleNamespace(dptr=next(slots), hdev=0x10)  # noqa: E731
    monkeypatch.setattr(errors, "acquire_slot", acquire)
    monkeypatch.setattr(api, "acquire_slot", acquire)
    monkeypatch.setattr(launchers, "enqueue_backward", lambda *a, **kw: None)
    empty = lambda shape, dtype=None, device=None: fakes.Tensor(  # noqa: E731
        shape if isinstance(shape, tuple) else (shape,), dtype, next(addresses) % (1 << 40))
    monkeypatch.setattr(fastpath._torch, "empty", empty)
    monkeypatch.setattr(fastpath._torch, "empty_like", lambda t: empty(t.shape, t.dtype))
    args = _inputs()
    run = lambda p: cupy_dash.attention_backward_varlen(*args, *p, causal=True)  # noqa: E731
    packings = _packings(np.random.default_rng(0), 2200)
    for p in packings[:200]:
        run(p)
    parts = _Parts()                             # varlen_step's timers: the build is varlen_launch._tables
    t0 = time.perf_counter_ns()
    for p in packings[200:1200]:
        run(p)
    total = (time.perf_counter_ns() - t0) / 1000 / 1e3
    build = parts.medians()["build"]
    print(f"\nnew packing: {total:.1f} us per call, host build {build:.1f} (median), the rest {total - build:.1f}",
          fastpath_varlen.stats())
    prof = cProfile.Profile()
    prof.enable()
    for p in packings[1200:]:
        run(p)
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(20)
    assert fastpath_varlen.stats()["new_packing_hits"] >= 2000
