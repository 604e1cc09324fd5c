"""The compact varlen backward's tables on the CPU (cupy_dash/cuda/varlen_device.py): walked exactly as the kernel's
ScheduleView does in DASH_COMPACT + DASH_VARLEN builds (kernels_src/compact_view.cuh: the CTA's records in order,
each visit's Q tile from its record's rule, its rank from the per-tile column table), they give the per-visit
table of varlen_schedule.expand, visit for visit and rank for rank, for every policy, GQA, windows, empty and
unequal sequences. The GPU side: tests/gpu/test_gpu_varlen_bwd.py."""
from __future__ import annotations

import numpy as np
import pytest

from cupy_dash import schedule
from cupy_dash.cuda import varlen_device
from varlen_cases import random_problem


# The uploaded compact varlen arrays stated in numpy from a VarlenSchedule: the reference the one-pass Cython
# packing (cupy_dash.schedule.varlen_pack, what the backward uploads) is held to, byte for byte.


def tile_columns(plan) -> tuple:
    """(tile_columns int32 (sum of M_b, 2), seq_tile_start int32 (B + 1,)): for Q tile m of sequence b, row
    ``seq_tile_start[b] + m`` holds the first column (index n_block - n_first[b]) whose range [lo, hi) ends
    after m and the first that starts after m. Every KV head of a sequence has the same ranges (those of its
    first segment's records); a sequence without records gets rows (0, 0). Vectorised over the sequences: one
    search over (sequence, bound) keys, which rise along the first segments' records."""
    B, Hkv = len(plan.seqlens_q), plan.num_kv_heads
    M = np.asarray(plan.num_m_blocks, dtype=np.int64)
    start = np.zeros(B + 1, dtype=np.int64)
    np.cumsum(M, out=start[1:])
    seg_start = np.asarray(plan.seg_col_start, dtype=np.int64)
    r0, r1 = seg_start[0:B * Hkv:Hkv], seg_start[1:B * Hkv + 1:Hkv]
    L = r1 - r0
    first = np.zeros(B + 1, dtype=np.int64)
    np.cumsum(L, out=first[1:])
    rows = np.arange(first[-1]) + np.repeat(r0 - first[:-1], L)     # the first segment's records, sequence order
    big = int(M.max(initial=0)) + 1
    seq_of_row = np.repeat(np.arange(B, dtype=np.int64), L) * big
    seq_of_tile = np.repeat(np.arange(B, dtype=np.int64), M)
    query = seq_of_tile * big + (np.arange(start[-1]) - np.repeat(start[:-1], M))
    out = np.empty((int(start[-1]), 2), dtype=np.int32)
    for col, field in ((0, 2), (1, 1)):                                 # hi, then lo
        keys = seq_of_row + plan.records[rows, field]
        out[:, col] = np.searchsorted(keys, query, side="right") - first[seq_of_tile]
    return out, start.astype(np.int32)


def device_arrays(plan) -> dict:
    """What the kernel reads, keyed by BwdParams field: ``col_records`` int32 (columns, 8) (32-byte rows),
    ``cta_columns`` int32, ``cta_col_start`` int64 (num_ctas + 1,), ``seg_col_start`` int32 (B * Hkv + 1,),
    ``seq_n_first`` int32 (B,), ``tile_columns`` int32 (sum M_b, 2), ``seq_tile_start`` int32 (B + 1,), and the
    scalars ``tie_sign``, ``rank_rule`` (no scan bounds: a counted rank compares with every column of the segment
    that visits the tile). Raises ValueError where the kernel's 32-bit indices would overflow."""
    records = np.ascontiguousarray(plan.records, dtype=np.int32)
    if records.size >= 2 ** 31:
        raise ValueError(f"{len(records)} columns: the kernel indexes records with 32-bit ints")
    tiles, tile_start = tile_columns(plan)
    return {"col_records": records, "cta_columns": np.ascontiguousarray(plan.cta_columns, dtype=np.int32),
            "cta_col_start": np.ascontiguousarray(plan.cta_col_start, dtype=np.int64),
            "seg_col_start": np.ascontiguousarray(plan.seg_col_start, dtype=np.int32),
            "seq_n_first": np.ascontiguousarray(plan.n_first, dtype=np.int32), "tile_columns": tiles,
            "seq_tile_start": tile_start, "tie_sign": int(plan.tie_sign), "rank_rule": int(plan.rank_rule)}


