"""The ``fa3`` policy's shortest-first rounds in L2 head sections (``head_section``): the tables equal an
independent reference of the sectioned dispatch, validate, and add every dQ tile in the same order as the
unsectioned table (so the same bits); other policies and masks without a right bound ignore the section; the size
rule (``l2_head_section``) and its argument checks. No GPU needed."""
from __future__ import annotations

import heapq

import numpy as np
import pytest

from cupy_dash import schedule

H200_L2 = 60 << 20


def reference_tables(base, section):
    """(visits, rank, cta_start) of ``base`` (an unsectioned causal ``fa3`` table) re-dispatched by hand: rounds of
    the j-th shortest column of every KV head of a section, section after section, each column to the least-loaded
    CTA (ties: lowest index), Q tiles ascending, each visit keeping its rank in ``base``."""
    rank_of = {(bh, n, m): r for (_, bh, n, m), r in zip(base.visits.tolist(), base.rank.tolist())}
    lo, hi = base.column_ranges()
    g, kv_heads, N = base.group_size, base.num_heads // base.group_size, base.num_n_blocks
    order = [(h, N - 1 - j) for first in range(0, kv_heads, section) for j in range(N)
             for h in range(first, min(first + section, kv_heads)) if hi[N - 1 - j] > lo[N - 1 - j]]
    loads, per_cta = [(0, c) for c in range(min(base.num_sms, len(order)))], [[] for _ in range(base.num_ctas)]
    for h, n in order:
        load, c = heapq.heappop(loads)
        per_cta[c].append((h, n))
        heapq.heappush(loads, (load + int(hi[n] - lo[n]) * g, c))
    visits, rank, cta_start = [], [], [0]
    for c, columns in enumerate(per_cta):
        for h, n in columns:
            for m in range(int(lo[n]), int(hi[n])):
                for i in range(g):
                    visits.append((c, h * g + i, n, m))
                    rank.append(rank_of[(h * g + i, n, m)])
        cta_start.append(len(visits))
    return np.array(visits, np.int32), np.array(rank, np.int32), np.array(cta_start, np.int64)


SHAPES = {  # (seqlen_q, seqlen_k, block_m, block_n, num_heads, group_size, num_sms, window)
    "d192-tile-4k-32heads": (4096, 4096, 96, 64, 32, 1, 132, (-1, -1)),
    "gqa3-odd-1000": (1000, 1000, 64, 128, 12, 3, 20, (-1, -1)),
    "sq-ne-sk-17ctas": (700, 1300, 64, 128, 10, 1, 17, (-1, -1)),
    "right-window": (1500, 1500, 64, 128, 6, 1, 9, (300, 0)),
}


@pytest.mark.parametrize("section", [1, 2, 3, 5])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_sectioned_tables_equal_the_reference_and_add_in_the_same_order(shape, section):
    sq, sk, bm, bn, heads, g, sms, window = SHAPES[shape]
    kw = dict(seqlen_q=sq, seqlen_k=sk, block_m=bm, block_n=bn, num_heads=heads, causal=True, num_sms=sms,
              group_size=g, window=window)
    base = schedule.build("fa3", **kw)
    plan = schedule.build("fa3", head_section=section, **kw).validate()
    visits, rank, cta_start = reference_tables(base, section)
    np.testing.assert_array_equal(plan.visits, visits)
    np.testing.assert_array_equal(plan.rank, rank)
    np.testing.assert_array_equal(plan.cta_start, cta_start)
    assert schedule.same_reduction_order(plan, base)
    records = schedule.build_compact("fa3", head_section=section, **kw).validate()
    expanded = schedule.expand(records)
    np.testing.assert_array_equal(expanded[0], plan.visits)
    np.testing.assert_array_equal(expanded[1], plan.rank)
    if section < heads // g:
        assert not np.array_equal(plan.visits, base.visits)
    assert plan.key != base.key and plan.head_section == section


def test_a_section_of_every_head_is_upstreams_order():
    kw = dict(seqlen_q=2048, seqlen_k=2048, block_m=64, block_n=128, num_heads=8, causal=True, num_sms=30)
    base = schedule.build("fa3", **kw)
    for section in (8, 100):
        np.testing.assert_array_equal(schedule.build("fa3", head_section=section, **kw).visits, base.visits)


@pytest.mark.parametrize("policy,causal", [("fa3", False), ("symmetric_shift", True), ("shift", True),
                                           ("descending", True)])
def test_the_section_changes_only_fa3_under_a_right_bound(policy, causal):
    kw = dict(seqlen_q=2048, seqlen_k=2048, block_m=64, block_n=128, num_heads=8, causal=causal, num_sms=30)
    np.testing.assert_array_equal(schedule.build(policy, head_section=2, **kw).visits,
                                  schedule.build(policy, **kw).visits)


def test_varlen_sections_keep_the_reduction_order():
    lens = [900, 300, 1700, 64]
    kw = dict(block_m=64, block_n=128, heads=6, causal=True, num_sms=24, group_size=2)
    base = schedule.build_varlen("fa3", lens, lens, **kw).validate()
    for section in (1, 2):
        plan = schedule.build_varlen("fa3", lens, lens, head_section=section, **kw).validate()
        assert plan.head_section == section
        b_visits, b_rank, _ = base.expand()
        visits, rank, _ = plan.expand()
        assert not np.array_equal(visits, b_visits)
        key = lambda v, r: sorted(zip(map(tuple, v[:, 1:].tolist()), r.tolist()))  # noqa: E731
        assert key(visits, rank) == key(b_visits, b_rank)


@pytest.mark.parametrize("tokens,head_dim,group,want", [(4096, 192, 1, 4), (16384, 192, 1, 1), (8192, 128, 1, 3),
                                                        (16384, 128, 1, 1), (2048, 128, 1, 12), (4096, 128, 4, 1),
                                                        (1 << 20, 64, 1, 1), (0, 64, 1, 49152)])
def test_l2_head_section_fills_a_share_of_the_l2(tokens, head_dim, group, want):
    assert schedule.l2_head_section(tokens, head_dim, group, H200_L2) == want


def test_l2_head_section_counts_the_value_head_dim():
    assert schedule.l2_head_section(4096, 192, 1, H200_L2, head_dim_v=128) == 4    # 5.8 MB per head
    assert schedule.l2_head_section(4096, 192, 1, H200_L2) == 4                    # 6.3 MB
    assert schedule.l2_head_section(2048, 192, 1, H200_L2, head_dim_v=128) == 8


@pytest.mark.parametrize("bad", [-1, 1.5, "2", True])
def test_head_section_is_checked(bad):
    with pytest.raises((TypeError, ValueError), match="head_section"):
        schedule.build("fa3", seqlen_q=256, seqlen_k=256, block_m=64, block_n=128, num_heads=2, causal=True,
                       num_sms=4, head_section=bad)
    with pytest.raises((TypeError, ValueError), match="head_section"):
        schedule.build_varlen("fa3", [256], [256], block_m=64, block_n=128, heads=2, causal=True, num_sms=4,
                              head_section=bad)
