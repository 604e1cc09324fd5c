"""GPU tests of the ``fa3`` policy in L2 head sections (need an NVIDIA Hopper GPU; skipped elsewhere).

The backward passes ``schedule.l2_head_section`` to the table builders; at test sizes every head fits the L2, so
the launcher's L2 size is made small here (``launchers.l2_bytes``) to force sections of one or two KV heads. Then,
causal and right-bounded windows, fixed length (MHA, GQA) and varlen, head dims 64 / 128 / 192 / 256:

* the sectioned backward is correct against the float64 oracle with FA3's tolerance rule;
* it is bitwise equal to the unsectioned one (every head at once), and the fast path, whose plans hold the
  tables, is off so that each call builds its own;
* the sectioned tables really differ from the unsectioned ones (the test would otherwise prove nothing).
"""
from __future__ import annotations

import numpy as np
import pytest

import cupy
import cupy_dash
from cupy_dash import reference, schedule
from cupy_dash.cuda import device_tables, launchers, varlen_device
from gpu_helpers import Case, _assert_finite, _assert_same_bits, _case_data, _dev, _host, _poison_pool, _poison_size

pytestmark = pytest.mark.gpu

CASES = [Case("bf16", 64, True, 1000, 1000, batch=2, heads=4), Case("bf16", 128, True, 777, 777, batch=2, heads=4),
         Case("bf16", 192, True, 1000, 300, batch=1, heads=4), Case("bf16", 256, True, 300, 777, batch=2, heads=3),
         Case("fp16", 128, True, 1537, 1537, batch=1, heads=5)]


@pytest.fixture
def small_l2(monkeypatch):
    """Sections of ``small_l2(n)`` bytes of L2 (a function: set it per call); the fast path off; the host table
    caches emptied before and after, so that every call builds the tables its L2 size gives."""
    monkeypatch.setenv("CUPY_DASH_FASTPATH", "0")
    device_tables._plans.clear()
    varlen_device._plans.clear()
    size = {"bytes": launchers.l2_bytes(cupy.cuda.Device().id)}
    monkeypatch.setattr(launchers, "l2_bytes", lambda dev: size["bytes"])

    def set_bytes(n):
        size["bytes"] = n
    yield set_bytes
    device_tables._plans.clear()
    varlen_device._plans.clear()


def _grads(case, data, window, group=1):
    """dq, dk, dv of the ``fa3`` backward; group 1: of the exact forward (``data`` with the backward's references),
    else with every ``group``-th k / v head (GQA) and that problem's own forward."""
    do, q, k, v = (_dev(data[n]) for n in ("do", "q", "k", "v"))
    if group > 1:
        k, v = k[:, :, ::group].copy(), v[:, :, ::group].copy()
        out, lse = cupy_dash.attention_forward(q, k, v, causal=case.causal)
    else:
        out, lse = _dev(data["out_in"]), _dev(data["lse_in"])
    _poison_pool(_poison_size(do, q, k, v))
    grads = cupy_dash.attention_backward(do, q, k, v, out, lse, causal=case.causal, schedule="fa3", window=window)
    cupy_dash.check_errors()
    return grads


def _sectioned(case, group=1):
    """The launcher's head section for ``case`` with the current (patched) L2 size."""
    return launchers.head_section(case.seqlen_q, case.hdim, group, case.dv, cupy.cuda.Device().id)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_sectioned_fa3_is_correct_and_keeps_the_bits(case, small_l2):
    data = _case_data(case, backward=True)
    per_head = case.seqlen_q * (2 * (case.hdim + case.dv) + 4 * case.hdim)
    small_l2(int(per_head / schedule.L2_SECTION_SHARE) + 1)        # one KV head per section
    assert _sectioned(case) == 1 < case.batch * case.heads
    sectioned = _grads(case, data, (-1, -1))
    for name, x in zip(("dq", "dk", "dv"), sectioned):
        host = _host(x)
        _assert_finite(name, host)
        reference.assert_close_fa3(name, host, data[f"{name}_ref"], data[f"{name}_lowp"])
    small_l2(1 << 40)                                              # every head at once
    whole = _grads(case, data, (-1, -1))
    for name, a, b in zip(("dq", "dk", "dv"), sectioned, whole):
        _assert_same_bits(name, a, b)


def test_sectioned_tables_differ_and_a_window_keeps_the_bits(small_l2):
    case = Case("bf16", 128, True, 1537, 1537, batch=1, heads=6)
    data = _case_data(case, backward=True)
    results, tables = [], []
    for l2 in (2 << 20, 1 << 40):
        small_l2(l2)
        device_tables._plans.clear()
        results.append(_grads(case, data, (300, 0)))
        tables.append(next(p for p in device_tables._plans.values() if p.policy == "fa3"))
    assert tables[0].head_section < case.heads <= tables[1].head_section
    assert not np.array_equal(tables[0].visits, tables[1].visits)
    for name, a, b in zip(("dq", "dk", "dv"), *results):
        _assert_same_bits(name, a, b)


def test_gqa_and_varlen_sections_keep_the_bits(small_l2):
    case = Case("bf16", 128, True, 1000, 1000, batch=2, heads=8)
    data = _case_data(case)                                        # bits only: no float64 backward needed
    runs = []
    for l2 in (1 << 20, 1 << 40):
        small_l2(l2)
        runs.append(_grads(case, data, (-1, -1), group=2))
    for name, a, b in zip(("dq", "dk", "dv"), *runs):
        _assert_same_bits(name, a, b)
    lens = np.array([1000, 333, 1000, 64], np.int32)
    cu = np.concatenate(([0], np.cumsum(lens))).astype(np.int32)
    rng = np.random.default_rng(7)
    total, heads, d = int(cu[-1]), 4, 128
    q, k, v, do = (_dev(rng.standard_normal((total, heads, d), dtype=np.float32).astype(case.np_dtype))
                   for _ in range(4))
    cu_dev = cupy.asarray(cu)                                      # the forward reads them on the device
    out, lse = cupy_dash.attention_forward_varlen(q, k, v, cu_dev, cu_dev, int(lens.max()), int(lens.max()),
                                                  causal=True)
    runs = []
    for l2 in (1 << 20, 1 << 40):
        small_l2(l2)
        runs.append(cupy_dash.attention_backward_varlen(do, q, k, v, out, lse, cu, cu, int(lens.max()),
                                                        int(lens.max()), causal=True, schedule="fa3"))
        cupy_dash.check_errors()
    sections = sorted({key[-1] for key in varlen_device._plans})      # the plans' keys end with the section
    assert sections[0] < heads <= sections[-1]
    for name, a, b in zip(("dq", "dk", "dv"), *runs):
        _assert_finite(name, _host(a))
        _assert_same_bits(name, a, b)
