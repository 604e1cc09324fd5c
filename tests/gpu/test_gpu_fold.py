"""GPU tests of the folded backward (need an NVIDIA Hopper GPU; skipped elsewhere, see conftest.py).

A backward of at most ``launchers.FOLD_MAX_TILES`` tile pairs runs preprocess and postprocess inside the main
kernel, one launch, with grid barriers between the phases (kernels_src/bwd/fold.cuh); ``CUPY_DASH_FOLD`` = 0 / 1
forces three launches / one. The other GPU suites run their small shapes folded (the default) and their large
ones unfolded, both against the float64 oracle. Here:

* folded and unfolded give the same dq, dk, dv bits for every schedule (deterministic; the atomic path within
  its rounding), fixed-length MHA and GQA, causal and full, rows without keys, a one-token problem, a problem
  far above the size rule (132 CTAs, several Q tiles per CTA in each pass), compact tables;
* explicit tables on 1-7 CTAs (many Q tiles per CTA in the passes), with CTAs that have no visit (CTA 0 among
  them: it publishes the record), folded, match the oracle and the unfolded bits;
* after folded calls, eager and graph-captured, every error record is back to zero (the barrier counters
  included), so a record can serve the next call.
"""
from __future__ import annotations

import types
from dataclasses import dataclass

import numpy as np
import pytest

import cupy
import cupy_dash
from cupy_dash import reference
from cupy_dash.cuda import errors, launchers
from gpu_helpers import (ATOMIC, DTYPES, POLICIES, Case, _assert_finite, _assert_same_bits, _case_data, _dev,
                         _host, _poison_pool, _poison_size, _randn, _schedule_kwargs, _seed)

pytestmark = pytest.mark.gpu


@dataclass(frozen=True)
class FoldCase:
    dtype: str
    hdim: int
    causal: bool
    seqlen_q: int
    seqlen_k: int
    batch: int = 1
    heads: int = 1
    kv_heads: int = 0         # 0: as many as heads

    @property
    def hkv(self) -> int:
        return self.kv_heads or self.heads

    @property
    def id(self) -> str:
        mask = "causal" if self.causal else "full"
        return (f"{self.dtype}-d{self.hdim}-{mask}-sq{self.seqlen_q}-sk{self.seqlen_k}-b{self.batch}-h{self.heads}"
                f"-hkv{self.hkv}")

    def __str__(self):
        return self.id


FOLD_CASES = [FoldCase("bf16", 128, True, 1024, 1024, batch=2, heads=4),       # 64 CTAs, 2 Q tiles each per pass
              FoldCase("bf16", 64, False, 777, 1500, heads=8),
              FoldCase("fp16", 128, True, 1000, 300, batch=2, heads=16, kv_heads=2),   # rows without keys, GQA
              FoldCase("bf16", 64, True, 1, 1),
              FoldCase("fp16", 64, False, 4096, 4096, heads=16),                 # 64x FOLD_MAX_TILES: forced
              FoldCase("bf16", 256, True, 1000, 1000, heads=4),                  # split head dim, two warpgroups
              FoldCase("bf16", 192, False, 777, 1000, heads=6, kv_heads=2)]      # three: passes on 256 of 384


def _inputs(case: FoldCase):
    rng = np.random.default_rng(_seed(case.id))
    dt = DTYPES[case.dtype]
    b, sq, sk, h, hk, d = case.batch, case.seqlen_q, case.seqlen_k, case.heads, case.hkv, case.hdim
    q, k, v = (_dev(_randn(rng, s, dt)) for s in ((b, sq, h, d), (b, sk, hk, d), (b, sk, hk, d)))
    do = _dev(_randn(rng, (b, sq, h, d), dt))
    out, lse = cupy_dash.attention_forward(q, k, v, causal=case.causal)
    return do, q, k, v, out, lse


def _backward(monkeypatch, fold, inputs, **kwargs):
    monkeypatch.setenv(launchers.FOLD_ENV, fold)
    _poison_pool(_poison_size(*inputs[:4]))
    grads = cupy_dash.attention_backward(*inputs, **kwargs)
    cupy_dash.check_errors()
    return grads


