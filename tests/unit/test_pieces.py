"""Split KV columns on the host (cupy_dash/schedule/pieces.py): what split_tail builds, what validate and check_arrays
refuse, the workspace and parameter fields a launch gets for them (cupy_dash/cuda/launchers.py)."""
from __future__ import annotations

import types

import numpy as np
import pytest

from cupy_dash import schedule
from cupy_dash.schedule import pieces


def _base(S=3840, heads=64, sms=132, policy="auto", block_m=80, causal=False, **kw):
    return schedule.build(policy, seqlen_q=S, seqlen_k=S, block_m=block_m, block_n=128, num_heads=heads,
                          causal=causal, num_sms=sms, **kw)


@pytest.mark.parametrize("S,heads,busiest,after",
                         [(3840, 64, 720, 704), (15360, 16, 2880, 2816), (1280, 192, 240, 235)],
                         ids=["full3840", "full15360", "full1280"])
def test_split_tail_balances_the_bench_shapes(S, heads, busiest, after):
    base = _base(S, heads)
    plan = pieces.split_tail(base, 3)
    counts = np.diff(plan.cta_start)
    assert np.diff(base.cta_start).max() == busiest and counts.max() == after
    assert plan.pieces.num_split == 72 and plan.pieces.num_pieces == 3
    assert len(plan.pieces.piece_code) == 72 * 3 and sorted(plan.pieces.piece_code) == list(range(216))
    assert plan.key == base.key + (("pieces", 3),)
    assert plan._validated


