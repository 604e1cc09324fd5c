"""Numeric and boolean arguments that used to be coerced silently: the model costs of ``schedule.simulate``
and its relatives (nan / inf / negative gave a number), and ``causal`` / ``deterministic`` of the public API
and ``schedule.build`` (``causal="no"`` counted as True). CPU only: with numpy arrays every call here must
raise before reaching the device checks."""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import cupy_dash
from cupy_dash import schedule

PLAN = schedule.build("shift", seqlen_q=512, seqlen_k=512, block_m=64, block_n=128, num_heads=2, causal=False,
                      num_sms=3)
BAD_C = [-1.0, 0.0, math.nan, math.inf, -math.inf]
BAD_R = [-1.0, -1e-9, math.nan, math.inf]


def _model_calls():
    """Every public function of ``schedule`` that takes the costs c and r, as f(c=..., r=...)."""
    return {
        "simulate": lambda **kw: schedule.simulate(PLAN, **kw),
        "simulate-engine": lambda **kw: schedule.simulate(PLAN, model="engine", **kw),
        "Schedule.simulate": lambda **kw: PLAN.simulate(**kw),
        "timeline": lambda **kw: schedule.timeline(PLAN, **kw),
        "lower_bound": lambda **kw: schedule.lower_bound(PLAN, **kw),
        "critical_path": lambda **kw: schedule.critical_path("shift", n=4, m=2, **kw),
    }


@pytest.mark.parametrize("call", list(_model_calls()))
@pytest.mark.parametrize("c", BAD_C, ids=repr)
def test_bad_compute_cost_raises(call, c):
    with pytest.raises(ValueError, match=r"^c must be a finite number > 0, got "):
        _model_calls()[call](c=c, r=0.25)


@pytest.mark.parametrize("call", list(_model_calls()))
@pytest.mark.parametrize("r", BAD_R, ids=repr)
def test_bad_reduction_cost_raises(call, r):
    with pytest.raises(ValueError, match=r"^r must be a finite number >= 0, got "):
        _model_calls()[call](c=1.0, r=r)


@pytest.mark.parametrize("name, kw", [("c", dict(c="1", r=0.25)), ("r", dict(c=1.0, r=None)),
                                      ("c", dict(c=True, r=0.25))])
def test_non_number_cost_raises_type_error(name, kw):
    with pytest.raises(TypeError, match=rf"^{name} must be a real number"):
        schedule.simulate(PLAN, **kw)


def test_good_costs_still_simulate():
    free = schedule.simulate(PLAN, c=np.float32(1.0), r=0)          # r = 0: reductions cost nothing
    assert math.isfinite(free) and free >= schedule.lower_bound(PLAN, c=1, r=0) > 0
    assert schedule.simulate(PLAN, c=1, r=np.int64(1)) > free
    assert math.isfinite(schedule.timeline(PLAN, 2.0, 0.5)["makespan"])


# ------------------------------------------------------------------------------------------------ flags
def test_build_takes_only_real_bools_for_causal():
    kw = dict(seqlen_q=512, seqlen_k=512, block_m=64, block_n=128, num_heads=2, num_sms=3)
    for bad in ("no", "False", 0, 1, None, 1.0):
        with pytest.raises(TypeError, match=r"^causal must be a bool"):
            schedule.build("shift", causal=bad, **kw)
    assert schedule.build("shift", causal=np.bool_(True), **kw) is schedule.build("shift", causal=True, **kw)
    with pytest.raises(TypeError, match=r"^causal must be a bool"):
        schedule.critical_path("descending", n=4, m=2, causal="yes")


def _tensors():
    q = np.zeros((1, 64, 2, 64), ml_dtypes.bfloat16)
    lse = np.zeros((1, 2, 64), np.float32)
    return q, lse


CALLS = {
    "attention_forward": lambda q, lse, **kw: cupy_dash.attention_forward(q, q, q, **kw),
    "attention_backward": lambda q, lse, **kw: cupy_dash.attention_backward(q, q, q, q, q, lse, **kw),
    "attention": lambda q, lse, **kw: cupy_dash.attention(q, q, q, **kw),
}
FLAGS = [("attention_forward", "causal"), ("attention_backward", "causal"), ("attention_backward", "deterministic"),
         ("attention", "causal"), ("attention", "deterministic")]


@pytest.mark.parametrize("call, flag", FLAGS, ids=[f"{c}-{f}" for c, f in FLAGS])
@pytest.mark.parametrize("bad", ["no", "True", 1, 0, None, np.array([True])],
                         ids=["str-no", "str-True", "int-1", "int-0", "None", "array"])
def test_api_flags_must_be_bools(call, flag, bad):
    q, lse = _tensors()
    with pytest.raises(TypeError, match=rf"^{flag}: expected a bool \(True or False\), got "):
        CALLS[call](q, lse, **{flag: bad})


@pytest.mark.parametrize("call, flag", FLAGS, ids=[f"{c}-{f}" for c, f in FLAGS])
@pytest.mark.parametrize("good", [True, False, np.bool_(True), np.bool_(False)], ids=repr)
def test_api_flags_accept_bool_and_numpy_bool(call, flag, good):
    q, lse = _tensors()
    # numpy arrays are host memory: the flag passes and the device check is the next to object
    with pytest.raises(ValueError, match="expected a tensor on a CUDA device"):
        CALLS[call](q, lse, **{flag: good})


