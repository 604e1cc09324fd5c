"""Tables whose last wave is cut into pieces of KV columns (cupy_dash/schedule/pieces.py, kernels_src/bwd/pieces.cuh):
dq, dk, dv against the float64 reference under FA3's rule, poisoned outputs, the bits repeated, deterministic and
atomic dQ, folded and not. Few CTAs (``num_sms``) so that every CTA runs several KV tiles of several heads before
its pieces, and every split column's pieces land on different CTAs."""
from __future__ import annotations

import pytest

cupy = pytest.importorskip("cupy")
import cupy_dash  # noqa: E402
from cupy_dash import reference, schedule  # noqa: E402
from cupy_dash.core import api  # noqa: E402
from cupy_dash.cuda import kernels  # noqa: E402
from cupy_dash.schedule import pieces  # noqa: E402

from gpu_helpers import (Case, _assert_finite, _assert_same_bits, _case_data, _dev, _host, _poison_pool,  # noqa: E402
                         _poison_size)

pytestmark = pytest.mark.gpu

# (case, CTAs, pieces per split column)
CASES = [
    (Case("bf16", 128, False, 1280, 1280, batch=1, heads=5), 13, 3),     # 50 columns on 13 CTAs: 11 split
    (Case("bf16", 128, False, 1000, 1333, batch=2, heads=3), 10, 2),     # odd lengths, Sq != Sk: 6 split
    (Case("fp16", 64, False, 777, 1024, batch=2, heads=4), 12, 3),       # head dim 64 (stores from the registers)
    (Case("bf16", 96, False, 640, 640, batch=1, heads=6), 8, 4),         # 6 split in fourths of 10 Q tiles
    (Case("bf16", 64, False, 1536, 1536, batch=1, heads=5), 13, 6),      # 8 split in sixths (head dim 64's candidate)
]


def _plan(case: Case, num_sms: int, num_pieces: int):
    tile = kernels.bwd_tile(case.hdim, False)
    base = schedule.build("shift", seqlen_q=case.seqlen_q, seqlen_k=case.seqlen_k, block_m=tile.block_m,
                          block_n=tile.block_n, num_heads=case.batch * case.heads, causal=False, num_sms=num_sms)
    plan = pieces.split_tail(base, num_pieces)
    assert plan.pieces is not None and plan.pieces.num_split > 0, "the case must leave a tail to split"
    return plan


def _inputs(case: Case):
    data = _case_data(case, backward=True)
    q, k, v, do = (_dev(data[n]) for n in ("q", "k", "v", "do"))
    return data, (do, q, k, v, _dev(data["out_in"]), cupy.asarray(data["lse_in"]))


@pytest.mark.parametrize("fold", ["0", "1"], ids=["three_kernels", "folded"])
@pytest.mark.parametrize("deterministic", [True, False], ids=["det", "atomic"])
@pytest.mark.parametrize("case,num_sms,num_pieces", CASES, ids=[f"{c.id}-ctas{n}-p{p}" for c, n, p in CASES])
def test_split_columns_match_the_reference(case, num_sms, num_pieces, deterministic, fold, monkeypatch):
    monkeypatch.setenv("CUPY_DASH_FOLD", fold)
    data, inputs = _inputs(case)
    plan = _plan(case, num_sms, num_pieces)
    _poison_pool(_poison_size(*inputs))
    grads = api._backward_with_plan(*inputs, plan=plan, deterministic=deterministic)
    cupy_dash.check_errors()
    for name, g in zip(("dq", "dk", "dv"), grads):
        g = _host(g)
        _assert_finite(name, g)
        reference.assert_close_fa3(name, g, data[f"{name}_ref"], data[f"{name}_lowp"])


# (case, CTAs): trim_tail's cuts (two pieces per cut column, whole runs moved too), causal masks included
TRIM_CASES = [
    (Case("bf16", 128, True, 700, 700, batch=1, heads=6), 5),            # 3 columns cut, 2 runs moved whole
    (Case("fp16", 64, True, 500, 900, batch=2, heads=3), 8),             # Sq != Sk, 128-query tile: 3 cut
    (Case("bf16", 128, False, 900, 600, batch=1, heads=5), 4),
]


@pytest.mark.parametrize("deterministic", [True, False], ids=["det", "atomic"])
@pytest.mark.parametrize("case,num_sms", TRIM_CASES, ids=[f"{c.id}-ctas{n}" for c, n in TRIM_CASES])
def test_trimmed_tables_match_the_reference(case, num_sms, deterministic):
    data, inputs = _inputs(case)
    tile = kernels.bwd_tile(case.hdim, case.causal)
    base = schedule.build("symmetric_shift", seqlen_q=case.seqlen_q, seqlen_k=case.seqlen_k, block_m=tile.block_m,
                          block_n=tile.block_n, num_heads=case.batch * case.heads, causal=case.causal,
                          num_sms=num_sms)
    plan = pieces.trim_tail(base)
    assert plan.pieces is not None, "the case must cut a column"
    _poison_pool(_poison_size(*inputs))
    grads = api._backward_with_plan(*inputs, plan=plan, causal=case.causal, deterministic=deterministic)
    again = api._backward_with_plan(*inputs, plan=plan, causal=case.causal, deterministic=deterministic)
    cupy_dash.check_errors()
    for name, g, g2 in zip(("dq", "dk", "dv"), grads, again):
        if deterministic:
            _assert_same_bits(name, g2, g)
        g = _host(g)
        _assert_finite(name, g, rows_from=case.empty_rows)
        reference.assert_close_fa3(name, g, data[f"{name}_ref"], data[f"{name}_lowp"])


