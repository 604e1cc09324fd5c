"""Grouped-query attention (GQA, MQA) schedule tables: a KV column (head // g, n_block) runs over the g query
heads of its group on one CTA. Validity on awkward shapes (checked independently of the Cython validator),
the Q-tile-major order, the closed forms with grouped heads, and rejection of corrupted grouped tables."""
import itertools

import numpy as np
import pytest
from table_checks import assert_ranks_follow_time, steps  # noqa: F401

from cupy_dash import schedule
from cupy_dash.cli import schedule as cli_schedule
from cupy_dash.cuda import device_tables
from cupy_dash.schedule import _schedule, testing

POLICIES = ("fa3", "descending", "shift", "symmetric_shift")
HEADS = 16                                    # query heads per batch; g = 16 is MQA
GROUPS = (1, 2, 8, HEADS)


def grouped(policy, *, sq, sk, bm=64, bn=128, batch=2, g=2, causal=False, sms=7):
    return schedule.build(policy, seqlen_q=sq, seqlen_k=sk, block_m=bm, block_n=bn, num_heads=batch * HEADS,
                          group_size=g, causal=causal, num_sms=sms)


def tie_sign(policy, causal):
    """The tie-break of _schedule.pyx: descending n for symmetric_shift and causal fa3, ascending n otherwise."""
    return -1 if policy == "symmetric_shift" or (policy == "fa3" and causal) else 1