def cta_visit_start(arrays: dict, group_size: int) -> np.ndarray:
    """int64 (num_ctas + 1,): where each CTA's rows start in the per-visit table of the compact ``arrays``
    (device_arrays): CTA c runs (step + hi - lo) x group_size visits up to the end of its last record."""
    records, columns, start = arrays["col_records"], arrays["cta_columns"], arrays["cta_col_start"]
    counts = np.zeros(len(start) - 1, dtype=np.int64)
    busy = start[1:] > start[:-1]
    last = records[columns[start[1:][busy] - 1]].astype(np.int64)
    counts[busy] = (last[:, 0] + last[:, 2] - last[:, 1]) * group_size
    out = np.zeros(len(start), dtype=np.int64)
    np.cumsum(counts, out=out[1:])
    return out



def _tile(rec, s):
    lo, hi, split, rot = rec[1], rec[2], rec[3], rec[4]
    if split < 0:
        return hi - 1 - s
    r = hi - split
    return split + (s + rot) % r if s < r else lo + s - r


def _index(rec, m):
    lo, hi, split, rot = rec[1], rec[2], rec[3], rec[4]
    if split < 0:
        return hi - 1 - m
    r = hi - split
    return (m - split - rot) % r if m >= split else r + m - lo


def _rank(arr, hkv, rec, m):
    """ScheduleView::column_rank of a varlen build (the count as one sum: the lanes' split does not change it)."""
    recs = arr["col_records"].astype(np.int64)
    seg, n = int(rec[6]), int(rec[7])
    seq = seg // hkv
    base, n_first = int(arr["seg_col_start"][seg]), int(arr["seq_n_first"][seq])
    a, b = (base + int(x) for x in arr["tile_columns"][int(arr["seq_tile_start"][seq]) + m])
    me = base + n - n_first
    if arr["rank_rule"] == 1:
        return me - a
    if arr["rank_rule"] == 2:
        return b - 1 - me
    key, tie, tb = rec[0] + _index(rec, m), arr["tie_sign"], arr["tie_sign"] * n
    count = 0
    for j in range(a, b):
        step = recs[j][0] + _index(recs[j], m)
        count += step < key or (step == key and tie * (n_first - base + j) < tb)
    return count


def kernel_walk(arr, g, hkv):
    """(visits (V, 4), rank (V,), cta_start) as the CTAs of the compact varlen build walk their records."""
    recs = arr["col_records"].astype(np.int64)
    cols, cs = arr["cta_columns"], arr["cta_col_start"]
    visits, ranks, starts = [], [], [0]
    for cta in range(len(cs) - 1):
        own = [recs[int(c)] for c in cols[int(cs[cta]):int(cs[cta + 1])]]
        for rec in own:
            for s in range(int(rec[2] - rec[1])):
                m = _tile(rec, s)
                r = _rank(arr, hkv, rec, m)
                for q in range(g):
                    visits.append((cta, int(rec[6]) * g + q, int(rec[7]), m))
                    ranks.append(r)
        starts.append(len(visits))
    return np.array(visits, np.int32).reshape(-1, 4), np.array(ranks, np.int32), np.array(starts, np.int64)


CASES = [  # (seqlens_q, seqlens_k, heads, group_size, causal, window)
    ([1, 17, 128, 300, 1000, 129, 256], [1, 17, 128, 300, 1000, 129, 256], 4, 2, True, (-1, 0)),
    ([0, 64, 200, 5, 513], [10, 0, 777, 5, 400], 4, 2, False, (-1, -1)),
    ([3000, 1, 64], [2048, 2, 64], 2, 1, True, (100, 0)),
    ([700, 900, 50], [700, 900, 50], 8, 4, False, (300, 200)),
]


