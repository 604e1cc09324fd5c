"""The backward's timeline debug build (kernels_src/bwd/timeline.cuh; benchmarks/timeline.py): its stamps are
ordered as the visit runs them and it computes the same bits as the normal build. Needs a Hopper GPU."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import cupy
import cupy_dash
from cupy_dash import schedule as dash_schedule
from cupy_dash.core.api import _backward_with_plan
from cupy_dash.cuda import kernels
from cupy_dash.cuda.params import CONSTANTS
from gpu_helpers import Case, _assert_same_bits, _case_data, _dev, _host

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))
import timeline_phases as tp  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("deterministic", [True, False], ids=["det", "atomic"])
@pytest.mark.parametrize("case", [Case("bf16", 128, True, 1000, 1000, batch=2, heads=3),
                                  Case("bf16", 64, False, 777, 900, batch=1, heads=4)], ids=str)
def test_timeline_stamps_are_ordered_and_bits_unchanged(case, deterministic):
    data = _case_data(case, backward=True)
    do, q, k, v, out = (_dev(data[n]) for n in ("do", "q", "k", "v", "out_in"))
    lse = _dev(data["lse_in"])
    tile = kernels.bwd_tile(case.hdim, case.causal)
    plan = dash_schedule.build("shift", seqlen_q=case.seqlen_q, seqlen_k=case.seqlen_k, block_m=tile.block_m,
                               block_n=tile.block_n, num_heads=case.batch * case.heads, causal=case.causal,
                               num_sms=8)
    common = dict(plan=plan, causal=case.causal, deterministic=deterministic)
    plain = [_host(x) for x in _backward_with_plan(do, q, k, v, out, lse, **common)]
    with pytest.raises(ValueError, match="timeline"):
        _backward_with_plan(do, q, k, v, out, lse, timeline=cupy.zeros((plan.num_visits, 4), cupy.int64), **common)
    stamps = cupy.zeros((plan.num_visits, CONSTANTS.kTimelineCols), dtype=cupy.int64)
    stamped = [_host(x) for x in _backward_with_plan(do, q, k, v, out, lse, timeline=stamps, **common)]
    cupy_dash.check_errors()
    for name, a, b in zip(("dq", "dk", "dv"), plain, stamped):
        if name == "dq" and not deterministic:       # atomic adds: the order of the dQ partial sums varies
            np.testing.assert_allclose(a.astype(np.float32), b.astype(np.float32), rtol=1e-2, atol=1e-2)
        else:
            _assert_same_bits(name, a, b)
    t = stamps.get()
    assert (t[:, 0] > 0).all() and (t[:, 1] >= t[:, 0]).all()        # %globaltimer: start, dQ ready
    for wg in (0, 1):
        w = tp.wg_stamps(t, wg)[:, :tp.SM]
        assert (w > 0).all() and (np.diff(w, axis=1) >= 0).all(), f"warpgroup {wg}: stamps out of order"
    sm = tp.wg_stamps(t, 0)[:, tp.SM]
    assert ((sm >= 0) & (sm < cupy.cuda.Device().attributes["MultiProcessorCount"])).all()
    starts = np.asarray(plan.cta_start)
    for a, b in zip(starts[:-1], starts[1:]):                       # one CTA, one SM
        assert len(set(sm[a:b].tolist())) <= 1
    rep = tp.phase_report(t, starts)
    assert 0.0 <= rep["tensor_idle"] < 1.0 and rep["cycles"] > 0
