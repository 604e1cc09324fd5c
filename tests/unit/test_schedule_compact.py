"""Compact (per-column) schedules: their expansion equals the per-visit table of schedule.build array for array,
the kernel-side computations from records alone (visit_of, rank_of) give every visit and rank of the table,
the O(columns) record check rejects corrupted records and never passes records whose expansion is invalid,
auto's column model, the build's cost, and the CLI's compact path."""
import itertools
import time
import tracemalloc

import numpy as np
import pytest

from cupy_dash import schedule
from cupy_dash.cli import compact as cli_compact, schedule as cli_schedule
from cupy_dash.schedule import _compact, _schedule, auto, compact, per_visit, testing
from varlen_cases import random_fixed_problem

POLICIES = ("fa3", "descending", "shift", "symmetric_shift")
LENGTHS = [(1, 1), (17, 1000), (1000, 17), (777, 777), (2047, 1500), (300, 1000)]
TILES = [(64, 128), (128, 128), (80, 128), (128, 64)]
SMS = (1, 7, 114, 132, 264)


def windows(causal):
    both = [(-1, -1), (100, -1), (300, 50), (0, 0), (63, 64), (1000, 0)]
    return sorted({(left, 0 if causal else right) for left, right in both})


def kwargs(sq, sk, bm, bn, heads, g, causal, sms, window):
    return dict(seqlen_q=sq, seqlen_k=sk, block_m=bm, block_n=bn, num_heads=heads, group_size=g, causal=causal,
                num_sms=sms, window=window)


def oracle_table(policy, kw):
    """(visits, rank, cta_start) of the direct per-visit builder (the oracle) for build()'s keyword arguments
    ``kw`` and a concrete ``policy``."""
    args = per_visit._checked_args(policy, kw["seqlen_q"], kw["seqlen_k"], kw["block_m"], kw["block_n"],
                                   kw["num_heads"], kw["causal"], kw["num_sms"], kw["group_size"], kw["window"])
    return testing.build_table(_schedule.POLICY_CODES[policy], *args[:-2], *args[-2])


def assert_same_table(policy, kw):
    plan = schedule.build(policy, **kw)
    cplan = schedule.build_compact(policy, **kw)
    visits, rank, cta_start = schedule.expand(cplan)
    assert cplan.policy == plan.policy and cplan.num_ctas == plan.num_ctas and cplan.num_visits == plan.num_visits
    for name, got, want in zip(("visits", "rank", "cta_start"), (visits, rank, cta_start),
                               oracle_table(plan.policy, kw)):
        assert got.dtype == want.dtype, (name, got.dtype, want.dtype)
        np.testing.assert_array_equal(got, want, err_msg=f"{name} against the oracle: {policy} {kw}")
    np.testing.assert_array_equal(visits, plan.visits, err_msg=f"visits {policy} {kw}")
    np.testing.assert_array_equal(rank, plan.rank, err_msg=f"rank {policy} {kw}")
    np.testing.assert_array_equal(cta_start, plan.cta_start, err_msg=f"cta_start {policy} {kw}")
    cplan.validate()
    return plan, cplan


@pytest.mark.parametrize("g", [1, 2, 8])
@pytest.mark.parametrize("policy", POLICIES + ("auto",))
def test_expanded_compact_table_equals_the_table(policy, g):
    checked = 0
    for (sq, sk), (bm, bn), causal, sms in itertools.product(LENGTHS, TILES, (False, True), SMS):
        for window in windows(causal):
            assert_same_table(policy, kwargs(sq, sk, bm, bn, 16, g, causal, sms, window))
            checked += 1
    assert checked == len(LENGTHS) * len(TILES) * len(SMS) * (len(windows(False)) + len(windows(True)))