def test_each_split_column_runs_on_distinct_ctas():
    plan = pieces.split_tail(_base(), 3)
    v, cs, cp = plan.visits, plan.cta_start, plan.pieces.cta_pieces
    where = {}
    for c in range(plan.num_ctas):
        codes = plan.pieces.piece_code[cp[c, 1]:(cp[c + 1, 1] if c + 1 < plan.num_ctas else None)]
        rows = v[cs[c] + cp[c, 0]:cs[c + 1]]
        assert len({tuple(r) for r in rows[:, 1:3]}) == len(codes)
        for code in codes:
            where.setdefault(int(code) // 3, set()).add(c)
    assert all(len(ctas) == 3 for ctas in where.values())


def test_split_tail_leaves_tables_without_a_tail():
    base = _base(1024, 4, sms=8, block_m=64)        # 32 columns on 8 CTAs: four each
    assert pieces.split_tail(base, 3) is base


@pytest.mark.parametrize("args,match", [
    (dict(policy="fa3"), "portable"), (dict(causal=True), "full-mask"), (dict(group_size=4), "full-mask"),
    (dict(window=(100, 100)), "full-mask")], ids=["portable", "causal", "gqa", "window"])
def test_split_tail_refuses_what_the_kernels_do_not_split(args, match):
    with pytest.raises(ValueError, match=match):
        pieces.split_tail(_base(1280, 16, sms=20, block_m=64, **args), 3)


@pytest.mark.parametrize("num_pieces", [1, 17, 2.0, True])
def test_split_tail_checks_num_pieces(num_pieces):
    with pytest.raises(ValueError, match="num_pieces"):
        pieces.split_tail(_base(1280, 16, sms=20, block_m=64), num_pieces)


def _mutated(plan, **changes):
    """A copy of ``plan`` with some of its arrays (visits, rank, cta_start, cta_pieces, piece_code) replaced, not yet
    validated."""
    arrays = {name: changes.get(name, getattr(plan, name)) for name in ("visits", "rank", "cta_start")}
    out = schedule.Schedule(plan.policy, plan.seqlen_q, plan.seqlen_k, plan.block_m, plan.block_n, plan.num_heads,
                            plan.causal, plan.num_sms, *arrays.values())
    out.pieces = plan.pieces._replace(**{k: v for k, v in changes.items() if k not in arrays})
    return out


def _small():
    return pieces.split_tail(_base(1280, 16, sms=24, block_m=64), 3)


def test_validate_refuses_a_duplicated_code():
    plan = _small()
    code = plan.pieces.piece_code.copy()
    code[1] = code[0]
    with pytest.raises(ValueError, match="runs twice"):
        _mutated(plan, piece_code=code).validate()


def test_validate_refuses_a_piece_called_whole():
    plan = _small()
    code = plan.pieces.piece_code.copy()
    code[0] = -1
    with pytest.raises(ValueError, match="not one whole run|must be 3 piece runs"):
        _mutated(plan, piece_code=code).validate()


def test_validate_refuses_ranks_out_of_order():
    plan = _small()
    rank = plan.rank.copy()
    i = int(np.flatnonzero(rank == 1)[0])
    j = int(np.flatnonzero((plan.visits[:, 1] == plan.visits[i, 1]) & (plan.visits[:, 3] == plan.visits[i, 3])
                           & (rank == 0))[0])
    rank[i], rank[j] = 0, 1
    with pytest.raises(ValueError, match="ranks"):
        _mutated(plan, rank=rank).validate()


def test_validate_refuses_a_missing_tile():
    plan = _small()
    visits = plan.visits.copy()
    last = visits[-1].copy()
    visits[-1, 3] = visits[-2, 3]
    assert not np.array_equal(visits[-1], last)
    with pytest.raises(ValueError, match="visited"):
        _mutated(plan, visits=visits).validate()


def test_validate_refuses_a_piece_start_inside_a_run():
    plan = _small()
    cp = plan.pieces.cta_pieces.copy()
    c = int(np.argmax(np.diff(plan.cta_start) > cp[:, 0]))
    cp[c, 0] -= 1
    with pytest.raises(ValueError, match="inside a run|not one whole run|more runs"):
        _mutated(plan, cta_pieces=cp).validate()


@pytest.mark.parametrize("field,value,match", [
    ("piece_code", lambda p: np.append(p.pieces.piece_code[:-1], 10 ** 6), "piece codes must lie"),
    ("cta_pieces", lambda p: np.full_like(p.pieces.cta_pieces, -1), "cta_pieces"),
    ("cta_pieces", lambda p: p.pieces.cta_pieces[:-1], "cta_pieces must be"),
    ("num_pieces", lambda p: 1, "num_pieces"),
], ids=["code_out_of_range", "negative_offsets", "short_cta_pieces", "one_piece"])
def test_check_arrays_bounds_what_the_kernel_indexes(field, value, match):
    plan = _small()
    bad = types.SimpleNamespace(pieces=plan.pieces._replace(**{field: value(plan)}))
    with pytest.raises(ValueError, match=match):
        pieces.check_arrays(bad, np.diff(plan.cta_start))
    assert pieces.check_arrays(types.SimpleNamespace(), np.diff(plan.cta_start)) is None


def test_launch_workspace_and_fields_follow_the_tables():
    from cupy_dash.cuda import kernels, launchers
    plan = _small()
    p = types.SimpleNamespace(B=1, H=16, Hkv=16, Sq=1280, Sk=1280, D=128, Dv=128, softcap=0.0)
    c = launchers.BwdLaunch.__new__(launchers.BwdLaunch)
    c.p, c.tables, c.varlen, c.num_m_blocks = p, None, None, 20
    c._sizes = (1000, 1000, 4000, 80)
    base_bytes, base_offsets = c.work_bytes, c.offsets
    dev = types.SimpleNamespace(data=types.SimpleNamespace(ptr=0x1000))
    c.tables = types.SimpleNamespace(visits=dev, rank=dev, cta_start=dev, pieces=plan.pieces._replace(
        cta_pieces=dev, piece_code=dev))
    slots = plan.pieces.num_split * 3
    assert c.offsets[:4] == base_offsets and c.offsets[4] == base_bytes
    assert c.work_bytes >= base_bytes + slots * kernels.piece_slot_bytes(128) + plan.pieces.num_split * 4
    fields = launchers.bwd_schedule_fields(c.tables)
    assert fields["num_pieces"] == 3 and fields["num_split_columns"] == plan.pieces.num_split
    launchers.check_pieces(c)
    for change in (dict(D=192, Dv=192), dict(softcap=5.0), dict(Dv=64)):
        c.p = types.SimpleNamespace(**dict(vars(p), **change))
        with pytest.raises(ValueError, match="split KV columns need"):
            launchers.check_pieces(c)
    c.p, c.num_m_blocks = types.SimpleNamespace(**dict(vars(p), H=1)), 1
    with pytest.raises(ValueError, match="more than the"):
        launchers.check_pieces(c)


@pytest.mark.parametrize("batch,heads,hdim,sq,sk,ctas,num_pieces,split", [
    (1, 5, 128, 1280, 1280, 13, 3, 11), (2, 3, 128, 1000, 1333, 10, 2, 6), (2, 4, 64, 777, 1024, 12, 3, 4),
    (1, 6, 96, 640, 640, 8, 4, 6), (1, 5, 64, 1536, 1536, 13, 6, 8)],
    ids=["d128", "d128-sq1000-sk1333", "d64", "d96", "d64-sixths"])
def test_the_gpu_cases_split_columns(batch, heads, hdim, sq, sk, ctas, num_pieces, split):
    """tests/gpu/test_gpu_pieces.py's CASES (its test plans take kernels.bwd_tile's tile for their head dim without a
    length: 64 queries, 128 at head dim 64) leave tails to split."""
    from cupy_dash.cuda import kernels
    base = schedule.build("shift", seqlen_q=sq, seqlen_k=sk, block_m=kernels.bwd_tile(hdim, False).block_m,
                          block_n=128, num_heads=batch * heads, causal=False, num_sms=ctas)
    assert pieces.split_tail(base, num_pieces).pieces.num_split == split


@pytest.mark.parametrize("S,heads,causal,busiest,after,split", [
    (8192, 32, True, 848, 824, 97), (16384, 16, True, 1662, 1616, 99), (3840, 64, False, 720, 714, 72)],
    ids=["causal8k", "causal16k", "full3840"])
def test_trim_tail_cuts_at_the_mean_load(S, heads, causal, busiest, after, split):
    base = _base(S, heads, causal=causal)
    plan = pieces.trim_tail(base)
    counts = np.diff(plan.cta_start)
    assert np.diff(base.cta_start).max() == busiest and counts.max() == after
    assert plan.pieces.num_pieces == 2 and plan.pieces.num_split == split
    cut = plan.pieces.piece_code[plan.pieces.piece_code >= 0]
    assert sorted(cut) == list(range(2 * split))
    assert plan.key == base.key + (("trim", 2),) and plan._validated


def test_trim_tail_moves_whole_runs_too():
    base = schedule.build("symmetric_shift", seqlen_q=700, seqlen_k=700, block_m=64, block_n=128, num_heads=6,
                          causal=True, num_sms=5)
    plan = pieces.trim_tail(base)
    assert plan.pieces.num_split == 3 and int((plan.pieces.piece_code == -1).sum()) == 2


def test_trim_tail_refuses_portable_and_gqa_tables():
    with pytest.raises(ValueError, match="portable"):
        pieces.trim_tail(_base(2048, 16, causal=True, policy="fa3", block_m=64))
    with pytest.raises(ValueError, match="MHA"):
        pieces.trim_tail(_base(2048, 16, causal=True, group_size=4, block_m=64))


@pytest.mark.parametrize("policy,m_blocks,block_m,causal,group,window,forced,want", [
    ("auto", 30, 80, False, 1, (-1, -1), None, 3),         # the rule's shortest columns of 80-query tiles
    ("auto", 192, 80, False, 1, (-1, -1), None, 3),
    ("auto", 29, 80, False, 1, (-1, -1), None, 0),         # too short: the slots cost more than the balance gains
    ("auto", 12, 128, False, 1, (-1, -1), None, 3),        # head dim 64's 128-query tiles: from 12
    ("auto", 11, 128, False, 1, (-1, -1), None, 0),
    ("auto", 60, 128, False, 1, (-1, -1), None, 6),        # ... and sixths from 60
    ("auto", 59, 128, False, 1, (-1, -1), None, 3),
    ("auto", 192, 80, True, 1, (-1, 0), None, 0),          # causal: trim_tail measured no gain
    ("auto", 192, 80, False, 2, (-1, -1), None, 0),        # GQA
    ("auto", 192, 80, False, 1, (128, -1), None, 0),       # a window
    ("shift", 192, 80, False, 1, (-1, -1), None, 0),       # a named policy keeps its table
    ("shift", 4, 80, False, 1, (-1, -1), True, 3),         # ... unless forced, at any length
    ("fa3", 192, 80, False, 1, (-1, -1), True, 0),         # portable: never
    ("shift", 2, 80, False, 1, (-1, -1), True, 0),         # fewer Q tiles than pieces
    ("auto", 192, 80, False, 1, (-1, -1), False, 0),       # CUPY_DASH_SPLIT_COLUMNS=0
], ids=["auto30", "auto192", "auto29", "auto12-m128", "auto11-m128", "auto60-m128", "auto59-m128", "causal", "gqa",
        "window", "named", "named-forced", "portable-forced", "short-forced", "off"])
def test_num_pieces_for_follows_the_rule(policy, m_blocks, block_m, causal, group, window, forced, want):
    assert pieces.num_pieces_for(policy, m_blocks, block_m, causal, group, window, forced) == want


def test_split_for_kernel_cuts_only_what_the_kernel_takes():
    base = _base()
    split = pieces.split_for_kernel(base, 3)
    assert split.pieces.num_split == 72 and pieces.split_for_kernel(split, 3) is split
    assert pieces.split_for_kernel(base, 0) is base
    assert pieces.split_for_kernel(_base(policy="fa3"), 3).pieces is None
    # 20 columns of 3 Q tiles on 8 CTAs: 4 columns left over, more than the 3 Q tiles whose preprocess zeroes counters
    short = schedule.build("shift", seqlen_q=192, seqlen_k=128 * 20, block_m=64, block_n=128, num_heads=1,
                           causal=False, num_sms=8)
    assert pieces.split_tail(short, 3).pieces.num_split == 4 and pieces.split_for_kernel(short, 3) is short


def _launch(Sq, D=128, causal=False, H=16, Hkv=None, softcap=0.0, window=None):
    from cupy_dash.cuda import kernels, launchers
    window = window or ((-1, 0) if causal else (-1, -1))
    p = types.SimpleNamespace(B=1, Sq=Sq, Sk=Sq, H=H, Hkv=H if Hkv is None else Hkv, D=D, Dv=D, dtype="bfloat16",
                              scale=0.1, softcap=softcap, device_id=0)
    tile = kernels.bwd_tile(D, causal, seqlen_q=Sq, window=window)
    specs = kernels.bwd_specs("bfloat16", D, causal, seqlen_q=Sq, window=window, softcap=softcap > 0)
    return launchers.BwdLaunch(specs, tile.block_m, tile.block_n, p, True, 1, causal, window)


@pytest.mark.parametrize("Sq,D,kw,want", [
    (15360, 128, {}, 3), (3840, 128, {}, 3), (1280, 128, {}, 0), (15360, 64, {}, 6), (3840, 64, {}, 3),
    (1536, 64, {}, 3), (1280, 64, {}, 0), (15360, 128, dict(causal=True), 0), (15360, 128, dict(Hkv=4), 0),
    (15360, 128, dict(softcap=30.0), 0), (15360, 256, {}, 0)],
    ids=["d128-15360", "d128-3840", "d128-1280", "d64-15360", "d64-3840", "d64-1536", "d64-1280", "causal", "gqa",
         "softcap", "d256"])
def test_the_backward_splits_auto_tables_at_long_full_masks(Sq, D, kw, want, monkeypatch):
    """launchers.split_pieces: the rule where the kernels take split columns (the bench's shapes: 16k tokens)."""
    from cupy_dash import config
    from cupy_dash.cuda import launchers
    monkeypatch.delenv(config.SPLIT_COLUMNS.name, raising=False)
    monkeypatch.delenv(config.SPLIT_PIECES.name, raising=False)
    c = _launch(Sq, D, **kw)
    assert launchers.split_pieces("auto", c) == want
    assert launchers.split_pieces("symmetric_shift", c) == 0
    monkeypatch.setenv(config.SPLIT_PIECES.name, "4")
    assert launchers.split_pieces("auto", c) == (4 if want else 0)
    monkeypatch.setenv(config.SPLIT_COLUMNS.name, "0")
    assert launchers.split_pieces("auto", c) == 0
    monkeypatch.setenv(config.SPLIT_PIECES.name, "17")
    with pytest.raises(ValueError, match="CUPY_DASH_SPLIT_PIECES"):
        launchers.split_pieces("auto", c)


def test_bwd_tables_uploads_the_split_table(monkeypatch):
    """The per-visit tables of an `auto` backward at full 3840 are split_tail's thirds (cached by the split), and
    compact tables are never cut."""
    from cupy_dash import config
    from cupy_dash.cuda import device_tables, launchers
    monkeypatch.delenv(config.SPLIT_COLUMNS.name, raising=False)
    monkeypatch.setattr(device_tables, "_plans", type(device_tables._plans)())
    monkeypatch.setattr(device_tables, "cached", lambda form, key, dev, stream, make, **kw: (*make(stream, []),
                                                                                             None))
    monkeypatch.setattr(device_tables, "upload", lambda plan, *args, **kw: plan)
    monkeypatch.setattr(launchers, "l2_bytes", lambda device_id: 50 << 20)
    c = _launch(3840, H=64)
    plan = launchers.bwd_tables("auto", c, 132, 0, None)
    assert plan.pieces is not None and plan.pieces.num_split == 72 and plan.key[-1] == ("pieces", 3)
    assert launchers.bwd_tables("auto", c, 132, 0, None) is plan
    monkeypatch.setenv(config.SPLIT_COLUMNS.name, "0")
    assert launchers.bwd_tables("auto", c, 132, 0, None).pieces is None
    monkeypatch.delenv(config.SPLIT_COLUMNS.name)
    monkeypatch.setattr(device_tables, "upload_compact", lambda plan, *args, **kw: plan)
    assert not hasattr(launchers.bwd_tables("auto", c, 132, 0, None, compact=True), "pieces")


@pytest.mark.parametrize("sq,sk,block_m,heads,sms", [(3291, 16764, 80, 5, 2), (1520, 2348, 128, 13, 2),
                                                     (4458, 4625, 80, 9, 2), (640, 640, 64, 6, 8)],
                         ids=["ctas2-a", "ctas2-b", "ctas2-c", "ctas8-p6"])
def test_pieces_of_one_column_never_run_as_one(sq, sk, block_m, heads, sms):
    """With few CTAs the least-loaded CTA may already end with a piece of the same column; the two would run as one
    run (round 39 found split_tail raising there): hand_out passes such a CTA over, or the table stays uncut."""
    base = schedule.build("symmetric_shift", seqlen_q=sq, seqlen_k=sk, block_m=block_m, block_n=128,
                          num_heads=heads, causal=False, num_sms=sms)
    for num_pieces in (3, 6):
        plan = pieces.split_tail(base, num_pieces)
        assert plan is base or plan._validated


def test_hand_out_passes_over_a_cta_ending_with_the_column():
    lists = [[(0, 1, 0)], [(0, 2, 0), (0, 2, 1)]]
    assert pieces.hand_out(lists, [[(0, 1, 1)], [(0, 2, 2)]], [(0, 1), (0, 2)]) == [1, 0]
    assert pieces.hand_out([[(0, 1, 0)], [(0, 2, 0)]], [[(0, 3, 0)]] * 2) == [0, 1]      # no columns: by load only
    with pytest.raises(pieces.NoRoom, match="every CTA"):
        pieces.hand_out([[(0, 1, 0)]], [[(0, 1, 1)]], [(0, 1)])


def test_keep_to_keeps_a_prefix_of_whole_runs():
    base = _base()
    lists, tail = pieces.keep_to(base, 672)
    counts = np.diff(base.cta_start)
    for c, lst in enumerate(lists):
        rows = base.visits[base.cta_start[c]:base.cta_start[c] + len(lst), 1:]
        assert len(lst) == 672 and np.array_equal(lst.array(), rows)
    assert len(tail) == int((counts > 672).sum()) and all(len(t) == 48 for _, t in tail)