REPEAT_CASES = CASES[:2] + CASES[4:]


@pytest.mark.parametrize("case,num_sms,num_pieces", REPEAT_CASES,
                         ids=[f"{c.id}-ctas{n}-p{p}" for c, n, p in REPEAT_CASES])
def test_split_columns_repeat_their_bits(case, num_sms, num_pieces):
    _, inputs = _inputs(case)
    plan = _plan(case, num_sms, num_pieces)
    first = api._backward_with_plan(*inputs, plan=plan)
    for _ in range(20):
        again = api._backward_with_plan(*inputs, plan=plan)
        for name, a, b in zip(("dq", "dk", "dv"), again, first):
            _assert_same_bits(name, a, b)
    cupy_dash.check_errors()


def test_split_columns_on_the_80_query_tile(monkeypatch):
    """The full path (not a test plan, whose tile is 64 queries): 160 KV columns of the 80-query tile on the GPU's
    CTAs, the columns past the least-loaded CTA's split in three, through a wrapped schedule.build (as
    benchmarks/with_split_tail.py does)."""
    from cupy_dash.cuda import device_tables
    monkeypatch.setenv("CUPY_DASH_FASTPATH", "0")
    monkeypatch.setattr(device_tables, "_plans", type(device_tables._plans)())
    built, split = schedule.build, []

    def build(policy="auto", **args):
        plan = built(policy, **args)
        if not args.get("causal") and policy not in schedule.PORTABLE_POLICIES:
            plan = pieces.split_tail(plan, 3)
            split.append(plan.pieces is not None)
        return plan

    monkeypatch.setattr(schedule, "build", build)
    case = Case("bf16", 128, False, 1280, 1280, batch=1, heads=16)
    assert kernels.bwd_tile(128, False, seqlen_q=1280).block_m == 80
    data, inputs = _inputs(case)
    _poison_pool(_poison_size(*inputs))
    grads = cupy_dash.attention_backward(*inputs, schedule="shift")
    again = cupy_dash.attention_backward(*inputs, schedule="shift")
    cupy_dash.check_errors()
    assert split == [True], "the table must have been split once (then cached)"
    for name, g, g2 in zip(("dq", "dk", "dv"), grads, again):
        _assert_same_bits(name, g2, g)
        g = _host(g)
        _assert_finite(name, g)
        reference.assert_close_fa3(name, g, data[f"{name}_ref"], data[f"{name}_lowp"])


AUTO_CASES = [Case("bf16", 128, False, 2400, 2411, batch=1, heads=8),    # 30 Q tiles of 80: 152 columns, 20 split
              Case("fp16", 64, False, 3840, 3840, batch=1, heads=5)]     # 30 Q tiles of 128: 150 columns, 18 split


@pytest.mark.parametrize("case", AUTO_CASES, ids=[c.id for c in AUTO_CASES])
def test_auto_splits_long_full_masks(case, monkeypatch):
    """`auto` through the full path cuts the last wave of a long full-mask MHA backward (launchers.split_pieces,
    pieces.AUTO_MIN_M_BLOCKS): right against the float64 reference, the bits repeated; CUPY_DASH_SPLIT_COLUMNS=0
    leaves the table whole."""
    from cupy_dash.cuda import device_tables
    monkeypatch.setenv("CUPY_DASH_FASTPATH", "0")
    monkeypatch.delenv("CUPY_DASH_SPLIT_COLUMNS", raising=False)
    monkeypatch.delenv("CUPY_DASH_SPLIT_PIECES", raising=False)
    monkeypatch.setattr(device_tables, "_plans", type(device_tables._plans)())
    made, cut = [], pieces.split_for_kernel
    monkeypatch.setattr(pieces, "split_for_kernel", lambda plan, n: made.append(cut(plan, n)) or made[-1])
    data, inputs = _inputs(case)
    _poison_pool(_poison_size(*inputs))
    grads = cupy_dash.attention_backward(*inputs, schedule="auto")
    again = cupy_dash.attention_backward(*inputs, schedule="auto")
    cupy_dash.check_errors()
    assert len(made) == 1 and made[0].pieces is not None and made[0].pieces.num_pieces == 3, made
    for name, g, g2 in zip(("dq", "dk", "dv"), grads, again):
        _assert_same_bits(name, g2, g)
        g = _host(g)
        _assert_finite(name, g)
        reference.assert_close_fa3(name, g, data[f"{name}_ref"], data[f"{name}_lowp"])
    monkeypatch.setenv("CUPY_DASH_SPLIT_COLUMNS", "0")
    whole = cupy_dash.attention_backward(*inputs, schedule="auto")
    cupy_dash.check_errors()
    assert len(made) == 2 and made[1].pieces is None
    for name, g in zip(("dq", "dk", "dv"), whole):
        reference.assert_close_fa3(name, _host(g), data[f"{name}_ref"], data[f"{name}_lowp"])
