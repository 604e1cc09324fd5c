"""The per-step paths of varlen schedules against slow oracles: ``build_varlen("auto")`` (which models the
candidates from their loads alone and builds only its choice) picks what building every candidate and
comparing their column models picks, on random length mixes, windows, GQA groups and CTA counts."""
import itertools

import numpy as np
import pytest

from cupy_dash import schedule
from cupy_dash.varlen_schedule import RANK_ASC_N


def auto_by_building(sq, sk, **kw):
    """``auto`` as it was: build every candidate, model each (engine costs) from its records, the first within
    the tolerance of the best among those whose column model applies."""
    c, r = schedule.AUTO_COSTS
    times = {}
    for policy in schedule.AUTO_CANDIDATES:
        plan = schedule.build_varlen(policy, sq, sk, **kw)
        lengths = (plan.records[:, 2] - plan.records[:, 1]).astype(np.int64)
        if policy not in ("symmetric_shift", "fa3") and len(lengths) and not (lengths == lengths[0]).all():
            continue
        load = int(plan.loads.max(initial=0)) * plan.group_size
        widest = int(np.diff(plan.seg_col_start).max(initial=0))
        stairs = (min(widest, plan.num_ctas) - 1) * r if plan.rank_rule == RANK_ASC_N else 0.0
        times[policy] = load * max(c, r) + min(c, r) + stairs
    best = min(times.values())
    return next(p for p in schedule.AUTO_CANDIDATES if p in times and times[p] <= best * (1 + schedule.AUTO_TOLERANCE))


def random_problem(rng):
    """(seqlens_q, seqlens_k, build_varlen keywords) of a random packed batch: split token counts or free
    lengths (zeros included), Sq = Sk or not, causal or full, windows, GQA groups, tiles and CTA counts."""
    B = int(rng.choice([1, 2, 3, 4, 7, 16, 33, 64]))
    if rng.random() < 0.6:
        tokens = int(rng.choice([300, 2048, 16384]))
        cuts = np.sort(rng.choice(np.arange(1, tokens), min(B, tokens) - 1, replace=False))
        sq = np.diff(np.concatenate([[0], cuts, [tokens]]))
    else:
        sq = rng.integers(0, 2500, B)
    sk = sq if rng.random() < 0.7 else rng.integers(0, 2500, len(sq))
    causal = bool(rng.random() < 0.5)
    window = (-1, -1)
    if rng.random() < 0.4:
        window = (int(rng.integers(-1, 1500)), 0 if causal else int(rng.integers(-1, 1500)))
    g = int(rng.choice([1, 2, 4, 8]))
    kw = dict(block_m=int(rng.choice([32, 64, 128])), block_n=int(rng.choice([64, 128])),
              heads=g * int(rng.choice([1, 2, 4])), causal=causal, group_size=g, window=window,
              num_sms=int(rng.choice([1, 2, 7, 33, 132, 1000])))
    return sq, sk, kw


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


def test_auto_on_batches_without_columns():
    for sq, sk in (([0], [0]), ([0, 0], [5, 0]), ([7, 0], [0, 9])):
        for causal in (True, False):
            kw = dict(block_m=64, block_n=128, heads=4, causal=causal, num_sms=7, group_size=2)
            plan = schedule.build_varlen("auto", sq, sk, **kw)
            assert plan.num_columns == 0 and plan.policy == auto_by_building(sq, sk, **kw)
