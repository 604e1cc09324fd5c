"""The per-step paths of varlen schedules against slow oracles: ``build_varlen("auto")`` (which models the
candidates from their loads alone and builds only its choice) picks what building every candidate and
comparing their column models picks, and the Cython ``expand`` (a sweep over the steps, no sort) equals the
numpy expansion with a lexsort that it replaced, on random length mixes, windows, GQA groups and CTA counts."""
import copy
import itertools
import time

import numpy as np
import pytest

from cupy_dash import schedule
from cupy_dash.schedule.varlen import RANK_ASC_N
from varlen_cases import random_problem

POLICIES = ("fa3", "descending", "shift", "symmetric_shift")


def expand_numpy(plan):
    """The numpy expansion (the module's before the Cython sweep): visits int32 (V, 4), rank int32 (V,),
    cta_start int64 (num_ctas + 1,); every dQ tile (seg, m) lexsorts its visits by (step + s, tie_sign * n)."""
    rec = plan.records.astype(np.int64)
    g = plan.group_size
    length = rec[:, 2] - rec[:, 1]
    rid = np.repeat(np.arange(len(rec)), length)
    s = np.arange(len(rid)) - np.repeat(np.cumsum(length) - length, length)
    step, lo, hi, split, rot, cta, seg, n = (rec[rid, f] for f in range(8))
    width = hi - split                                   # > 0 (split = -1 included)
    m = np.where(split < 0, hi - 1 - s, np.where(s < width, split + (s + rot) % width, lo + s - width))
    key = step + s
    order = np.lexsort((plan.tie_sign * n, key, m, seg))
    first = np.ones(len(order), dtype=bool)
    first[1:] = (seg[order][1:] != seg[order][:-1]) | (m[order][1:] != m[order][:-1])
    starts = np.maximum.accumulate(np.where(first, np.arange(len(order)), 0))
    rank1 = np.empty(len(order), dtype=np.int64)
    rank1[order] = np.arange(len(order)) - starts
    cta_start1 = np.zeros(plan.num_ctas + 1, dtype=np.int64)
    np.cumsum(plan.loads, out=cta_start1[1:])
    row = (cta_start1[cta] + key) * g
    visits = np.empty((len(rid) * g, 4), dtype=np.int32)
    rank = np.empty(len(rid) * g, dtype=np.int32)
    for j in range(g):
        visits[row + j] = np.stack([cta, seg * g + j, n, m], axis=1)
        rank[row + j] = rank1
    return visits, rank, cta_start1 * g


def auto_by_building(sq, sk, **kw):
    """``auto`` as it was: build every candidate, model each (engine costs) from its records, the first within
    the tolerance of the best among those whose column model applies."""
    c, r = schedule.AUTO_COSTS
    times = {}
    for policy in schedule.AUTO_CANDIDATES:
        plan = schedule.build_varlen(policy, sq, sk, **kw)
        if kw["group_size"] > 1 and len(plan.records) <= schedule.AUTO_FEW_GROUPED * kw["num_sms"]:
            return "descending"                      # the measured override for few grouped columns
        lengths = (plan.records[:, 2] - plan.records[:, 1]).astype(np.int64)
        if policy not in ("symmetric_shift", "fa3") and len(lengths) and not (lengths == lengths[0]).all():
            continue
        load = int(plan.loads.max(initial=0)) * plan.group_size
        widest = int(np.diff(plan.seg_col_start).max(initial=0))
        stairs = (min(widest, plan.num_ctas) - 1) * r if plan.rank_rule == RANK_ASC_N else 0.0
        times[policy] = load * max(c, r) + min(c, r) + stairs
    best = min(times.values())
    return next(p for p in schedule.AUTO_CANDIDATES if p in times and times[p] <= best * (1 + schedule.AUTO_TOLERANCE))


def test_auto_picks_what_building_every_candidate_picks():
    rng = np.random.default_rng(11)
    picked = set()
    for _ in range(400):
        sq, sk, kw = random_problem(rng)
        want = auto_by_building(sq, sk, **kw)
        plan = schedule.build_varlen("auto", sq, sk, **kw)
        assert plan.policy == want, (sq.tolist(), sk.tolist(), kw)
        ref = schedule.build_varlen(want, sq, sk, **kw)
        for name in ("records", "cta_columns", "cta_col_start", "seg_col_start", "loads"):
            np.testing.assert_array_equal(getattr(plan, name), getattr(ref, name), err_msg=name)
        picked.add(want)
    assert {"symmetric_shift", "fa3", "shift"} <= picked


@pytest.mark.parametrize("tokens,batch", [(16384, 1), (16384, 4), (16384, 16), (16384, 64)])
def test_auto_on_the_benchmark_batches(tokens, batch):
    rng = np.random.default_rng(batch)
    cuts = np.sort(rng.choice(np.arange(1, tokens), batch - 1, replace=False))
    lens = np.diff(np.concatenate([[0], cuts, [tokens]]))
    for causal, g in itertools.product((True, False), (1, 4)):
        kw = dict(block_m=64, block_n=128, heads=16, causal=causal, num_sms=132, group_size=g)
        assert schedule.build_varlen("auto", lens, lens, **kw).policy == auto_by_building(lens, lens, **kw)


