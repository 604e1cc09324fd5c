"""Schedule tables for sliding windows (band-shaped masks): the Q-tile range of every KV tile against
reference.visibility_mask at tile granularity, validity of every policy with GQA grouping (checked independently
of the Cython validator), KV tiles and Q tiles that nobody sees, canonical windows, the band behaviour of
shift / symmetric_shift in the models, rejection of corrupted band tables, the device-table cache and the CLI."""
import functools
import itertools
import types

import numpy as np
import pytest
from table_checks import assert_ranks_follow_time, steps  # noqa: F401

from cupy_dash import reference, schedule
from cupy_dash.cli import schedule as cli_schedule
from cupy_dash.cuda import device_tables
from cupy_dash.schedule import _schedule, testing

POLICIES = ("fa3", "descending", "shift", "symmetric_shift")
TILES = [(64, 128), (128, 128), (80, 128), (64, 96)]
# (seqlen_q, seqlen_k): odd lengths, Sq != Sk both ways, a single tile, fewer queries than one tile
LENGTHS = [(1, 1), (17, 17), (777, 777), (1000, 300), (300, 1000), (129, 1500), (1500, 129)]
# (left, right) for full masks (right is forced to 0 with causal): narrower than a tile, one-sided, zero-width,
# straddling tiles, wider than the sequence
WINDOWS = [(0, 0), (1, 0), (0, 5), (5, 3), (63, 64), (64, 64), (100, 50), (127, -1), (-1, 0), (-1, 130),
           (300, -1), (2000, 2000)]