def test_expanded_compact_table_equals_the_table_randomized():
    rng = np.random.default_rng(20261201)
    for _ in range(400):
        policy, sq, sk, bm, bn, heads, causal, sms, g, window = random_fixed_problem(rng, POLICIES)
        kw = kwargs(sq, sk, bm, bn, heads, g, causal, sms, window)
        plan, cplan = assert_same_table(policy, kw)
        cplan.to_schedule().validate()                  # validate() works on the expanded view
        for mode in ("count", "window"):                # the kernel's loops, for every visit
            visits, rank, scanned = cplan.visits_and_ranks(mode)
            np.testing.assert_array_equal(visits, plan.visits, err_msg=str(kw))
            np.testing.assert_array_equal(rank, plan.rank, err_msg=f"{mode} {kw}")


@pytest.mark.parametrize("mode", ["kernel", "count", "window"])
@pytest.mark.parametrize("policy", POLICIES)
def test_kernel_side_visits_and_ranks_equal_the_table(policy, mode):
    """visit_of walks the CTA's columns, rank_of counts the tile's columns with smaller keys (all of them, or
    only those within the column's scan bounds) or uses the closed form of fa3 / descending: both equal the
    table for every visit."""
    for (sq, sk), (bm, bn), causal, g, sms in itertools.product(LENGTHS, TILES, (False, True), (1, 8), (1, 7, 132)):
        for window in windows(causal)[::2]:
            kw = kwargs(sq, sk, bm, bn, 16, g, causal, sms, window)
            plan = schedule.build(policy, **kw)
            cplan = schedule.build_compact(policy, **kw)
            visits, rank, scanned = cplan.visits_and_ranks(mode)
            np.testing.assert_array_equal(visits, plan.visits, err_msg=str(kw))
            np.testing.assert_array_equal(rank, plan.rank, err_msg=str(kw))
            per_tile = cplan.scan_lengths()[plan.visits[:, 3]]
            if mode == "count":       # the count reads exactly the columns of the KV head that visit the tile
                np.testing.assert_array_equal(scanned, per_tile)
            elif mode == "kernel" and cplan.rank_rule:
                assert not scanned.any()
            else:
                assert (scanned <= per_tile).all() and (scanned >= 1).all()
                if g == 1:
                    assert cplan.window_scan_stats() == pytest.approx((scanned.mean(), scanned.max()))


def test_rank_rules_are_the_portable_orders():
    kw = kwargs(4096, 4096, 64, 128, 8, 1, True, 132, (-1, -1))
    assert [schedule.build_compact(p, **kw).rank_rule for p in POLICIES] == [2, 1, 0, 0]
    kw["causal"] = False
    assert [schedule.build_compact(p, **kw).rank_rule for p in POLICIES] == [1, 1, 0, 0]


def test_large_shape_sampled_visits_and_ranks():
    kw = kwargs(16384, 16384, 64, 128, 32, 1, True, 132, (-1, -1))
    for policy in ("shift", "symmetric_shift"):
        plan = schedule.build(policy, **kw)
        cplan = schedule.build_compact(policy, **kw)
        visits, rank, cta_start = schedule.expand(cplan)
        assert np.array_equal(visits, plan.visits) and np.array_equal(rank, plan.rank)
        for got, want in zip((visits, rank, cta_start), oracle_table(policy, kw)):
            assert np.array_equal(got, want)
        rng = np.random.default_rng(7)
        for v in rng.integers(0, plan.num_visits, 3000):
            cta = int(plan.visits[v, 0])
            assert cplan.visit_of(cta, int(v - plan.cta_start[cta])) == tuple(plan.visits[v])
            head, n, m = (int(x) for x in plan.visits[v, 1:])
            r, scanned = cplan.rank_of(head, m, n, mode="count")
            assert r == plan.rank[v] and scanned == cplan.scan_lengths()[m]
            r, windowed = cplan.rank_of(head, m, n, mode="window")
            assert r == plan.rank[v] and windowed <= min(scanned, 2 * 132)