def check_independently(plan):
    """The validator's guarantees, recomputed with numpy: every visible (head, n, m) tile once; each KV column
    (head // g, n) one contiguous run on one CTA; ranks a permutation per dQ tile (head, m); and every rank
    edge r -> r + 1 goes to a visit at the same or a later step of its CTA, so the wait graph has no cycle."""
    g, M, N = plan.group_size, plan.num_m_blocks, plan.num_n_blocks
    cta, head, n, m = (plan.visits[:, i].astype(np.int64) for i in range(4))
    lo = plan.column_starts()
    assert all(((0 <= x) & (x < hi)).all() for x, hi in ((head, plan.num_heads), (n, N), (m, M))), "out of range"
    count = np.zeros((plan.num_heads, M, N), dtype=np.int64)
    np.add.at(count, (head, m, n), 1)
    want = np.arange(M)[:, None] >= np.asarray(lo)[None, :]          # (M, N): Q tile i of KV column j is seen
    assert np.array_equal(count, np.broadcast_to(want, count.shape).astype(np.int64)), "coverage"
    column = (head // g) * N + n
    new_run = np.r_[True, (column[1:] != column[:-1]) | (cta[1:] != cta[:-1])]
    assert new_run.sum() == plan.num_heads // g * N, "a KV column is split or interleaved"
    assert_ranks_follow_time(plan, head * M + m)


SHAPES = [(1, 1), (17, 1000), (1000, 17), (300, 1000), (1000, 300), (777, 777), (2047, 1500)]


@pytest.mark.parametrize("policy", POLICIES + ("auto",))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_grouped_tables_are_valid_on_awkward_shapes(policy, causal):
    for (sq, sk), (bm, bn), g, batch, sms in itertools.product(SHAPES, [(64, 128), (80, 128), (128, 128)], GROUPS,
                                                                [1, 3], [1, 7, 132]):
        plan = grouped(policy, sq=sq, sk=sk, bm=bm, bn=bn, batch=batch, g=g, causal=causal, sms=sms)
        plan.validate()
        assert plan.group_size == g and plan.num_ctas <= min(sms, batch * HEADS // g * plan.num_n_blocks)
        check_independently(plan)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("g", GROUPS[1:])
def test_grouped_table_is_the_kv_head_table_repeated_per_query_head(policy, causal, g):
    """Q-tile-major: each visit of the KV heads' table, once per query head of the group, with its rank."""
    kw = dict(seqlen_q=1000, seqlen_k=1300, block_m=64, block_n=128, causal=causal, num_sms=11)
    plan = schedule.build(policy, num_heads=3 * HEADS, group_size=g, **kw)
    kv = schedule.build(policy, num_heads=3 * HEADS // g, **kw)
    expanded = np.repeat(kv.visits, g, axis=0)
    expanded[:, 1] = expanded[:, 1] * g + np.tile(np.arange(g), kv.num_visits)
    np.testing.assert_array_equal(plan.visits, expanded)
    np.testing.assert_array_equal(plan.rank, np.repeat(kv.rank, g))
    np.testing.assert_array_equal(plan.cta_start, kv.cta_start * g)


CLOSED_FORMS = [("fa3", False), ("descending", False), ("shift", False), ("symmetric_shift", False),
                ("descending", True), ("symmetric_shift", True)]


@pytest.mark.parametrize("policy,causal", CLOSED_FORMS, ids=[f"{p}-{'causal' if c else 'full'}" for p, c in CLOSED_FORMS])
@pytest.mark.parametrize("n,m,c,r", [(8, 4, 1.0, 0.25), (16, 6, 1.0, 0.25), (12, 2, 2.0, 0.1), (6, 2, 1.0, 1.0)],
                         ids=lambda v: str(v))
@pytest.mark.parametrize("g", [2, 3, 8])
def test_grouped_simulation_equals_closed_form_with_query_heads(policy, causal, n, m, c, r, g):
    """n KV tiles on n SMs, m KV heads of g query heads each: the paper's closed form with g*m heads. The
    start-up waits ((n - 1) r) are paid once, not once per query head."""
    plan = schedule.build(policy, seqlen_q=n * 64, seqlen_k=n * 64, block_m=64, block_n=64, num_heads=m * g,
                          group_size=g, causal=causal, num_sms=n).validate()
    expected = schedule.critical_path(policy, n=n, m=m * g, c=c, r=r, causal=causal)
    assert schedule.simulate(plan, c, r) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("policy,causal", [("shift", False), ("symmetric_shift", True), ("fa3", True)],
                         ids=["shift-full", "symshift-causal", "fa3-causal"])
@pytest.mark.parametrize("g", [2, 8])
def test_wait_free_policies_stay_wait_free_when_grouped(policy, causal, g):
    plan = schedule.build(policy, seqlen_q=16 * 64, seqlen_k=16 * 64, block_m=64, block_n=64, num_heads=6 * g,
                          group_size=g, causal=causal, num_sms=16).validate()
    tl = schedule.timeline(plan)
    np.testing.assert_allclose(tl["reduce_start"] - tl["compute_start"], 1.0)     # every reduction starts on time


def head_major(plan, policy):
    """The same columns on the same CTAs, each column reordered head-major (all Q tiles of its first query head
    in the policy's order, then the next head's), ranks derived from the wait-free timeline as _schedule does."""
    g = plan.group_size
    visits = plan.visits.copy()
    column = (visits[:, 1] // g) * plan.num_n_blocks + visits[:, 2]
    starts = np.flatnonzero(np.r_[True, (column[1:] != column[:-1]) | (visits[1:, 0] != visits[:-1, 0])])
    for a, b in zip(starts, np.r_[starts[1:], plan.num_visits]):
        per_head = (b - a) // g
        q_tiles, heads = plan.visits[a:b:g, 3], plan.visits[a:a + g, 1]
        visits[a:b, 1] = np.repeat(heads, per_head)
        visits[a:b, 3] = np.tile(q_tiles, g)
    s = steps(plan)
    order = np.lexsort((visits[:, 0], tie_sign(policy, plan.causal) * visits[:, 2], s))
    tile = visits[order, 1].astype(np.int64) * plan.num_m_blocks + visits[order, 3]
    by_tile = np.argsort(tile, kind="stable")
    t = tile[by_tile]
    first = np.r_[True, t[1:] != t[:-1]]
    rank = np.empty(plan.num_visits, np.int32)
    rank[order[by_tile]] = np.arange(len(t)) - np.maximum.accumulate(np.where(first, np.arange(len(t)), 0))
    return visits, rank


@pytest.mark.parametrize("policy", ["descending", "shift"])
def test_head_major_columns_are_valid_but_wait_longer(policy):
    """Why columns are Q-tile-major: head-major passes of causal columns of different lengths start at
    different steps and break the policies' phase relations (see _schedule.pyx)."""
    plan = schedule.build(policy, seqlen_q=1024, seqlen_k=1024, block_m=64, block_n=64, num_heads=24,
                          group_size=4, causal=True, num_sms=16).validate()
    visits, rank = head_major(plan, policy)
    args = (visits, rank, plan.cta_start, plan.num_heads, plan.num_m_blocks, plan.column_starts(), True, 1.0, 0.8,
            False, True)
    slower, _, _, _ = _schedule.analyze_table(*args, group_size=4)          # valid (any order inside a column)
    faster = schedule.simulate(plan, 1.0, 0.8, model="engine")
    assert faster <= 1.06 * plan.lower_bound(1.0, 0.8, model="engine") and slower > 1.05 * faster


def test_mqa_longest_column_bounds_the_makespan():
    plan = schedule.build("shift", seqlen_q=1024, seqlen_k=1024, block_m=64, block_n=128, num_heads=8,
                          group_size=8, causal=False, num_sms=132).validate()
    assert plan.num_ctas == 8                                    # one KV head: 8 columns of 8 x 16 visits
    assert plan.lower_bound() == pytest.approx(8 * 16 * 1.25)
    assert schedule.simulate(plan) == pytest.approx(plan.lower_bound())


def test_bad_group_sizes():
    kw = dict(seqlen_q=256, seqlen_k=256, block_m=64, block_n=128, num_heads=12, causal=False, num_sms=4)
    with pytest.raises(ValueError, match=r"group_size \(5\) must divide num_heads \(12\)"):
        schedule.build("shift", group_size=5, **kw)
    with pytest.raises(ValueError, match="group_size"):
        schedule.build("shift", group_size=0, **kw)
    with pytest.raises(TypeError, match="group_size"):
        schedule.build("shift", group_size=2.0, **kw)
    with pytest.raises(ValueError, match="group_size"):
        testing.build_table(0, 256, 256, 64, 128, 12, False, 4, 5)
    plan = schedule.build("shift", group_size=3, **kw)
    assert plan.key != schedule.build("shift", group_size=1, **kw).key and "group_size=3" in repr(plan)


# ----------------------------------------------------------------------------------------------------------------
# corrupted grouped tables
# ----------------------------------------------------------------------------------------------------------------
class Corrupt:
    """A writable copy of a grouped plan's table, checked with the same validator."""

    def __init__(self, plan):
        self.plan = plan
        self.visits, self.rank, self.cta_start = plan.visits.copy(), plan.rank.copy(), plan.cta_start.copy()

    def validate(self, group_size=None):
        g = self.plan.group_size if group_size is None else group_size
        _schedule.analyze_table(self.visits, self.rank, self.cta_start, self.plan.num_heads,
                                self.plan.num_m_blocks, self.plan.column_starts(), group_size=g)


@pytest.fixture
def plan():
    """One batch, 16 query heads in 4 groups, 4 KV tiles, causal: 16 columns of 4 x (5..8) visits on 3 CTAs."""
    return schedule.build("symmetric_shift", seqlen_q=500, seqlen_k=500, block_m=64, block_n=128, num_heads=16,
                          group_size=4, causal=True, num_sms=3).validate()


def test_validate_rejects_a_column_split_across_ctas(plan):
    bad = Corrupt(plan)
    end = bad.cta_start[1]
    bad.cta_start[1] -= 1                                 # CTA 0's last visit now runs on CTA 1
    bad.visits[end - 1, 0] = 1
    with pytest.raises(ValueError, match=r"not in its KV tile.s chain on cta 0|contiguous chain"):
        bad.validate()


def test_validate_rejects_interleaved_columns(plan):
    bad = Corrupt(plan)
    col = (bad.visits[:, 1] // 4) * plan.num_n_blocks + bad.visits[:, 2]
    v = int(np.flatnonzero((col[1:] != col[:-1]) & (bad.visits[1:, 0] == bad.visits[:-1, 0]))[0])
    bad.visits[[v, v + 1]] = bad.visits[[v + 1, v]]      # the first visit of the next column before the last
    bad.rank[[v, v + 1]] = bad.rank[[v + 1, v]]          # one of this column, on the same CTA
    with pytest.raises(ValueError, match="contiguous chain"):
        bad.validate()


def test_validate_rejects_a_foreign_or_repeated_query_head(plan):
    bad = Corrupt(plan)
    v = int(np.flatnonzero(bad.visits[:, 1] == 1)[0])
    bad.visits[v, 1] = 4                                  # head 4 belongs to the next group
    with pytest.raises(ValueError, match="contiguous chain|not in its KV tile.s chain"):
        bad.validate()
    bad = Corrupt(plan)
    bad.visits[v, 1] = 0                                  # head 0 twice on this tile, head 1 never
    with pytest.raises(ValueError, match=r"\(head 0, n_block \d+, m_block \d+\) is visited twice"):
        bad.validate()


def test_validate_rejects_a_duplicate_rank_of_one_query_head(plan):
    bad = Corrupt(plan)
    i, j = np.flatnonzero((bad.visits[:, 1] == 5) & (bad.visits[:, 3] == 7))[:2]
    bad.rank[j] = bad.rank[i]
    with pytest.raises(ValueError, match=r"dQ tile \(head 5, m_block 7\)"):
        bad.validate()


def test_validate_needs_the_right_group_size(plan):
    with pytest.raises(ValueError, match="contiguous chain"):
        Corrupt(plan).validate(group_size=1)           # as MHA, each head's visits are interleaved
    mha = schedule.build("shift", seqlen_q=500, seqlen_k=500, block_m=64, block_n=128, num_heads=16, causal=True,
                         num_sms=3)
    with pytest.raises(ValueError, match="chain"):
        Corrupt(mha).validate(group_size=4)            # the heads of a group run as separate columns
    with pytest.raises(ValueError, match="group_size"):
        Corrupt(mha).validate(group_size=3)


def test_validate_rejects_a_grouped_deadlock():
    plan = schedule.build("fa3", seqlen_q=256, seqlen_k=256, block_m=64, block_n=128, num_heads=2, group_size=2,
                          causal=False, num_sms=2).validate()
    bad = Corrupt(plan)
    # CTA 0 (n = 0) visits (head 0, m 0) first; CTA 1 (n = 1) is made to visit (head 0, m 1) first; then n = 1
    # reduces first into (head 0, m 0) and n = 0 first into (head 0, m 1): each CTA waits for the other.
    a, b = [int(np.flatnonzero((bad.visits[:, 0] == 1) & (bad.visits[:, 1] == 0) & (bad.visits[:, 3] == m))[0])
            for m in (0, 1)]
    bad.visits[[a, b]] = bad.visits[[b, a]]
    for m, first in ((0, 1), (1, 0)):
        for v in np.flatnonzero((bad.visits[:, 1] == 0) & (bad.visits[:, 3] == m)):
            bad.rank[v] = 0 if bad.visits[v, 2] == first else 1
    with pytest.raises(ValueError, match="deadlock"):
        bad.validate()


# ----------------------------------------------------------------------------------------------------------------
# device-table cache and CLI
# ----------------------------------------------------------------------------------------------------------------
def test_device_tables_are_keyed_by_group_size(host_tables):
    args = ("shift", 1000, 1000, 64, 128, 32, True, 7, 0, host_tables)
    mha, gqa = device_tables.per_visit(*args), device_tables.per_visit(*args, group_size=8)
    assert gqa is not mha and gqa is device_tables.per_visit(*args, group_size=8)
    assert len(gqa.visits) == len(mha.visits) and not np.array_equal(gqa.visits, mha.visits)
    plan = next(p for p in device_tables._plans.values() if p.group_size == 8)
    np.testing.assert_array_equal(gqa.visits, plan.visits)


def test_cli_takes_a_group_size(capsys):
    assert cli_schedule.main(["--seqlen-q", "1000", "--heads", "32", "--group-size", "8", "--causal",
                              "--num-sms", "20"]) == 0
    out = capsys.readouterr().out
    assert "in groups of 8 per KV head" in out and all(p in out for p in POLICIES)
    assert cli_schedule.main(["--heads", "6", "--group-size", "4"]) == 2
    assert "group_size (4) must divide num_heads (6)" in capsys.readouterr().err


@pytest.mark.parametrize("seqlen,batch,group,causal,want", [
    (4096, 4, 8, True, "descending"), (16384, 1, 8, False, "descending"), (1024, 16, 16, True, "descending"),
    (16384, 1, 4, True, None), (4096, 4, 2, True, None), (4096, 4, 1, True, None)],
    ids=lambda x: str(x))
def test_auto_takes_descending_for_few_grouped_columns(seqlen, batch, group, causal, want):
    """The measured override: grouped columns with at most AUTO_FEW_GROUPED per CTA go to descending; otherwise
    the engine model decides (want None: whatever it picks, the same as without the override)."""
    from cupy_dash.schedule import auto, compact
    args = (seqlen, seqlen, 64, 128, batch * 16, causal, 132, group, (-1, -1))
    columns = len(compact._build_compact("descending", *args).records)
    few = group > 1 and columns <= schedule.AUTO_FEW_GROUPED * 132
    assert few == (want is not None)
    choice = auto._auto_choice(*args)
    if want is not None:
        assert choice == want
    plan = schedule.build("auto", seqlen_q=seqlen, seqlen_k=seqlen, block_m=64, block_n=128, num_heads=batch * 16,
                          causal=causal, num_sms=132, group_size=group)
    assert plan.policy == choice
    plan.validate()