@functools.lru_cache(maxsize=None)
def tile_visibility(sq, sk, bm, bn, causal, window):
    """bool (M, N): Q tile m and KV tile n share at least one visible (query, key) pair (read-only: cached)."""
    vis = reference.visibility_mask(sq, sk, causal, window)
    M, N = -(-sq // bm), -(-sk // bn)
    padded = np.zeros((M * bm, N * bn), dtype=bool)
    padded[:sq, :sk] = vis
    tiles = padded.reshape(M, bm, N, bn).any(axis=(1, 3))
    tiles.flags.writeable = False
    return tiles


def windows_for(causal):
    return sorted({(left, 0 if causal else right) for left, right in WINDOWS})


def check_independently(plan):
    """The validator's guarantees recomputed with numpy from the reference mask: every visible (head, n, m)
    tile exactly once and nothing else; each non-empty KV column (head // g, n) one contiguous run on one CTA;
    ranks a permutation per dQ tile; every rank edge r -> r + 1 at the same or a later step (no deadlock)."""
    g = plan.group_size
    sq, sk, bm, bn = plan.seqlen_q, plan.seqlen_k, plan.block_m, plan.block_n
    tiles = tile_visibility(sq, sk, bm, bn, plan.causal, plan.window)
    M, N = tiles.shape
    cta, head, n, m = (plan.visits[:, i].astype(np.int64) for i in range(4))
    assert all(((0 <= x) & (x < hi)).all() for x, hi in ((head, plan.num_heads), (n, N), (m, M))), "out of range"
    count = np.zeros((plan.num_heads, M, N), dtype=np.int64)
    np.add.at(count, (head, m, n), 1)
    assert np.array_equal(count, np.broadcast_to(tiles, count.shape).astype(np.int64)), "coverage"
    column = (head // g) * N + n
    new_run = np.r_[True, (column[1:] != column[:-1]) | (cta[1:] != cta[:-1])]
    assert new_run.sum() == plan.num_heads // g * int(tiles.any(axis=0).sum()), "a KV column split or interleaved"
    assert_ranks_follow_time(plan, head * M + m)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_column_ranges_are_the_visible_tiles(causal):
    for (sq, sk), (bm, bn), window in itertools.product(LENGTHS + [(4096, 4096), (2048, 4000)], TILES,
                                                        windows_for(causal)):
        lo, hi = _schedule.column_ranges(sq, sk, bm, bn, causal, *window)
        tiles = tile_visibility(sq, sk, bm, bn, causal, window)
        ranges = np.zeros_like(tiles)
        for n in range(len(lo)):
            ranges[lo[n]:hi[n], n] = True
        assert np.array_equal(ranges, tiles), (sq, sk, bm, bn, causal, window)
        assert np.all(np.diff(lo) >= 0) and np.all(np.diff(hi) >= 0), "range ends must rise with n"
        visible = np.flatnonzero(lo < hi)
        assert len(visible) >= 1 and np.array_equal(visible, np.arange(visible[0], visible[-1] + 1))
        assert visible[-1] == len(lo) - 1, "the last KV tile (the last query's diagonal key) is always seen"


@pytest.mark.parametrize("policy", POLICIES + ("auto",))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_every_policy_is_valid_on_band_shapes(policy, causal):
    for (sq, sk), (bm, bn), window, g, sms in itertools.product(
            LENGTHS, [(64, 128), (128, 128), (80, 128)], windows_for(causal), (1, 2, 8), (1, 7, 132)):
        plan = schedule.build(policy, seqlen_q=sq, seqlen_k=sk, block_m=bm, block_n=bn, num_heads=2 * g,
                              group_size=g, causal=causal, num_sms=sms, window=window).validate()
        check_independently(plan)
        lo, hi = plan.column_ranges()
        columns = 2 * int((hi > lo).sum())                # KV columns with visits: the work units, or pairs
        assert plan.num_ctas <= min(sms, columns)
        if policy in ("fa3", "descending", "shift"):
            assert plan.num_ctas == min(sms, columns)


def test_grouped_band_table_is_the_kv_head_table_repeated():
    kw = dict(seqlen_q=1000, seqlen_k=1300, block_m=64, block_n=128, causal=True, num_sms=11, window=(300, 0))
    for policy in POLICIES:
        plan = schedule.build(policy, num_heads=3 * 8, group_size=8, **kw)
        kv = schedule.build(policy, num_heads=3, **kw)
        np.testing.assert_array_equal(plan.rank, np.repeat(kv.rank, 8))
        np.testing.assert_array_equal(plan.visits[:, 2:], np.repeat(kv.visits[:, 2:], 8, axis=0))


@pytest.mark.parametrize("sq,sk,causal,window", [(300, 1000, False, (100, 50)), (300, 1000, True, (0, 0)),
                                                 (129, 1500, False, (5, 3)), (1000, 1000, False, (0, 0))])
def test_keys_nobody_sees_are_leading_and_their_tiles_have_no_visits(sq, sk, causal, window):
    plan = schedule.build("symmetric_shift", seqlen_q=sq, seqlen_k=sk, block_m=64, block_n=128, num_heads=3,
                          causal=causal, num_sms=5, window=window).validate()
    unseen = ~reference.visibility_mask(sq, sk, causal, window).any(axis=0)
    count = schedule.unseen_keys(sq, sk, causal, plan.window)
    assert np.array_equal(unseen, np.arange(sk) < count)
    lo, hi = plan.column_ranges()
    empty = np.flatnonzero(lo == hi)
    np.testing.assert_array_equal(empty, np.arange(count // 128))          # whole KV tiles of unseen keys
    assert not np.isin(plan.visits[:, 2], empty).any()
    if sq < sk:
        assert len(empty) > 0


def test_query_tiles_nobody_sees_get_no_visits():
    # Sq > Sk with right = 0: queries i < Sq - Sk see no key; Q tiles 0..(700 // 64 - 1) are never visited
    plan = schedule.build("shift", seqlen_q=1000, seqlen_k=300, block_m=64, block_n=128, num_heads=2,
                          causal=False, num_sms=7, window=(50, 0)).validate()
    assert plan.visits[:, 3].min() == 700 // 64
    blind = ~reference.visibility_mask(1000, 300, False, (50, 0)).any(axis=1)
    assert blind[:700].all() and not blind[700:].any()


@pytest.mark.parametrize("sq,sk,causal,window,canonical", [
    (100, 300, False, (299, 99), (-1, -1)), (100, 300, False, (298, 98), (298, 98)),
    (100, 300, True, (5000, -1), (-1, 0)), (100, 300, True, (7, 0), (7, 0)), (1, 1, False, (0, 0), (-1, -1)),
    (300, 100, False, (np.int64(99), 299), (-1, -1))])
def test_canonical_window(sq, sk, causal, window, canonical):
    assert schedule.canonical_window(window, sq, sk, causal) == canonical
    a = schedule.build("shift", seqlen_q=sq, seqlen_k=sk, block_m=64, block_n=128, num_heads=2, causal=causal,
                       num_sms=3, window=window)
    b = schedule.build("shift", seqlen_q=sq, seqlen_k=sk, block_m=64, block_n=128, num_heads=2, causal=causal,
                       num_sms=3, window=canonical)
    assert a is b and a.window == canonical
    if canonical[0] == -1 and canonical[1] == (0 if causal else -1):      # the window bounds nothing
        plain = schedule.build("shift", seqlen_q=sq, seqlen_k=sk, block_m=64, block_n=128, num_heads=2,
                               causal=causal, num_sms=3)
        assert plain is a


@pytest.mark.parametrize("window,causal,exc,match", [
    ((1, 2, 3), False, TypeError, "window: expected a pair"), (None, False, TypeError, "window: expected a pair"),
    ((1.0, 2), False, TypeError, "window: left must be an int"), ((1, True), False, TypeError, "right must be"),
    ((-2, 0), False, ValueError, "window: left must be -1"), ((4, 2), True, ValueError, "contradicts causal")])
def test_bad_windows(window, causal, exc, match):
    with pytest.raises(exc, match=match):
        schedule.build("fa3", seqlen_q=100, seqlen_k=100, block_m=64, block_n=128, num_heads=1, causal=causal,
                       num_sms=1, window=window)
    with pytest.raises(ValueError, match="window sides"):
        testing.build_table(0, 100, 100, 64, 128, 1, False, 1, 1, -2, 0)


def equal_length_band(policy, sms, heads=3):
    """Sq = Sk + 320, window (0, 256): every KV tile sees exactly 6 Q tiles of 64 rows, the range moving up by
    2 tiles per KV tile of 128 keys (no end is clipped)."""
    return schedule.build(policy, seqlen_q=1024 + 320, seqlen_k=1024, block_m=64, block_n=128, num_heads=heads,
                          causal=False, num_sms=sms, window=(0, 256)).validate()


def collisions(plan, mask=None):
    """How many (step, head, m) triples more than one visit shares (two columns on one dQ tile at one step)."""
    key = ((steps(plan).astype(np.int64) * plan.num_heads + plan.visits[:, 1]) * plan.num_m_blocks
           + plan.visits[:, 3])
    if mask is not None:
        key = key[mask]
    _, count = np.unique(key, return_counts=True)
    return int((count > 1).sum())


@pytest.mark.parametrize("sms", [1, 2, 5, 7, 13, 24])
def test_band_shift_never_meets_when_columns_are_equally_long(sms):
    plan = equal_length_band("shift", sms)
    lo, hi = plan.column_ranges()
    assert np.all(hi - lo == 6) and plan.window == (0, 256)
    assert collisions(plan) == 0                          # on the CTA clock, whatever the start times
    tl = schedule.timeline(plan)                          # hence no waits in the DAG model
    np.testing.assert_allclose(tl["reduce_start"] - tl["compute_start"], 1.0)


def test_band_shift_interior_columns_never_meet_whenever_they_start():
    """A causal sliding window: the shorter columns at the end of each head make the dispatch start the columns
    at scattered times, yet on the CTA's clock the equally long interior columns never meet on a dQ tile. On
    each column's own clock (DASH's full-mask rotation) they would."""
    plan = schedule.build("shift", seqlen_q=4096, seqlen_k=4096, block_m=128, block_n=128, num_heads=32,
                          causal=True, num_sms=132, window=(1024, 0)).validate()
    lo, hi = plan.column_ranges()
    interior = (hi - lo == (hi - lo).max())[plan.visits[:, 2]]
    assert 0.5 < interior.mean() < 1 and collisions(plan, interior) == 0
    visits = plan.visits.copy()
    new_column = np.r_[True, np.any(visits[1:, :3] != visits[:-1, :3], axis=1)]
    s = np.arange(plan.num_visits) - np.maximum.accumulate(np.where(new_column, np.arange(plan.num_visits), 0))
    n = visits[:, 2].astype(np.int64)
    visits[:, 3] = lo[n] + (s + n + plan.num_m_blocks - hi[n]) % (hi[n] - lo[n])
    own_clock = types.SimpleNamespace(visits=visits, num_heads=plan.num_heads, num_m_blocks=plan.num_m_blocks,
                                      cta_start=plan.cta_start, num_visits=plan.num_visits)
    assert collisions(own_clock, interior) > 0


@pytest.mark.parametrize("sms", [3, 20, 132])
@pytest.mark.parametrize("block_m", [64, 128])
def test_band_symmetric_shift_columns_with_rising_starts_never_meet(sms, block_m):
    """Causal sliding window: every column but the first has a rising range start; they walk up and are
    dispatched from the highest n down, so no two of them reach a dQ tile at the same step."""
    plan = schedule.build("symmetric_shift", seqlen_q=4096, seqlen_k=4096, block_m=block_m, block_n=128,
                          num_heads=4, causal=True, num_sms=sms, window=(1024, 0)).validate()
    lo, _ = plan.column_ranges()
    rising = plan.visits[:, 2] > 0
    assert np.all(np.diff(lo) > 0) and collisions(plan, rising) == 0
    up = np.diff(plan.visits[:, 3].astype(np.int64))
    same_column = np.all(plan.visits[1:, :3] == plan.visits[:-1, :3], axis=1)
    assert np.all(up[same_column & rising[1:]] == 1)                       # ascending walks
    assert np.all(up[same_column & ~rising[1:]] == -1)                     # the start-clipped column descends


# Paper-like shapes (132 SMs, 16k tokens, H * D = 2048), relative to the lower bound.
BAND_SHAPES = [(d, causal, s, w) for d in (64, 128) for causal in (True, False) for s, w in
               ((1024, 256), (4096, 1024), (16384, 4096), (16384, 1024))]


@pytest.mark.parametrize("hdim,causal,seqlen,width", BAND_SHAPES)
def test_band_schedules_are_close_to_the_bound_in_both_models(hdim, causal, seqlen, width):
    window = (width, 0) if causal else (width // 2, width // 2)
    kw = dict(seqlen_q=seqlen, seqlen_k=seqlen, block_m=128 if hdim == 64 else 64, block_n=128,
              num_heads=(16384 // seqlen) * (2048 // hdim), causal=causal, num_sms=132, window=window)
    plan = schedule.build("symmetric_shift", **kw)
    for model, r, limit in (("dag", 0.25, 1.07), ("engine", 0.8, 1.11)):
        assert schedule.simulate(plan, 1.0, r, model) <= limit * plan.lower_bound(1.0, r, model), model
    auto = schedule.build("auto", **kw)
    assert schedule.simulate(auto, *schedule.AUTO_COSTS, model="engine") <= 1.06 * auto.lower_bound(
        *schedule.AUTO_COSTS, model="engine")
    times = {p: schedule.simulate(schedule.build(p, **kw), *schedule.AUTO_COSTS, model="engine")
             for p in schedule.AUTO_CANDIDATES}
    assert times[auto.policy] <= min(times.values()) * (1 + schedule.AUTO_TOLERANCE)


@pytest.mark.parametrize("policy", schedule.PORTABLE_POLICIES)
def test_portable_policies_stay_portable_with_windows(policy):
    """fa3 (SPT whenever the mask has a right bound) and descending add in orders that follow from the tile
    indices alone, also on bands: the same bits on 114 and 132 SMs (or any other count)."""
    shapes = [(1024, 1024, 64, False, 1), (1000, 3000, 64, True, 1), (3000, 1000, 128, False, 1),
              (2048, 2048, 64, True, 4), (1537, 999, 80, False, 2)]
    for (sq, sk, bm, causal, g), window in itertools.product(shapes, [(100, 50), (300, 0), (-1, 40), (0, 0),
                                                                      (1000, -1), (5, 700)]):
        if causal and window[1] > 0:
            continue
        kw = dict(seqlen_q=sq, seqlen_k=sk, block_m=bm, block_n=128, num_heads=8, causal=causal, group_size=g,
                  window=window)
        ref = schedule.build(policy, num_sms=132, **kw)
        for sms in (1, 7, 114, 264):
            assert schedule.same_reduction_order(schedule.build(policy, num_sms=sms, **kw), ref), \
                (sq, sk, causal, window, sms)


def test_right_bounded_windows_keep_the_causal_pairing():
    """A right bound alone gives the causal (triangular) shape: symmetric_shift pairs columns (k, N-1-k)."""
    plan = schedule.build("symmetric_shift", seqlen_q=2048, seqlen_k=2048, block_m=64, block_n=128, num_heads=16,
                          causal=False, num_sms=20, window=(-1, 300)).validate()
    cta0 = plan.visits[plan.cta_start[0]:plan.cta_start[1]]
    first_two = list(dict.fromkeys(cta0[:, 2].tolist()))[:2]
    assert first_two == [0, plan.num_n_blocks - 1]


# ----------------------------------------------------------------------------------------------------------------
# corrupted band tables
# ----------------------------------------------------------------------------------------------------------------
class Corrupt:
    def __init__(self, plan):
        self.plan = plan
        self.visits, self.rank, self.cta_start = plan.visits.copy(), plan.rank.copy(), plan.cta_start.copy()

    def validate(self, ranges=None):
        lo, hi = self.plan.column_ranges() if ranges is None else ranges
        _schedule.analyze_table(self.visits, self.rank, self.cta_start, self.plan.num_heads,
                                self.plan.num_m_blocks, lo, group_size=self.plan.group_size, hi_arr=hi)


@pytest.fixture
def band():
    """Sq = 500 < Sk = 900, window (100, 50), two query heads per KV head: keys 0-299 are seen by nobody, so
    KV tiles 0 and 1 have no visits; the band cuts Q tiles off below and above the other KV tiles."""
    plan = schedule.build("symmetric_shift", seqlen_q=500, seqlen_k=900, block_m=64, block_n=128, num_heads=4,
                          group_size=2, causal=False, num_sms=3, window=(100, 50)).validate()
    lo, hi = plan.column_ranges()
    assert list(np.flatnonzero(lo == hi)) == [0, 1]
    return plan


def test_validate_rejects_a_visit_above_or_below_the_band(band):
    lo, hi = band.column_ranges()
    for n, m in ((int(np.flatnonzero(lo > 0)[0]), "below"), (int(np.flatnonzero((hi < band.num_m_blocks)
                                                                                  & (lo < hi))[0]), "above")):
        bad = Corrupt(band)
        v = int(np.flatnonzero(bad.visits[:, 2] == n)[0])      # the first visit of a chain of KV tile n
        bad.visits[v, 3] = lo[n] - 1 if m == "below" else hi[n]
        with pytest.raises(ValueError, match=rf"n_block {n}, m_block \d+\) is fully masked but visited"):
            bad.validate()


def test_validate_rejects_a_visit_to_a_kv_tile_nobody_sees(band):
    bad = Corrupt(band)
    v = int(np.flatnonzero(bad.visits[:, 2] == 3)[0])          # the first visit of a chain of KV tile 3
    bad.visits[v, 2] = 1
    with pytest.raises(ValueError, match=r"n_block 1, m_block \d+\) is fully masked but visited"):
        bad.validate()


def test_validate_rejects_a_missing_band_tile(band):
    bad = Corrupt(band)
    bad.visits, bad.rank = bad.visits[:-1], bad.rank[:-1]
    bad.cta_start[-1] -= 1
    with pytest.raises(ValueError, match="unmasked but not in its KV tile.s chain"):
        bad.validate()


def test_validate_rejects_a_duplicate_band_rank(band):
    bad = Corrupt(band)
    head1 = bad.visits[:, 1] == 1
    m = int(np.bincount(bad.visits[head1, 3]).argmax())        # the dQ tile of head 1 with the most visits
    i, j = np.flatnonzero(head1 & (bad.visits[:, 3] == m))[:2]
    bad.rank[j] = bad.rank[i]
    with pytest.raises(ValueError, match=rf"dQ tile \(head 1, m_block {m}\)"):
        bad.validate()


def test_validate_rejects_a_table_of_another_mask(band):
    full = np.zeros(band.num_n_blocks, np.int64), np.full(band.num_n_blocks, band.num_m_blocks, np.int64)
    with pytest.raises(ValueError, match="unmasked but"):
        Corrupt(band).validate(full)                      # the full mask needs the tiles the band skips
    wider = schedule.build("shift", seqlen_q=500, seqlen_k=900, block_m=64, block_n=128, num_heads=4,
                           group_size=2, causal=False, num_sms=3, window=(300, 50))
    with pytest.raises(ValueError, match="fully masked but visited"):
        Corrupt(wider).validate(band.column_ranges())
    lo, hi = band.column_ranges()
    with pytest.raises(ValueError, match=r"Q-tile range \[\d+, \d+\) is not inside"):
        Corrupt(band).validate((lo, hi + band.num_m_blocks))


def test_validate_rejects_a_band_deadlock():
    plan = schedule.build("fa3", seqlen_q=512, seqlen_k=512, block_m=64, block_n=128, num_heads=1, causal=False,
                          num_sms=4, window=(200, 200)).validate()
    bad = Corrupt(plan)
    # KV tiles 1 and 2 both see Q tiles 2..5; make KV tile 2 walk them first-to-last reversed and give each of
    # the two the first rank on the tile the other one reaches first: each waits for the other.
    v1 = np.flatnonzero(bad.visits[:, 2] == 1)
    v2 = np.flatnonzero(bad.visits[:, 2] == 2)
    shared = sorted(set(bad.visits[v1, 3]) & set(bad.visits[v2, 3]))
    a, b = shared[0], shared[-1]
    ia2, ib2 = (int(v2[bad.visits[v2, 3] == x][0]) for x in (a, b))
    bad.visits[[ia2, ib2], 3] = bad.visits[[ib2, ia2], 3]            # tile 2 now reaches b before a
    for m, first in ((a, 2), (b, 1)):
        on = np.flatnonzero(bad.visits[:, 3] == m)
        order = sorted(on, key=lambda v: (bad.visits[v, 2] != first, bad.rank[v]))
        bad.rank[order] = np.arange(len(order))
    with pytest.raises(ValueError, match="deadlock"):
        bad.validate()


# ----------------------------------------------------------------------------------------------------------------
# device-table cache and CLI
# ----------------------------------------------------------------------------------------------------------------
def test_device_tables_are_keyed_by_window(host_tables):
    args = ("shift", 1000, 1000, 64, 128, 8, False, 7, 0, host_tables)
    plain = device_tables.per_visit(*args)
    band = device_tables.per_visit(*args, window=(100, 100))
    assert band is not plain and band is device_tables.per_visit(*args, window=(100, 100))
    assert len(band.visits) < len(plain.visits)
    plan = next(p for p in device_tables._plans.values() if p.window == (100, 100))
    np.testing.assert_array_equal(band.visits, plan.visits)
    assert "window=(100, 100)" in repr(plan) and plan.key[-2] == (100, 100)


def test_cli_takes_a_window(capsys):
    assert cli_schedule.main(["--seqlen-q", "2048", "--heads", "16", "--causal", "--window", "512", "0",
                              "--num-sms", "40", "--model", "engine", "--r", "0.8"]) == 0
    out = capsys.readouterr().out
    assert "causal with window (512, 0) mask" in out and all(p in out for p in POLICIES)
    assert cli_schedule.main(["--seqlen-q", "2048", "--causal", "--window", "512", "3"]) == 2
    assert "contradicts causal" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        cli_schedule.main(["--window", "-2", "0"])
    assert exc.value.code == 2 and "--window" in capsys.readouterr().err
