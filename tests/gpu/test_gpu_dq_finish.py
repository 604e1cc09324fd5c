"""GPU tests of the dQ finisher (need an NVIDIA Hopper GPU; skipped elsewhere, see conftest.py).

A deterministic fixed-length backward that is not folded converts dq in its main kernel: each CTA converts the
dQ tiles of its host-made list once each is complete, a warp of the producer warpgroup while the visits run and the
MMA warpgroups after them (the tiles that complete last; kernels_src/bwd/dq_finish.cuh), preprocess writes the dq
rows of tiles no visit reaches, and no postprocess kernel runs: with ``CUPY_DASH_BWD_DQ_FINISH=1`` (the default is
the postprocess kernel until the finisher's speed is measured). Here:

* the finisher's dq, dk, dv have the postprocess kernel's bits for every deterministic schedule, at every dQ
  accumulator layout (head dim 64's 128-query tile, 128's 64- and 80-query tiles, 96 padded, 192's three slices,
  256's column quarters), with odd lengths, GQA, query rows that see no key (whole dQ tiles no visit reaches) and a
  long causal sequence (many tiles per CTA, several heads), on outputs poisoned with NaN first;
* after finishing calls, eager and graph-captured, every error record is back to zero (the count of ended CTAs
  included), so a record serves the next call.
"""
from __future__ import annotations

import pytest

import cupy_dash
from cupy_dash import config, reference
from cupy_dash.cuda import launchers
from gpu_helpers import (POLICIES, Case, _assert_finite, _assert_same_bits, _case_data, _dev, _host, _poison_pool,
                         _poison_size, _schedule_kwargs)
from test_gpu_fold import FoldCase, _assert_records_zero, _inputs

pytestmark = pytest.mark.gpu

FINISH_ENV = config.BWD_DQ_FINISH.name

CASES = [FoldCase("bf16", 128, True, 1000, 1000, batch=2, heads=4),            # 64-query tile
         FoldCase("bf16", 128, False, 1100, 1037, heads=4),                     # 80-query tile: dQ^T layout
         FoldCase("fp16", 128, True, 1000, 300, batch=2, heads=16, kv_heads=2),  # 700 rows see no key, GQA
         FoldCase("bf16", 64, False, 777, 1500, heads=8),                      # 128-query tile: row halves
         FoldCase("bf16", 96, False, 1100, 900, heads=4),                      # padded head dim, dQ^T layout
         FoldCase("bf16", 192, False, 777, 1000, heads=6, kv_heads=2),          # three dQ^T slices
         FoldCase("bf16", 256, True, 1000, 1000, heads=4),                      # column quarters
         FoldCase("fp16", 64, True, 1, 1),
         FoldCase("bf16", 128, True, 8192, 8192, heads=4)]                      # causal 80-query tile, long


def _backward(monkeypatch, finish, inputs, **kwargs):
    monkeypatch.setenv(launchers.FOLD_ENV, "0")
    monkeypatch.setenv(FINISH_ENV, finish)
    _poison_pool(_poison_size(*inputs[:4]))
    grads = cupy_dash.attention_backward(*inputs, **kwargs)
    cupy_dash.check_errors()
    return [_host(x) for x in grads]


@pytest.mark.parametrize("schedule", POLICIES)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_finished_bits_equal_postprocess(case, schedule, monkeypatch):
    inputs = _inputs(case)
    kwargs = dict(_schedule_kwargs(schedule), causal=case.causal)
    want = _backward(monkeypatch, "0", inputs, **kwargs)
    got = _backward(monkeypatch, "1", inputs, **kwargs)
    for name, a, b in zip(("dq", "dk", "dv"), got, want):
        _assert_finite(name, a)
        _assert_same_bits(name, a, b)
    _assert_records_zero()


def test_finished_rows_without_keys_match_the_reference(monkeypatch):
    """Causal, Sq > Sk: the leading 1299 - 700 query rows see no key; their dQ tiles get no visit, and preprocess
    writes their dq (zero) where no postprocess runs."""
    monkeypatch.setenv(launchers.FOLD_ENV, "0")
    monkeypatch.setenv(FINISH_ENV, "1")
    case = Case("bf16", 64, True, 1299, 700, batch=2, heads=3)
    data = _case_data(case, backward=True)
    do, q, k, v, out = (_dev(data[n]) for n in ("do", "q", "k", "v", "out_in"))
    lse = _dev(data["lse_in"])
    _poison_pool(_poison_size(do, q, k, v))
    grads = [_host(x) for x in cupy_dash.attention_backward(do, q, k, v, out, lse, causal=True)]
    cupy_dash.check_errors()
    for name, got in zip(("dq", "dk", "dv"), grads):
        _assert_finite(name, got)
        reference.assert_close_fa3(name, got, data[f"{name}_ref"], data[f"{name}_lowp"])
    assert not grads[0][:, :1299 - 700].any()
    _assert_records_zero()


def test_finished_graph_capture_leaves_records_zero(monkeypatch):
    """torch: a captured forward + backward (unfolded, finishing), replayed, equals eager; the graph's record and
    every eager slot are back to zero afterwards."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    from torch_helpers import Case as TorchCase, assert_same_bits, capture_step, eager, make_inputs, replay
    monkeypatch.setenv(launchers.FOLD_ENV, "0")
    monkeypatch.setenv(FINISH_ENV, "1")
    case = TorchCase(128, True, seqlen_q=1000, seqlen_k=1000)
    q, k, v, dout = make_inputs(case)
    want = eager(case, q, k, v, dout)
    graph, static_in, static_out = capture_step(case, q, k, v, dout, warm_up=False)
    for _ in range(3):
        assert_same_bits("finishing graph replay", replay(graph, static_in, static_out, (q, k, v, dout)), want)
    cupy_dash.check_errors()
    _assert_records_zero(q.device.index)
