"""Compact schedules of packed variable-length batches (cupy_dash.schedule.varlen): the O(columns) validator
accepts every built table, the expanded table is checked independently (visible tiles from an element-level
mask, rank permutations, deadlock by an event simulation), equal lengths give build_compact's tables for B * H
heads, and corrupted records are rejected."""
import copy
import itertools
import time

import numpy as np
import pytest

from cupy_dash import schedule

POLICIES = ("fa3", "descending", "shift", "symmetric_shift")
BATCHES = [([1, 300, 0, 129, 64], [1, 300, 0, 129, 64]),              # 1, not multiples of the tiles, empty
           ([17, 0, 500, 1], [1000, 5, 200, 1]),                        # Sq != Sk, an empty query side
           ([128, 256, 63], [128, 256, 63])]


def windows(causal):
    return sorted({(left, 0 if causal else right) for left, right in [(-1, -1), (100, -1), (300, 50), (0, 0)]})


def visible_tiles(sq, sk, bm, bn, causal, window):
    """{(n, m)} of one sequence from the element-level mask (bottom-right aligned, FlashAttention's windows)."""
    if sq == 0 or sk == 0:
        return set()
    left, right = window
    right = 0 if causal else right
    i, j = np.arange(sq)[:, None], np.arange(sk)[None, :]
    see = np.ones((sq, sk), dtype=bool)
    if right >= 0:
        see &= j <= i + sk - sq + right
    if left >= 0:
        see &= j >= i + sk - sq - left
    m, n = np.nonzero(see)
    return set(zip((n // bn).tolist(), (m // bm).tolist()))


def check_expanded(plan, sq, sk, bm, bn, heads, causal, window):
    visits, rank, cta_start = plan.expand()
    assert cta_start[0] == 0 and cta_start[-1] == len(visits) and (np.diff(cta_start) >= 0).all()
    for c in range(plan.num_ctas):
        assert (visits[cta_start[c]:cta_start[c + 1], 0] == c).all()
    got = {}
    for _, bh, n, m in visits.tolist():
        got.setdefault(bh, []).append((n, m))
    for b in range(len(sq)):
        want = visible_tiles(sq[b], sk[b], bm, bn, causal, window)
        for h in range(heads):
            tiles = got.pop(b * heads + h, [])
            assert len(tiles) == len(set(tiles)) and set(tiles) == want, (b, h)
    assert not got
    tiles = {}
    for (_, bh, _, m), r in zip(visits.tolist(), rank.tolist()):
        tiles.setdefault((bh, m), []).append(r)
    assert all(sorted(r) == list(range(len(r))) for r in tiles.values())
    # deadlock: a visit runs when its tile has taken every lower rank; an event queue over the CTAs
    done, pos = {}, cta_start[:-1].copy()
    waiting, ready = {}, list(range(plan.num_ctas))
    while ready:
        c = ready.pop()
        while pos[c] < cta_start[c + 1]:
            _, bh, _, m = visits[pos[c]]
            if done.get((bh, m), 0) != rank[pos[c]]:
                waiting.setdefault((bh, m, rank[pos[c]]), []).append(c)
                break
            done[bh, m] = done.get((bh, m), 0) + 1
            pos[c] += 1
            ready.extend(waiting.pop((bh, m, done[bh, m]), []))
    assert (pos == cta_start[1:]).all(), "deadlock"


@pytest.mark.parametrize("policy", POLICIES + ("auto",))
def test_mixed_batches_are_valid(policy):
    for (sq, sk), causal, g, sms in itertools.product(BATCHES, (False, True), (1, 2, 8), (1, 7, 132)):
        for window in windows(causal):
            kw = dict(block_m=64, block_n=128, heads=2 * g, causal=causal, num_sms=sms, group_size=g, window=window)
            plan = schedule.build_varlen(policy, sq, sk, **kw).validate()
            assert plan.num_ctas <= sms and plan.num_columns == int(np.diff(plan.seg_col_start).sum())
            if g <= 2 and sms != 132:
                check_expanded(plan, sq, sk, 64, 128, 2 * g, causal, window)


def test_random_batches_and_tiles():
    rng = np.random.default_rng(7)
    for _ in range(60):
        B = int(rng.integers(1, 6))
        sq = rng.integers(0, 400, B)
        sk = sq if rng.random() < 0.5 else rng.integers(0, 400, B)
        causal = bool(rng.random() < 0.5)
        window = (int(rng.integers(-1, 200)), 0 if causal else int(rng.integers(-1, 200)))
        bm, bn = int(rng.choice([16, 32, 64])), int(rng.choice([16, 64, 128]))
        for policy in POLICIES:
            plan = schedule.build_varlen(policy, sq, sk, block_m=bm, block_n=bn, heads=2, causal=causal,
                                         num_sms=int(rng.integers(1, 40)), group_size=int(rng.choice([1, 2])),
                                         window=window).validate()
            check_expanded(plan, sq, sk, bm, bn, 2, causal, window)


@pytest.mark.parametrize("policy", POLICIES)
def test_equal_lengths_are_build_compact(policy):
    for (s_q, s_k), causal, g, sms in itertools.product([(1, 1), (300, 1000), (1000, 300), (777, 777)],
                                                        (False, True), (1, 2, 8), (1, 7, 132)):
        for window in windows(causal):
            B, H = 3, 2 * g
            kw = dict(block_m=64, block_n=128, causal=causal, num_sms=sms, group_size=g, window=window)
            cplan = schedule.build_compact(policy, seqlen_q=s_q, seqlen_k=s_k, num_heads=B * H, **kw)
            vplan = schedule.build_varlen(policy, [s_q] * B, [s_k] * B, heads=H, **kw)
            for name in ("records", "cta_columns", "cta_col_start", "tie_sign", "rank_rule", "num_ctas"):
                np.testing.assert_array_equal(getattr(vplan, name), getattr(cplan, name), err_msg=name)
            for a, b in zip(vplan.expand(), schedule.expand(cplan)):
                np.testing.assert_array_equal(a, b)
            assert_oracles_agree(policy, vplan, s_q, s_k, B * H, kw)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("seqlen, causal, g, sms, B, H", [(262144, True, 1, 132, 1, 4), (131072, False, 2, 1000, 2, 4),
                                                           (65536, True, 8, 700, 1, 16), (4097, True, 1, 3, 5, 2)],
                         ids=["256k-causal-132", "128k-full-1000ctas", "64k-causal-g8-700ctas", "4097-3ctas"])
def test_long_equal_lengths_are_build_compact(policy, seqlen, causal, g, sms, B, H):
    """The varlen list scheduling (a bucket queue: a ring of loads, bitsets of CTAs) against the fixed-length
    build's heap where the ring wraps many times (long columns) and the bitsets span several words (> 64 CTAs)."""
    kw = dict(block_m=64, block_n=128, causal=causal, num_sms=sms, group_size=g, window=(-1, -1))
    cplan = schedule.build_compact(policy, seqlen_q=seqlen, seqlen_k=seqlen, num_heads=B * H, **kw)
    vplan = schedule.build_varlen(policy, [seqlen] * B, [seqlen] * B, heads=H, **kw)
    for name in ("records", "cta_columns", "cta_col_start", "tie_sign", "rank_rule", "num_ctas"):
        np.testing.assert_array_equal(getattr(vplan, name), getattr(cplan, name), err_msg=name)
    assert_oracles_agree(policy, vplan, seqlen, seqlen, B * H, kw, table=False)


def assert_oracles_agree(policy, vplan, s_q, s_k, num_heads, kw, table=True):
    """vplan (equal lengths) against the direct fixed-length builders: the column records of num_heads heads and,
    with ``table``, their per-visit table."""
    from cupy_dash.schedule import _schedule, testing
    g, window = kw["group_size"], schedule.canonical_window(kw["window"], s_q, s_k, kw["causal"])
    args = (s_q, s_k, kw["block_m"], kw["block_n"])
    records, cta_columns, cta_col_start, _, _, meta = testing.build_columns(
        _schedule.POLICY_CODES[policy], *args, num_heads // g, kw["causal"], kw["num_sms"], *window)
    for name, want in (("records", records), ("cta_columns", cta_columns), ("cta_col_start", cta_col_start)):
        np.testing.assert_array_equal(getattr(vplan, name), want, err_msg=f"{name} against the oracle")
    assert (vplan.tie_sign, vplan.rank_rule, vplan.num_ctas) == tuple(meta[k] for k in ("tie_sign", "rank_rule",
                                                                                         "num_ctas"))
    if table:
        want = testing.build_table(_schedule.POLICY_CODES[policy], *args, num_heads, kw["causal"], kw["num_sms"],
                                   g, *window)
        for a, b in zip(vplan.expand(), want):
            np.testing.assert_array_equal(a, b, err_msg="expansion against the oracle table")


def test_auto_with_equal_lengths_is_the_column_model_choice():
    from cupy_dash.schedule import compact
    for causal in (False, True):
        args = (2048, 2048, 64, 128, 32, causal, 132, 1, (-1, -1))
        plan = schedule.build_varlen("auto", [2048] * 4, [2048] * 4, block_m=64, block_n=128, heads=8,
                                     causal=causal, num_sms=132)
        assert plan.policy == compact.column_model_choice(*args)


def test_longest_sequence_dispatched_first():
    plan = schedule.build_varlen("shift", [128, 4096, 512], [128, 4096, 512], block_m=64, block_n=128, heads=1,
                                 causal=False, num_sms=4)
    first = plan.records[plan.cta_columns[plan.cta_col_start[:-1]]]
    assert (first[:, 6] == 1).all() and (first[:, 0] == 0).all()


def plan_for_corruption(policy="symmetric_shift"):
    return schedule.build_varlen(policy, [300, 1, 0, 700], [500, 1, 9, 700], block_m=64, block_n=128, heads=2,
                                 causal=True, num_sms=7)


def check(plan, records=None, cta_columns=None, cta_col_start=None, seg_col_start=None, tie_sign=None,
          rank_rule=None):
    from cupy_dash.schedule import _varlen_sched
    pick = lambda a, b: b if a is None else a  # noqa: E731
    _varlen_sched.check_varlen(pick(records, plan.records), pick(cta_columns, plan.cta_columns),
                               pick(cta_col_start, plan.cta_col_start), pick(seg_col_start, plan.seg_col_start),
                               plan.seqlens_q, plan.seqlens_k, plan.windows, plan.block_m, plan.block_n,
                               plan.causal, plan.num_kv_heads, pick(tie_sign, plan.tie_sign),
                               pick(rank_rule, plan.rank_rule))


def test_corrupted_records_are_rejected():
    plan = plan_for_corruption()
    check(plan)
    accepted = 0
    for field, delta in itertools.product(range(8), (1, -1, 5)):
        for i in (0, plan.num_columns // 2, plan.num_columns - 1):
            rec = plan.records.copy()
            rec[i, field] += delta
            if field in (3, 4):
                # split / rot: another walk of the same range is another valid table (ranks are derived);
                # whatever the checker accepts must pass the independent check of the expanded table
                try:
                    check(plan, records=rec)
                except ValueError:
                    continue
                other = copy.copy(plan)
                other.records = rec
                check_expanded(other, plan.seqlens_q, plan.seqlens_k, 64, 128, 2, True, (-1, 0))
                accepted += 1
                continue
            with pytest.raises(ValueError):
                check(plan, records=rec)
    assert 0 < accepted < 18
    cols = plan.cta_columns.copy()
    cols[[0, 1]] = cols[[1, 0]]
    with pytest.raises(ValueError):
        check(plan, cta_columns=cols)
    seg = plan.seg_col_start.copy()
    seg[1] += 1
    with pytest.raises(ValueError):
        check(plan, seg_col_start=seg)
    with pytest.raises(ValueError):
        check(plan, records=plan.records[:-1], cta_columns=plan.cta_columns[:-1])


def test_wrong_rank_rule_is_rejected():
    for policy, wrong in (("fa3", 1), ("descending", 2)):
        plan = plan_for_corruption(policy)
        check(plan)
        with pytest.raises(ValueError, match="rank rule"):
            check(plan, rank_rule=wrong)
    with pytest.raises(ValueError, match="monotone"):
        check(plan_for_corruption("shift"), rank_rule=1)


def test_argument_checks():
    kw = dict(block_m=64, block_n=128, heads=4, causal=True, num_sms=7)
    with pytest.raises(ValueError):
        schedule.build_varlen("shift", [1, 2], [1], **kw)
    with pytest.raises(ValueError):
        schedule.build_varlen("shift", [-1], [1], **kw)
    with pytest.raises(ValueError):
        schedule.build_varlen("shift", [8], [8], **dict(kw, group_size=3))
    plan = schedule.build_varlen("fa3", [0, 0], [5, 0], **kw).validate()
    assert plan.num_columns == 0 and plan.num_ctas == 0 and len(plan.expand()[0]) == 0


def test_build_is_o_columns():
    rng = np.random.default_rng(0)
    cuts = np.sort(rng.choice(np.arange(1, 16384), 63, replace=False))
    lens = np.diff(np.concatenate([[0], cuts, [16384]]))
    schedule.build_varlen("shift", lens, lens, block_m=64, block_n=128, heads=16, causal=True, num_sms=132)
    t0 = time.thread_time()         # CPU time: other jobs on the machine do not count
    plan = schedule.build_varlen("shift", lens, lens, block_m=64, block_n=128, heads=16, causal=True, num_sms=132)
    assert time.thread_time() - t0 < 0.05 and plan.num_columns < 16 * (16384 // 128 + 64)