def test_auto_stops_at_a_first_candidate_near_the_floor():
    """16 causal sequences of a 16k-token batch on 132 CTAs: symmetric_shift's busiest CTA is within the
    tolerance of the mean load, which no table beats, so auto dispatches it alone (one dispatch, not three)
    and still picks what building every candidate picks; one 16k sequence is not balanced enough for that."""
    rng = np.random.default_rng(5)
    cuts = np.sort(rng.choice(np.arange(1, 16384), 15, replace=False))
    lens = np.diff(np.concatenate([[0], cuts, [16384]]))
    kw = dict(block_m=128, block_n=128, heads=16, causal=True, num_sms=132, group_size=1)
    plan = schedule.build_varlen("auto", lens, lens, **kw)
    assert plan.auto_dispatched == ("symmetric_shift",)
    assert plan.policy == auto_by_building(lens, lens, **kw) == "symmetric_shift"
    one = schedule.build_varlen("auto", [16384], [16384], **kw)
    assert one.auto_dispatched == ("symmetric_shift", "fa3")     # unequal columns: the model leaves out the others
    assert one.policy == auto_by_building([16384], [16384], **kw)


def test_auto_on_batches_without_columns():
    for sq, sk in (([0], [0]), ([0, 0], [5, 0]), ([7, 0], [0, 9])):
        for causal in (True, False):
            kw = dict(block_m=64, block_n=128, heads=4, causal=causal, num_sms=7, group_size=2)
            plan = schedule.build_varlen("auto", sq, sk, **kw)
            assert plan.num_columns == 0 and plan.policy == auto_by_building(sq, sk, **kw)


def assert_same_expansion(plan):
    got, want = plan.expand(), expand_numpy(plan)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)


def test_expand_equals_the_numpy_expansion():
    rng = np.random.default_rng(5)
    for _ in range(120):
        sq, sk, kw = random_problem(rng)
        for policy in POLICIES:
            assert_same_expansion(schedule.build_varlen(policy, sq, sk, **kw))


def test_expand_of_other_valid_walks():
    """Records whose split / rot the checker still accepts (other walks of the same ranges; ranks derived)."""
    plan = schedule.build_varlen("symmetric_shift", [300, 1, 0, 700], [500, 1, 9, 700], block_m=64, block_n=128,
                                 heads=2, causal=True, num_sms=7)
    compared = 0
    for field, delta, i in itertools.product((3, 4), (1, -1, 5), range(plan.num_columns)):
        rec = plan.records.copy()
        rec[i, field] += delta
        other = copy.copy(plan)
        other.records = rec
        try:
            other.validate()
        except ValueError:
            continue
        assert_same_expansion(other)
        compared += 1
    assert compared > 10


def test_expand_rejects_records_outside_the_batch():
    plan = schedule.build_varlen("shift", [300, 700], [300, 700], block_m=64, block_n=128, heads=2, causal=False,
                                 num_sms=7)
    for field, value in ((6, 99), (6, -1), (2, 1000), (1, -1), (3, 50), (4, 77)):
        other = copy.copy(plan)
        other.records = plan.records.copy()
        other.records[0, field] = value
        with pytest.raises(ValueError):
            other.expand()
    other = copy.copy(plan)
    other.cta_columns = plan.cta_columns.copy()
    other.cta_columns[0] = plan.num_columns
    with pytest.raises(ValueError):
        other.expand()


def test_expand_is_o_visits():
    plan = schedule.build_varlen("symmetric_shift", [16384], [16384], block_m=64, block_n=128, heads=16,
                                 causal=True, num_sms=132)
    assert plan.num_visits == 264192
    best = float("inf")
    for _ in range(5):
        t0 = time.thread_time()     # CPU time: other jobs on the machine do not count
        plan.expand()
        best = min(best, time.thread_time() - t0)
    assert best < 0.01          # 0.7 ms on the 2-core CPU box; the numpy lexsort took 40 ms


# sha256 of the tables below as commit 3b57d5c (2026-12-01, list scheduling by a tournament tree) builds them, with
# the shift and symmetric_shift rotations spread over their rectangles (round 41, 2026-12-07: the only change of
# their records)
_TABLES_DIGEST = "6d1525e8df2c309e3c90be177f75db8b3acfa64d58d6b8aec0c69866948766a6"


def test_tables_are_those_of_the_previous_version():
    """The varlen tables (records, CTA lists, policy, CTA count, rank rule) of 200 random packed batches, auto and
    every policy, hash to what the build of 3b57d5c gave: a faster build must not change them, since the
    schedule fixes the order in which dQ partial sums add, i.e. the bits a user's job reproduces after an
    upgrade. A deliberate schedule change updates the digest in the commit that makes it, saying why."""
    import hashlib
    rng = np.random.default_rng(2026)
    h = hashlib.sha256()
    for _ in range(200):
        sq, sk, kw = random_problem(rng)
        for policy in ("auto",) + POLICIES:
            plan = schedule.build_varlen(policy, sq, sk, **kw)
            h.update(str((plan.policy, int(plan.num_ctas), int(plan.tie_sign), int(plan.rank_rule))).encode())
            for a in (plan.records, plan.cta_columns, plan.cta_col_start):
                h.update(np.ascontiguousarray(a).tobytes())
    assert h.hexdigest() == _TABLES_DIGEST