def test_build_compact_checks_its_arguments_as_build_does():
    good = kwargs(1000, 1000, 64, 128, 4, 2, True, 3, (-1, -1))
    for bad, exc in ((dict(group_size=3), ValueError), (dict(num_sms=0), ValueError), (dict(seqlen_q=1.5), TypeError),
                     (dict(window=(5, 3)), ValueError), (dict(causal="yes"), TypeError)):
        with pytest.raises(exc):
            schedule.build(**dict(good, **bad))
        with pytest.raises(exc):
            schedule.build_compact(**dict(good, **bad))
    with pytest.raises(ValueError, match="unknown schedule"):
        schedule.build_compact("fastest", **good)


def test_visit_of_and_rank_of_reject_what_is_not_in_the_table():
    cplan = schedule.build_compact("shift", **kwargs(1000, 1000, 64, 128, 4, 2, True, 3, (-1, -1)))
    per_cta = np.diff(schedule.expand(cplan)[2])
    with pytest.raises(IndexError):
        cplan.visit_of(0, int(per_cta[0]))
    with pytest.raises(IndexError):
        cplan.visit_of(3, 0)
    with pytest.raises(ValueError, match="does not visit"):
        cplan.rank_of(0, 0, 7)                   # causal: KV tile 7 does not see Q tile 0
    with pytest.raises(ValueError, match="no column"):
        cplan.rank_of(0, 3, 8)


# ------------------------------------------------------------------------------------------------ record checks
def writable(cplan):
    return cplan.records.copy(), cplan.cta_columns.copy(), cplan.cta_col_start.copy()


def check(cplan, records, cols, cs, tie_sign=None, bounds=None):
    lo, hi = cplan.column_ranges()
    _compact.check_records(records, cols, cs, cplan.num_heads // cplan.group_size, lo, hi, cplan.n_first,
                           cplan.columns_per_head, cplan.tie_sign if tie_sign is None else tie_sign, bounds)


@pytest.fixture
def cplan():
    return schedule.build_compact("symmetric_shift", **kwargs(1500, 1500, 64, 128, 4, 2, True, 3, (-1, -1)))


@pytest.mark.parametrize("field,delta,match", [(0, 1, "step"), (1, 1, "range"), (2, -1, "range"),
                                               (3, 100, "split"), (4, 1000, "split"), (5, 1, "CTA"),
                                               (6, 1, "belongs"), (7, 1, "belongs")],
                         ids=["step", "lo", "hi", "split", "rot", "cta", "head", "n_block"])
def test_check_records_rejects_a_corrupted_field(cplan, field, delta, match):
    records, cols, cs = writable(cplan)
    i = int(cols[cs[1] - 1])                     # the last column of CTA 0 (step > 0)
    records[i, field] += delta
    with pytest.raises(ValueError, match=match):
        check(cplan, records, cols, cs)


def test_check_records_rejects_bad_lists(cplan):
    records, cols, cs = writable(cplan)
    cols[1] = cols[0]
    with pytest.raises(ValueError, match="twice|step"):
        check(cplan, records, cols, cs)
    records, cols, cs = writable(cplan)
    cols[[0, 1]] = cols[[1, 0]]                  # two columns of CTA 0 swapped: steps no longer positions
    with pytest.raises(ValueError, match="step"):
        check(cplan, records, cols, cs)
    records, cols, cs = writable(cplan)
    cs[1] -= 1                                   # CTA 0's last column moved to CTA 1's list
    with pytest.raises(ValueError, match="says CTA"):
        check(cplan, records, cols, cs)
    with pytest.raises(ValueError, match="tie_sign"):
        check(cplan, *writable(cplan), tie_sign=0)
    with pytest.raises(ValueError, match="records"):
        check(cplan, cplan.records[:-1], cplan.cta_columns[:-1], cplan.cta_col_start)


