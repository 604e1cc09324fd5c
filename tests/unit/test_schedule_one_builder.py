"""The runtime builder against the oracles (cupy_dash.schedule.testing): schedule.build_compact's records (built by
the varlen builder as one sequence of num_heads query heads) equal, field by field, the records of the direct
fixed-length builder (testing.build_columns), with the same dispatch order, loads, header and scan bounds, over a
grid and random problems (policies, windows, causal, group sizes, CTA counts, odd lengths, seqlen_q != seqlen_k);
schedule.build's per-visit tables equal the direct per-visit builder's (testing.build_table)."""
import itertools

import numpy as np
import pytest

from cupy_dash import schedule
from cupy_dash.schedule import _compact, _schedule, testing
from varlen_cases import random_fixed_problem

POLICIES = ("fa3", "descending", "shift", "symmetric_shift")


def windows(causal):
    both = [(-1, -1), (100, -1), (300, 50), (0, 0), (63, 64), (1000, 0), (-1, 7)]
    return sorted({(left, 0 if causal else right) for left, right in both})


def assert_same_records(policy, sq, sk, bm, bn, heads, g, causal, sms, window):
    kw = dict(seqlen_q=sq, seqlen_k=sk, block_m=bm, block_n=bn, num_heads=heads, group_size=g, causal=causal,
              num_sms=sms, window=window)
    plan = schedule.build_compact(policy, **kw)
    left, right = plan.window
    records, cta_columns, cta_col_start, order, loads, meta = testing.build_columns(
        _schedule.POLICY_CODES[policy], sq, sk, bm, bn, heads // g, causal, sms, left, right)
    what = f"{policy} {kw}"
    for name, want in (("records", records), ("cta_columns", cta_columns), ("cta_col_start", cta_col_start),
                       ("_dispatch_order", order), ("loads", loads)):
        got = getattr(plan, name)
        assert got.dtype == want.dtype, (name, got.dtype, want.dtype, what)
        np.testing.assert_array_equal(got, want, err_msg=f"{name} {what}")
    got_meta = {"M": plan.num_m_blocks, "N": plan.num_n_blocks, "n_first": plan.n_first,
                "NC": plan.columns_per_head, "num_ctas": plan.num_ctas, "tie_sign": plan.tie_sign,
                "rank_rule": plan.rank_rule}
    assert got_meta == meta, what
    assert all(type(v) is int for v in got_meta.values()), got_meta
    np.testing.assert_array_equal(plan.scan_bounds, _compact.scan_bounds(records, order, meta["NC"]), err_msg=what)
    return plan


@pytest.mark.parametrize("policy", POLICIES)
def test_records_equal_the_direct_builder_on_a_grid(policy):
    checked = 0
    lengths = [(1, 1), (17, 1000), (1000, 17), (777, 777), (2047, 1500), (4097, 4097)]
    tiles = [(64, 128), (80, 128), (128, 64)]
    for (sq, sk), (bm, bn), causal, g, sms in itertools.product(lengths, tiles, (False, True), (1, 2, 8),
                                                                (1, 7, 132, 1000)):
        for window in windows(causal):
            assert_same_records(policy, sq, sk, bm, bn, 3 * g, g, causal, sms, window)
            checked += 1
    assert checked == 6 * 3 * 3 * 4 * (len(windows(False)) + len(windows(True)))


def test_records_equal_the_direct_builder_randomized():
    rng = np.random.default_rng(20261202)
    for _ in range(1500):
        g = int(rng.choice([1, 2, 3, 4, 8]))
        heads = g * int(rng.integers(1, 13))               # any multiple of g, B * H or not
        bm, bn = int(rng.choice([16, 64, 80, 128])), int(rng.choice([32, 64, 96, 128]))
        sq, sk = (int(x) for x in rng.integers(1, 6000, size=2))
        if rng.random() < 0.3:
            sk = sq
        causal = bool(rng.integers(2))
        left = int(rng.choice([-1, rng.integers(0, 6000)]))
        right = 0 if causal else int(rng.choice([-1, rng.integers(0, 6000)]))
        sms = int(rng.choice([1, 2, 3, 7, 33, 64, 65, 114, 132, 264, 1000]))
        assert_same_records(str(rng.choice(POLICIES)), sq, sk, bm, bn, heads, g, causal, sms, (left, right))


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("seqlen, causal, heads, g, sms", [(131072, True, 32, 1, 132), (65536, False, 12, 4, 700),
                                                           (65537, True, 5, 5, 3)], ids=["128k-causal", "64k-full-g4",
                                                                                         "odd-mqa-3ctas"])
def test_long_records_equal_the_direct_builder(policy, seqlen, causal, heads, g, sms):
    assert_same_records(policy, seqlen, seqlen, 64, 128, heads, g, causal, sms, (-1, -1))


def test_tables_equal_the_direct_per_visit_builder_randomized():
    """schedule.build (the records expanded) against the direct per-visit builder, auto included; and
    schedule.expand (the O(visits) sweep) against the sort-based expansion of the same records."""
    from cupy_dash.schedule import auto, compact, per_visit
    rng = np.random.default_rng(4)
    for i in range(400):
        policy, sq, sk, bm, bn, heads, causal, sms, g, window = random_fixed_problem(rng, POLICIES + ("auto",))
        args = per_visit._checked_args(policy, sq, sk, bm, bn, heads, causal, sms, g, window)
        plan = auto.build(policy, seqlen_q=sq, seqlen_k=sk, block_m=bm, block_n=bn, num_heads=heads, causal=causal,
                          num_sms=sms, group_size=g, window=window)
        concrete = auto._auto_choice(*args) if policy == "auto" else policy
        assert plan.policy == concrete and plan.key == (concrete,) + args
        want = testing.build_table(_schedule.POLICY_CODES[concrete], *args[:-2], *args[-2])
        cplan = compact._build_compact(concrete, *args)
        sorted_expansion = testing.expand_sorted(cplan.records, cplan.cta_columns, cplan.cta_col_start,
                                                 cplan.num_m_blocks, cplan.n_first, cplan.columns_per_head,
                                                 cplan.group_size, cplan.tie_sign)
        got_arrays = (plan.visits, plan.rank, plan.cta_start)
        for name, got, oracle, by_sort in zip(("visits", "rank", "cta_start"), got_arrays, want, sorted_expansion):
            assert got.dtype == oracle.dtype == by_sort.dtype, name
            np.testing.assert_array_equal(got, oracle, err_msg=f"{name} {plan!r}")
            np.testing.assert_array_equal(by_sort, oracle, err_msg=f"{name} {plan!r}")
        if i % 20 == 0:
            plan.validate()