def _assert_records_zero(device_id=0):
    """Every free eager slot's and every graph record's 8 words are 0: no failure, barrier counters reset (slots
    retired after a failure, as other modules' error tests cause, are left out)."""
    pool = errors._slot_pools[device_id]
    free = {s.dptr for s in pool.free}
    for dbuf, _ in pool._blocks:
        words = cupy.asnumpy(dbuf).reshape(-1, errors.RECORD_BYTES // 4)
        rows = [i for i in range(len(words)) if dbuf.data.ptr + errors.RECORD_BYTES * i in free]
        assert not words[rows].any(), f"eager error records not zero: {words[rows][:4]}"
    graph = cupy.asnumpy(pool.graph.block)
    assert not graph.any(), f"graph records not zero: {graph[graph.any(axis=1)][:4]}"


@pytest.mark.parametrize("schedule", POLICIES + (ATOMIC,))
@pytest.mark.parametrize("case", FOLD_CASES, ids=str)
def test_folded_bits_equal_unfolded(case, schedule, monkeypatch):
    inputs = _inputs(case)
    kwargs = dict(_schedule_kwargs(schedule), causal=case.causal)
    unfolded = [_host(x) for x in _backward(monkeypatch, "0", inputs, **kwargs)]
    folded = [_host(x) for x in _backward(monkeypatch, "1", inputs, **kwargs)]
    for name, a, b in zip(("dq", "dk", "dv"), folded, unfolded):
        _assert_finite(name, a)
        if schedule == ATOMIC:        # fp32 atomic adds in another order: equal up to their rounding
            a, b = a.astype(np.float32), b.astype(np.float32)
            assert np.abs(a - b).max() <= 1e-2 * np.abs(b).max() + 1e-3, name
        else:
            _assert_same_bits(name, a, b)
    _assert_records_zero()


@pytest.mark.parametrize("fold", ["0", "1"])
def test_folded_compact_tables_bits(fold, monkeypatch):
    """Compact per-column records (CUPY_DASH_COMPACT_TABLES=1) folded: the per-visit tables' bits."""
    case = FOLD_CASES[0]
    inputs = _inputs(case)
    want = [_host(x) for x in _backward(monkeypatch, "0", inputs, causal=True, schedule="symmetric_shift")]
    monkeypatch.setenv("CUPY_DASH_COMPACT_TABLES", "1")
    got = [_host(x) for x in _backward(monkeypatch, fold, inputs, causal=True, schedule="symmetric_shift")]
    for name, a, b in zip(("dq", "dk", "dv"), got, want):
        _assert_same_bits(name, a, b)


def _with_idle_ctas(plan, front, back):
    """``plan`` with ``front`` CTAs without visits before its CTAs and ``back`` after them."""
    visits = np.array(plan.visits, dtype=np.int32, copy=True)
    visits[:, 0] += front
    V = len(visits)
    cta_start = np.concatenate([np.zeros(front, np.int64), np.asarray(plan.cta_start, np.int64),
                                np.full(back, V, np.int64)])
    return types.SimpleNamespace(visits=visits, rank=np.asarray(plan.rank), cta_start=cta_start,
                                 num_ctas=plan.num_ctas + front + back, policy=plan.policy)


@pytest.mark.parametrize("num_ctas,idle", [(1, (0, 0)), (3, (2, 2)), (7, (0, 3))], ids=["1cta", "3cta-idle", "7cta"])
def test_folded_small_grid_with_idle_ctas_matches_reference(num_ctas, idle, monkeypatch):
    from cupy_dash import schedule as dash_schedule
    from cupy_dash.cuda import kernels
    from cupy_dash.core.api import _backward_with_plan

    case = Case("bf16", 64, True, 1299, 700, batch=1, heads=3)
    data = _case_data(case, backward=True)
    do, q, k, v, out = (_dev(data[n]) for n in ("do", "q", "k", "v", "out_in"))
    lse = _dev(data["lse_in"])
    tile = kernels.bwd_tile(case.hdim, True)
    plan = dash_schedule.build("descending", seqlen_q=case.seqlen_q, seqlen_k=case.seqlen_k, block_m=tile.block_m,
                               block_n=tile.block_n, num_heads=case.batch * case.heads, causal=True,
                               num_sms=num_ctas)
    plan = _with_idle_ctas(plan, *idle)
    results = {}
    for fold in ("0", "1"):
        monkeypatch.setenv(launchers.FOLD_ENV, fold)
        _poison_pool(_poison_size(do, q, k, v))
        results[fold] = [_host(x) for x in _backward_with_plan(do, q, k, v, out, lse, plan=plan, causal=True)]
        cupy_dash.check_errors()
    for i, name in enumerate(("dq", "dk", "dv")):
        _assert_finite(name, results["1"][i])
        reference.assert_close_fa3(name, results["1"][i], data[f"{name}_ref"], data[f"{name}_lowp"])
        _assert_same_bits(name, results["1"][i], results["0"][i])
    _assert_records_zero()


def test_folded_graph_capture_leaves_records_zero():
    """torch: a captured forward + backward (folded: 320 x 320, 4 heads), replayed, equals eager; the graph's
    record and every eager slot are back to zero afterwards."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    from torch_helpers import Case as TorchCase, assert_same_bits, capture_step, eager, make_inputs, replay
    case = TorchCase(128, True)
    assert launchers.fold_wanted(types.SimpleNamespace(B=case.batch, H=case.heads, Sq=320, Sk=320), 64, 128,
                                 False, None)
    q, k, v, dout = make_inputs(case)
    want = eager(case, q, k, v, dout)
    graph, static_in, static_out = capture_step(case, q, k, v, dout)
    for _ in range(3):
        assert_same_bits("folded graph replay", replay(graph, static_in, static_out, (q, k, v, dout)), want)
    cupy_dash.check_errors()
    _assert_records_zero(q.device.index)