def bounds_hold(cplan, bounds):
    """Independent oracle (numpy): bool per record, whether its scan bounds (x, y, x2, y2) are nested runs and
    true: the columns of its KV head among the first x and last y end by its start, and those outside the
    first x2 and last y2 start at or after its end."""
    NC = cplan.columns_per_head
    start = cplan.records[:, 0].astype(np.int64)
    end = start + cplan.records[:, 2] - cplan.records[:, 1]
    ok = np.zeros(len(bounds), dtype=bool)
    for i, (x, y, x2, y2) in enumerate(bounds.astype(np.int64)):
        if not (0 <= x <= x2 and 0 <= y <= y2 and x2 + y2 <= NC):
            continue
        head = slice(i // NC * NC, i // NC * NC + NC)
        s, e = start[head], end[head]
        before = np.r_[e[:x], e[NC - y:]]
        ok[i] = (before <= start[i]).all() and (s[x2:NC - y2] >= end[i]).all()
    return ok


def test_check_records_accepts_exactly_the_true_scan_bounds(cplan):
    assert bounds_hold(cplan, cplan.scan_bounds).all()
    assert (cplan.scan_bounds[:, :2] > 0).any() and (cplan.scan_bounds[:, 2:] < cplan.columns_per_head).any()
    check(cplan, *writable(cplan), bounds=cplan.scan_bounds)
    rng = np.random.default_rng(11)
    verdicts = set()
    for _ in range(300):
        bounds = cplan.scan_bounds.copy()
        i, col = int(rng.integers(len(bounds))), int(rng.integers(4))
        bounds[i, col] += int(rng.choice([-3, -1, 1, 3, 1000]))
        holds = bool(bounds_hold(cplan, bounds).all())
        try:
            check(cplan, *writable(cplan), bounds=bounds)
            accepted = True
        except ValueError:
            accepted = False
        assert accepted == holds, (i, col, bounds[i])
        verdicts.add(holds)
    assert verdicts == {True, False}
    with pytest.raises(ValueError, match="scan bounds must be"):
        check(cplan, *writable(cplan), bounds=cplan.scan_bounds[:-1])


def test_check_records_is_sound_under_random_corruption():
    """Whenever check_records accepts randomly corrupted records, the expanded table passes validate()."""
    rng = np.random.default_rng(3)
    accepted = rejected = 0
    for policy, causal in itertools.product(POLICIES, (False, True)):
        cplan = schedule.build_compact(policy, **kwargs(900, 700, 64, 128, 4, 2, causal, 5, (-1, -1)))
        for _ in range(60):
            records, cols, cs = writable(cplan)
            i, field = int(rng.integers(len(records))), int(rng.integers(5))
            records[i, field] += int(rng.choice([-2, -1, 1, 2]))
            if field == 4 and records[i, 3] >= 0:           # a rotation stays a rotation: must stay valid
                records[i, 4] %= records[i, 2] - records[i, 3]
            try:
                check(cplan, records, cols, cs)
            except ValueError:
                rejected += 1
                continue
            accepted += 1
            visits, rank, cta_start = testing.expand_sorted(records, cols, cs, cplan.num_m_blocks, cplan.n_first,
                                                            cplan.columns_per_head, cplan.group_size, cplan.tie_sign)
            lo, hi = cplan.column_ranges()
            _schedule.analyze_table(visits, rank, cta_start, cplan.num_heads, cplan.num_m_blocks, lo,
                                    group_size=cplan.group_size, hi_arr=hi)
    assert accepted > 10 and rejected > 100


# --------------------------------------------------------------------------------------------- cost and auto
def test_compact_build_is_per_column_at_128k():
    kw = kwargs(131072, 131072, 64, 128, 32, 1, True, 132, (-1, -1))
    compact._build_compact.cache_clear()
    tracemalloc.start()
    t0 = time.thread_time()        # CPU time (as the bounds below), not disturbed by other jobs on the machine
    cplan = schedule.build_compact("symmetric_shift", **kw)
    assert cplan.scan_bounds.shape == (32 * 1024, 4)
    elapsed = time.thread_time() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert cplan.num_columns == 32 * 1024 and cplan.num_visits == 32 * 1024 * 1025
    assert peak < 4 << 20, f"{peak} bytes allocated"                # no per-visit arrays (34M visits)
    assert cplan.nbytes == 32 * 1024 * 52 + 133 * 8                 # 52 bytes per column, 8 per CTA
    assert elapsed < 0.1, f"{elapsed:.3f} s"
    cplan.validate()


def test_auto_below_the_threshold_is_the_simulated_choice():
    for causal in (False, True):
        kw = kwargs(4096, 4096, 64, 128, 16, 1, causal, 132, (-1, -1))
        cplan = schedule.build_compact("auto", **kw)
        assert cplan.policy == schedule.build("auto", **kw).policy and cplan.auto_method == "engine simulation"


@pytest.mark.parametrize("shape", [(32768, 128, 16, True, 1), (32768, 64, 16, True, 1), (16384, 64, 16, False, 1),
                                   (16384, 64, 32, True, 8)], ids=str)
def test_column_model_choice_is_close_to_the_simulated_best(monkeypatch, shape):
    seqlen, block_m, heads, causal, g = shape
    kw = kwargs(seqlen, seqlen, block_m, 128, heads, g, causal, 132, (-1, -1))
    monkeypatch.setattr(per_visit, "AUTO_MAX_SIMULATED_VISITS", 0)
    auto._auto_choice.cache_clear()
    try:
        cplan = schedule.build_compact("auto", **kw)
        assert cplan.auto_method == "column model" and cplan.column_model_applies
        times = {p: schedule.simulate(schedule.build(p, **kw), *schedule.AUTO_COSTS, model="engine")
                 for p in POLICIES}
    finally:
        auto._auto_choice.cache_clear()
        auto._build.cache_clear()
        compact._build_compact.cache_clear()
    assert times[cplan.policy] <= min(times.values()) * 1.03, times


def test_column_model_is_exact_for_wait_free_tables():
    for kw in (kwargs(8192, 8192, 64, 128, 16, 1, True, 132, (-1, -1)),
               kwargs(4096, 4096, 64, 128, 16, 2, False, 132, (-1, -1))):
        policy = "symmetric_shift" if kw["causal"] else "shift"
        plan, cplan = schedule.build(policy, **kw), schedule.build_compact(policy, **kw)
        for model, r in (("dag", 0.25), ("engine", 0.8)):
            assert cplan.model_makespan(1.0, r, model) == pytest.approx(schedule.simulate(plan, 1.0, r, model))
            assert cplan.lower_bound(1.0, r, model) == pytest.approx(plan.lower_bound(1.0, r, model))


def test_column_model_flags_tables_whose_waits_it_misses():
    kw = kwargs(8192, 8192, 128, 128, 16, 1, True, 132, (-1, -1))
    flags = {p: schedule.build_compact(p, **kw).column_model_applies for p in POLICIES}
    assert flags == {"fa3": True, "descending": False, "shift": False, "symmetric_shift": True}
    assert all(schedule.build_compact(p, **dict(kw, causal=False)).column_model_applies for p in POLICIES)


# ------------------------------------------------------------------------------------------------------- CLI
def test_cli_compact_path(capsys):
    code = cli_schedule.main(["--seqlen-q", "2048", "--heads", "4", "--causal", "--compact", "--num-sms", "7"])
    out = capsys.readouterr().out
    assert code == 0 and "compact records (--compact)" in out and "auto picks" in out and "column model" in out
    for policy in POLICIES:
        assert policy in out
    with pytest.raises(SystemExit) as exc:
        raise SystemExit(cli_schedule.main(["--compact", "--plot", "x.png"]))
    assert exc.value.code == 2


def test_cli_one_million_tokens_in_bounded_memory(capsys):
    tracemalloc.start()
    t0 = time.thread_time()
    code = cli_schedule.main(["--seqlen-q", str(1 << 20), "--heads", "16", "--causal"])
    elapsed = time.thread_time() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    out = capsys.readouterr().out
    assert code == 0 and "1073872896 visits per table" in out
    assert "auto picks 'descending': the backward of this problem uses compact tables (1073872896 visits > " in out
    assert peak < 64 << 20 and elapsed < 10, (peak, elapsed)
    assert cli_compact.CLI_MAX_SIMULATED_VISITS < 1073872896