@pytest.mark.parametrize("policy", ["fa3", "descending", "shift", "symmetric_shift", "auto"])
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("ctas", [3, 132])
def test_kernel_walk_of_compact_varlen_records_equals_expand(policy, case, ctas):
    sq, sk, heads, g, causal, window = CASES[case]
    plan = schedule.build_varlen(policy, sq, sk, block_m=64, block_n=128, heads=heads, causal=causal,
                                 num_sms=ctas, group_size=g, window=window)
    arr = device_arrays(plan)
    assert arr["col_records"].dtype == np.int32 and arr["col_records"].shape[1] == 8
    assert arr["tile_columns"].shape == (int(np.sum(plan.num_m_blocks)), 2)
    visits, rank, cta_start = kernel_walk(arr, g, heads // g)
    ev, er, ec = plan.expand()
    np.testing.assert_array_equal(visits, ev)
    np.testing.assert_array_equal(rank, er)
    np.testing.assert_array_equal(cta_start, ec)


@pytest.mark.parametrize("policy", ["fa3", "descending", "symmetric_shift", "auto"])
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("ctas", [3, 132])
def test_device_expansion_rows_start_where_expand_puts_them(policy, case, ctas):
    """kernels_src/bwd_expand.cu writes CTA c's visit v (the kernel walk above) at row cta_start[c] + v, with
    the host's cta_visit_start: that must be expand's cta_start, and plan(form "expand") must carry it."""
    sq, sk, heads, g, causal, window = CASES[case]
    plan = schedule.build_varlen(policy, sq, sk, block_m=64, block_n=128, heads=heads, causal=causal,
                                 num_sms=ctas, group_size=g, window=window)
    arr = device_arrays(plan)
    np.testing.assert_array_equal(cta_visit_start(arr, g), plan.expand()[2])
    t = varlen_device.plan(policy, np.asarray(sq, np.int64), np.asarray(sk, np.int64), 64, 128, heads, heads // g,
                           causal, ctas, window, "expand")
    assert t.expand and t.compact is not None and t.visits is None and (t.heads, t.kv_heads) == (heads, heads // g)
    np.testing.assert_array_equal(t.cta_start, cta_visit_start(t.arrays, g))
    assert t.cta_start[-1] == t.num_visits


@pytest.mark.parametrize("policy", ["fa3", "descending", "symmetric_shift", "auto"])
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("ctas", [3, 132])
@pytest.mark.parametrize("expand", [False, True], ids=["compact", "expand"])
def test_packed_upload_holds_the_numpy_arrays(policy, case, ctas, expand):
    """varlen_pack.pack (one pass, what plan() uploads) against the numpy statements of the same arrays:
    device_arrays, cta_visit_start and the cu_seqlens, each at its own 256-byte aligned offset of one buffer."""
    from cupy_dash.schedule import varlen_pack
    sq, sk, heads, g, causal, window = CASES[case]
    plan = schedule.build_varlen(policy, sq, sk, block_m=64, block_n=128, heads=heads, causal=causal,
                                 num_sms=ctas, group_size=g, window=window)
    want = device_arrays(plan)
    want["cta_start"] = cta_visit_start(want, g)
    want["cu_seqlens_q"], want["cu_seqlens_k"] = (np.concatenate(([0], np.cumsum(x))) for x in (sq, sk))
    blob, offsets, shapes, visits = varlen_pack.pack(
        plan.records, plan.cta_columns, plan.cta_col_start, plan.seg_col_start, plan.n_first, plan.num_m_blocks,
        plan.seqlens_q, plan.seqlens_k, heads // g, g, expand)
    assert visits == plan.num_visits and blob.dtype == np.uint8
    ends = []
    for name, dtype, off, shape in zip(varlen_pack.NAMES, varlen_pack.DTYPES, offsets, shapes):
        if name == "cta_start" and not expand:
            assert off == -1
            continue
        assert off % 256 == 0 and all(off >= e for e in ends), name
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        ends.append(off + n)
        got = blob[off:off + n].view(dtype).reshape(shape)
        np.testing.assert_array_equal(got, want[name], err_msg=name)
        assert got.dtype == want[name].dtype or name.startswith("cu_"), name
    assert max(ends) <= len(blob)
    t = varlen_device.plan(policy, np.asarray(sq, np.int64), np.asarray(sk, np.int64), 64, 128, heads, heads // g,
                           causal, ctas, window, "expand" if expand else True)
    for name, a in t.arrays.items():
        np.testing.assert_array_equal(a, want[name], err_msg=name)
    np.testing.assert_array_equal(t.cu_q, want["cu_seqlens_q"])
    assert t.compact == (want["tie_sign"], want["rank_rule"])


def test_new_packing_in_one_call_gives_the_builder_and_pack_bytes():
    """varlen_pack.new_packing (what plan() runs for a new packing: windows, shapes, dispatch order, auto's
    choice, records, pack in one Cython call) against varlen_schedule.build_varlen + pack, byte for byte, on
    random packed batches (every policy and auto; causal, full, windows, GQA, empty sequences, few CTAs)."""
    from cupy_dash.schedule import _schedule, varlen_pack
    rng = np.random.default_rng(23)
    codes = _schedule.POLICY_CODES
    names = {v: k for k, v in codes.items()}
    seen = set()
    for i in range(300):
        sq, sk, kw = random_problem(rng)
        policy = ("auto",) + tuple(codes)
        policy = policy[i % len(policy)]
        plan = schedule.build_varlen(policy, sq, sk, **kw)
        hkv, g = kw["heads"] // kw["group_size"], kw["group_size"]
        want = varlen_pack.pack(plan.records, plan.cta_columns, plan.cta_col_start, plan.seg_col_start,
                                plan.n_first, plan.num_m_blocks, plan.seqlens_q, plan.seqlens_k, hkv, g, True)
        c, r = schedule.AUTO_COSTS
        got = varlen_pack.new_packing(
            -1 if policy == "auto" else codes[policy], np.asarray(sq, np.int64), np.asarray(sk, np.int64),
            *schedule.check_window(kw["window"], kw["causal"]), kw["block_m"], kw["block_n"], kw["heads"], g,
            kw["causal"], kw["num_sms"], tuple(codes[p] for p in schedule.AUTO_CANDIDATES), c, r,
            schedule.AUTO_TOLERANCE, schedule.AUTO_FEW_GROUPED, True)
        where = (policy, sq.tolist(), sk.tolist(), kw)
        assert names[got[0]] == plan.policy, where
        np.testing.assert_array_equal(got[1], want[0], err_msg=str(where))
        np.testing.assert_array_equal(got[2], want[1], err_msg=str(where))
        assert got[3] == want[2] and got[4] == want[3] == plan.num_visits, where
        assert got[5:8] == (plan.num_ctas, plan.tie_sign, plan.rank_rule), where
        assert got[8:] == (max(1, int(plan.num_m_blocks.max(initial=0))),
                           max(1, int((-(-np.asarray(sk) // kw["block_n"])).max(initial=0)))), where
        seen.add(plan.policy)
    assert seen == set(codes)


@pytest.mark.parametrize("block_m", [64, 128])
def test_padded_scratch_rows_of_the_sequences_never_overlap(block_m):
    """kernels_src/bwd_rows.cuh's padded scratch rows, per sequence b: floor((cu[b] + b * block_m) / block_m) *
    block_m onward, ceil(len_b / block_m) tiles; launchers.BwdLaunch sizes the scratch for them."""
    import types
    from cupy_dash.cuda import kernels, launchers
    rng = np.random.default_rng(block_m)
    for _ in range(200):
        lens = rng.integers(0, 3 * block_m, size=int(rng.integers(1, 40)))
        if lens.sum() == 0:
            continue
        cu = np.concatenate([[0], np.cumsum(lens)])
        B, total = len(lens), int(cu[-1])
        p = types.SimpleNamespace(B=1, Sq=total, Sk=total, H=2, Hkv=2, D=64, Dv=64, dtype="bfloat16", scale=0.125,
                                  softcap=0.0)
        specs = kernels.bwd_specs("bfloat16", 64, False)
        c = launchers.BwdLaunch(specs, block_m, 128, p, True, 10 ** 9, False, (-1, -1), varlen=(B, int(lens.max())))
        start = (cu[:-1] + np.arange(B) * block_m) // block_m * block_m
        end = start + -(-lens // block_m) * block_m
        assert (end[:-1] <= start[1:]).all() and end[-1] <= c.sq_rounded and c.sq_rounded % block_m == 0
        assert c.num_m_blocks * block_m == c.sq_rounded and c.zero_kv
        assert c.row_grid == (-(-int(lens.max()) // block_m), 2, B)


def test_plans_are_cached_per_packing_and_form():
    lens = np.array([100, 0, 700], dtype=np.int64)
    args = ("fa3", lens, lens, 64, 128, 4, 2, True, 7, (-1, 0))
    a, b = varlen_device.plan(*args), varlen_device.plan(*args)
    c = varlen_device.plan(*args, compact=True)
    assert a is b and c is not a and c.compact and a.visits is not None and c.visits is None
    assert a.num_visits == c.num_visits == len(a.visits)
    np.testing.assert_array_equal(a.cu_q, [0, 100, 100, 800])
