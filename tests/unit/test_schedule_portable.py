"""Portable bits: which policies add in the same orders (so give the same dq/dk/dv bits) whatever the number of
CTAs the table is built for — 114 on an H100 PCIe, 132 on an H100 SXM or H200 — checked on the tables, no GPU
needed (tests/gpu/test_gpu_portable.py runs the backward)."""
from __future__ import annotations

import numpy as np
import pytest

from cupy_dash import schedule

SHAPES = [  # (seqlen_q, seqlen_k, block_m, block_n, num_heads, causal, group_size)
    (1024, 1024, 64, 128, 16, False, 1), (1024, 1024, 64, 128, 16, True, 1),
    (4096, 4096, 128, 128, 32, True, 1), (8192, 8192, 64, 128, 16, False, 1),
    (1000, 3000, 64, 128, 8, True, 1), (3000, 1000, 128, 128, 8, False, 1),
    (2048, 2048, 64, 128, 32, True, 4), (777, 1500, 128, 128, 16, False, 16),
]
SMS = (1, 7, 114, 132, 264)


def _shape_id(s):
    sq, sk, bm, bn, h, causal, g = s
    return f"sq{sq}-sk{sk}-{bm}x{bn}-h{h}-{'causal' if causal else 'full'}-g{g}"


def _build(policy, shape, sms):
    sq, sk, bm, bn, h, causal, g = shape
    return schedule.build(policy, seqlen_q=sq, seqlen_k=sk, block_m=bm, block_n=bn, num_heads=h, causal=causal,
                          num_sms=sms, group_size=g)


@pytest.mark.parametrize("shape", SHAPES, ids=_shape_id)
@pytest.mark.parametrize("policy", schedule.PORTABLE_POLICIES)
def test_portable_policies_add_in_the_same_order_on_any_cta_count(policy, shape):
    ref = _build(policy, shape, 132)
    for sms in SMS:
        plan = _build(policy, shape, sms)
        assert plan.num_ctas <= sms and schedule.same_reduction_order(plan, ref), \
            f"{policy}: the order on {sms} CTAs differs from the order on 132"


@pytest.mark.parametrize("policy", ["shift", "symmetric_shift", "auto"])
def test_other_policies_follow_the_cta_count(policy):
    """Not portable, as documented: on the paper's shapes the 114- and 132-CTA tables add in different orders."""
    differ = [s for s in SHAPES[:4] if not schedule.same_reduction_order(_build(policy, s, 114),
                                                                       _build(policy, s, 132))]
    assert differ, f"{policy} now looks portable on every shape: update PORTABLE_POLICIES and the docs"


def test_reduction_order_sees_a_swapped_rank_and_a_reordered_column():
    plan = _build("descending", SHAPES[1], 132)
    cols, dq = schedule.reduction_order(plan)
    assert cols.shape == (plan.num_visits, 4) and dq.shape == (plan.num_visits, 3)

    class Table:
        pass

    swapped = Table()
    swapped.visits, swapped.cta_start, swapped.group_size = plan.visits, plan.cta_start, 1
    rank = plan.rank.copy()
    v = plan.visits
    # two partials of one dQ tile (same head and m_block) exchange their ranks
    i, j = (int(x) for x in np.flatnonzero((v[:, 1] == v[0, 1]) & (v[:, 3] == v[0, 3]))[:2])
    rank[i], rank[j] = rank[j], rank[i]
    swapped.rank = rank
    assert not schedule.same_reduction_order(plan, swapped)
    reordered = Table()
    reordered.rank, reordered.cta_start, reordered.group_size = plan.rank, plan.cta_start, 1
    visits = plan.visits.copy()
    visits[[0, 1]] = visits[[1, 0]]                  # the first CTA's first two visits (one column) swap
    reordered.visits = visits
    assert not schedule.same_reduction_order(plan, reordered)