# ------------------------------------------------------------------------------------------------ plans
COMPACT = schedule.build_compact("shift", seqlen_q=512, seqlen_k=512, block_m=64, block_n=128, num_heads=2,
                                 causal=False, num_sms=3)
PER_VISIT_CALLS = {"simulate": schedule.simulate, "timeline": schedule.timeline,
                   "reduction_order": schedule.reduction_order}


@pytest.mark.parametrize("call", list(PER_VISIT_CALLS))
@pytest.mark.parametrize("bad, got", [("shift", r"got str 'shift' \(a policy name: build its table first, "
                                                r"schedule.build\('shift'"),
                                      (None, "got NoneType None$"), (3, "got int 3$"),
                                      (COMPACT, r"got CompactSchedule \(compact records: plan.to_schedule\(\)")],
                         ids=["policy-name", "None", "int", "compact"])
def test_per_visit_functions_name_the_plan(call, bad, got):
    """A policy name, None or compact records where a per-visit table is needed: TypeError naming ``plan`` and
    what it must be, not an AttributeError from inside."""
    with pytest.raises(TypeError, match=rf"^plan: expected a per-visit schedule table \(a Schedule from "
                                        rf"schedule.build\(\.\.\.\), .*{got}"):
        PER_VISIT_CALLS[call](bad)


def test_expand_takes_compact_records_only():
    with pytest.raises(TypeError, match=r"^plan: expected compact records \(a CompactSchedule from "
                                        r"schedule.build_compact\(\.\.\.\)\), got Schedule \(a per-visit table "
                                        r"already"):
        schedule.expand(PLAN)
    with pytest.raises(TypeError, match=r"got str 'shift' \(a policy name: .*schedule.build_compact\('shift'"):
        schedule.expand("shift")
    visits, rank, cta_start = schedule.expand(COMPACT)
    np.testing.assert_array_equal(visits, PLAN.visits)


def test_lower_bound_takes_either_table():
    assert schedule.lower_bound(COMPACT) == COMPACT.lower_bound() == schedule.lower_bound(PLAN)
    with pytest.raises(TypeError, match=r"^plan: expected a schedule table .*, got NoneType None$"):
        schedule.lower_bound(None)


# ------------------------------------------------------------------------------------------------ sizes
LONG = dict(block_m=64, block_n=128, num_heads=16, num_sms=132)


def test_build_refuses_a_per_visit_table_above_the_compact_switch(monkeypatch):
    """Above compact_device.AUTO_VISITS visits (where the backward takes compact tables) build raises ValueError
    with the table's size and build_compact, before allocating (was numpy's MemoryError)."""
    monkeypatch.delenv("CUPY_DASH_COMPACT_TABLES", raising=False)
    with pytest.raises(ValueError, match=r"^schedule.build\('auto', seqlen_q=1048576, .*causal mask\): the per-visit "
                                         r"table would hold 1073872896 visits \(21.5 GB at 20 bytes a visit\), above "
                                         r"the 16777216 visits .* Use schedule.build_compact\(\.\.\.\)"):
        schedule.build("auto", seqlen_q=1 << 20, seqlen_k=1 << 20, causal=True, **LONG)
    with pytest.raises(ValueError, match=r"would hold 17592186044416 visits .*; no table holds this problem: "
                                         r"schedule.build_compact's records number Q and KV tiles with int32"):
        schedule.build("shift", seqlen_q=1 << 40, seqlen_k=8192, causal=False, **LONG)
    with pytest.raises(ValueError, match=r"would hold at least 137438953472 visits"):     # not counted per tile
        schedule.build("fa3", seqlen_q=1 << 40, seqlen_k=1 << 40, causal=True, **LONG)


def test_build_keeps_tables_up_to_the_switch(monkeypatch):
    """Up to AUTO_VISITS visits (here: a causal problem whose full rectangle would exceed it), and at any size with
    CUPY_DASH_COMPACT_TABLES=0 (per-visit tables forced, as for the backward), build builds."""
    from cupy_dash.schedule import auto, compact, compact_device
    built = []
    monkeypatch.setattr(auto, "_build", lambda policy, *args: built.append(policy) or policy)
    monkeypatch.delenv("CUPY_DASH_COMPACT_TABLES", raising=False)
    kw = dict(seqlen_q=1 << 17, seqlen_k=1 << 17, causal=True, block_m=64, block_n=128, num_heads=15, num_sms=132)
    assert compact.num_visits(1 << 17, 1 << 17, 64, 128, 15, True, (-1, 0)) <= compact_device.AUTO_VISITS
    assert 15 * 2048 * 1024 > compact_device.AUTO_VISITS
    assert schedule.build("fa3", **kw) == "fa3"
    monkeypatch.setenv("CUPY_DASH_COMPACT_TABLES", "0")
    assert schedule.build("descending", seqlen_q=1 << 20, seqlen_k=1 << 20, causal=True, **LONG) == "descending"
    assert built == ["fa3", "descending"]
