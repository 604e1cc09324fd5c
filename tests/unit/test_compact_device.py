"""CPU tests of the compact-table kernel plumbing: the arrays uploaded for the DASH_COMPACT build, read the way
kernels_src/compact_view.cuh reads them (a Python mirror of its cursor, rule and 32-lane rank count), give
exactly the per-visit table of compact.expand; the parameter block and the specs of the compact build."""
import collections
import itertools
import types

import numpy as np
import pytest

from cupy_dash import schedule
from cupy_dash.cuda import kernels, launchers, tensormap
from cupy_dash.schedule import compact, compact_device


class _Rule:
    """ColumnRule of compact_view.cuh."""
    def __init__(self, lo, hi, split, rot):
        self.lo, self.hi, self.split, self.rot = lo, hi, split, rot

    def tile(self, s):
        if self.split < 0:
            return self.hi - 1 - s
        r = self.hi - self.split
        if s >= r:
            return self.lo + s - r
        x = s + self.rot
        return self.split + (x - r if x >= r else x)

    def index(self, m):
        if self.split < 0:
            return self.hi - 1 - m
        r = self.hi - self.split
        if m < self.split:
            return r + m - self.lo
        x = m - self.split - self.rot
        return x + r if x < 0 else x


def _load(int4, i):
    """ColumnRecord::load: (step, lo, hi, split) (rot, cta, kv_head, n_block) from two int4 words."""
    a, b = int4[2 * i], int4[2 * i + 1]
    return int(a[0]), int(b[2]), int(b[3]), _Rule(*(int(x) for x in (a[1], a[2], a[3], b[0])))


def _column_rank(arr, int4, rec, m):
    """ScheduleView::column_rank, the count split over 32 lanes as the writer warp does it."""
    step, kv_head, n_block, rule = rec
    NC, n_first, tie = arr["columns_per_head"], arr["n_first"], arr["tie_sign"]
    base = kv_head * NC
    me = base + n_block - n_first
    flat = arr["col_records"].reshape(-1)
    a, b = (base + int(x) for x in arr["tile_columns"][m])      # one row per Q tile, shared by the heads
    recs = arr["col_records"][base:base + NC]                    # and what it stands for: this head's records
    assert a == base + int(np.argmax(np.append(recs[:, 2] > m, True)))
    assert b == base + int(np.argmax(np.append(recs[:, 1] > m, True)))
    if arr["rank_rule"] == 1:
        return me - a
    if arr["rank_rule"] == 2:
        return b - 1 - me
    key, tb = step + rule.index(m), tie * n_block

    def lanes(j0, j1):
        total = 0
        for lane in range(32):
            for j in range(j0 + lane, j1, 32):
                w = int4[2 * j]
                st = int(w[0]) + _Rule(int(w[1]), int(w[2]), int(w[3]), int(flat[8 * j + 4])).index(m)
                total += st < key or (st == key and tie * (n_first + j - base) < tb)
        return total

    x, y, x2, y2 = (int(t) for t in arr["scan_bounds"][me])
    ra, rb = a - base, b - base
    overlap = lambda a0, a1, b0, b1: max(0, min(a1, b1) - max(a0, b0))  # noqa: E731
    before = overlap(0, x, ra, rb) + overlap(NC - y, NC, ra, rb)
    return before + lanes(base + max(ra, x), base + min(rb, x2)) + lanes(base + max(ra, NC - y2),
                                                                           base + min(rb, NC - y))


def kernel_mirror(arr, g):
    """(visits (V, 4), rank (V,), cta_start) as the compact build's CTAs walk them (ScheduleView::visit,
    rank_of with its per-KV-head-visit cache)."""
    int4 = arr["col_records"].view(np.int32).reshape(-1, 4)
    cols, cs = arr["cta_columns"], arr["cta_col_start"]
    visits, ranks, starts = [], [], [0]
    for cta in range(len(cs) - 1):
        col, last = int(cs[cta]), int(cs[cta + 1]) - 1
        if last >= col:
            rec = _load(int4, int(cols[col]))
            lstep, _, _, lrule = _load(int4, int(cols[last]))
            end = (lstep + lrule.hi - lrule.lo) * g
            ranked_iv, ranked = -1, 0
            for v in range(end):
                iv, q = v // g, v % g
                while iv >= rec[0] + rec[3].hi - rec[3].lo:
                    col += 1
                    rec = _load(int4, int(cols[col]))
                m = rec[3].tile(iv - rec[0])
                visits.append((cta, rec[1] * g + q, rec[2], m))
                if iv != ranked_iv:
                    ranked, ranked_iv = _column_rank(arr, int4, rec, m), iv
                ranks.append(ranked)
        starts.append(len(visits))
    return np.array(visits, np.int32).reshape(-1, 4), np.array(ranks, np.int32), np.array(starts, np.int64)


CASES = [  # (seqlen_q, seqlen_k, block_m, block_n, heads, g, causal, window, ctas)
    (1000, 1000, 64, 128, 4, 1, True, (-1, -1), 7),
    (777, 1000, 64, 128, 8, 4, True, (-1, -1), 5),
    (1000, 777, 128, 128, 4, 1, False, (-1, -1), 132),
    (1024, 1024, 64, 128, 8, 4, True, (300, 0), 6),
    (1000, 1000, 64, 128, 2, 2, False, (200, 100), 3),
]


@pytest.mark.parametrize("policy", ["fa3", "descending", "shift", "symmetric_shift", "auto"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_kernel_view_of_uploaded_records_equals_expand(policy, case):
    sq, sk, bm, bn, h, g, causal, window, ctas = case
    window = schedule.canonical_window(window, sq, sk, causal)
    plan = schedule.build_compact(policy, seqlen_q=sq, seqlen_k=sk, block_m=bm, block_n=bn, num_heads=h,
                                 causal=causal, num_sms=ctas, group_size=g, window=window)
    arr = compact_device.device_arrays(plan)
    assert arr["col_records"].dtype == np.int32 and arr["col_records"].flags.c_contiguous
    assert arr["col_records"].shape[1] * 4 == 32 and arr["cta_col_start"].dtype == np.int64
    assert (arr["scan_bounds"] is None) == (plan.rank_rule != 0)
    visits, rank, cta_start = kernel_mirror(arr, g)
    ev, er, ec = compact.expand(plan)
    np.testing.assert_array_equal(visits, ev)
    np.testing.assert_array_equal(rank, er)
    np.testing.assert_array_equal(cta_start, ec)
    # and the per-visit path's table (what the non-compact build reads) for the same problem
    ref = schedule.build(plan.policy, seqlen_q=sq, seqlen_k=sk, block_m=bm, block_n=bn, num_heads=h, causal=causal,
                         num_sms=ctas, group_size=g, window=window)
    np.testing.assert_array_equal(visits, ref.visits)
    np.testing.assert_array_equal(rank, ref.rank)


class _FakeDev:
    def __init__(self, ptr):
        self.data = types.SimpleNamespace(ptr=ptr)
        self.nbytes = 0


def _fake_tables(bounds=True):
    t = compact_device.CompactDeviceTables()
    t.col_records, t.cta_columns, t.cta_col_start = _FakeDev(0x1000), _FakeDev(0x2000), _FakeDev(0x3000)
    t.scan_bounds = _FakeDev(0x4000) if bounds else None
    t.tile_columns = _FakeDev(0x5000)
    t.n_first, t.columns_per_head, t.tie_sign, t.rank_rule = 3, 17, -1, 0 if bounds else 1
    t.num_ctas, t.policy, t.device_id, t.nbytes = 5, "shift", 0, 0
    return t


@pytest.mark.parametrize("bounds", [True, False])
def test_bwd_params_carry_compact_fields(bounds, monkeypatch):
    monkeypatch.setattr(tensormap, "bhsd_map", lambda *a, **k: bytes(128))      # no driver here
    p = types.SimpleNamespace(B=1, Sq=1000, Sk=1000, H=4, Hkv=1, D=128, Dv=128, dtype="bfloat16", scale=0.125,
                              softcap=0.0)
    specs = kernels.bwd_specs("bfloat16", 128, True, compact=True)
    c = launchers.BwdLaunch(specs, 64, 128, p, True, 10 ** 9, True, (-1, 0), tables=_fake_tables(bounds))
    strides = (1000 * 4 * 128, 4 * 128, 128)
    kv = (1000 * 128, 128, 128)
    operands = ((0x10000, strides), (0x20000, kv), (0x30000, kv), (0x40000, strides), (0x50000, strides))
    params = launchers.bwd_params(c, operands, 0x6000, 0x100000, (0x7000, 0x8000, 0x9000), (0xD000, 0))[0]
    assert params["visits"] == params["rank"] == params["cta_start"] == 0
    assert (params["col_records"], params["cta_columns"], params["cta_col_start"]) == (0x1000, 0x2000, 0x3000)
    assert params["scan_bounds"] == (0x4000 if bounds else 0) and params["tile_columns"] == 0x5000
    assert (params["n_first"], params["columns_per_head"], params["tie_sign"], params["rank_rule"]) == \
        (3, 17, -1, 0 if bounds else 1)
    assert not c.fold and launchers.bwd_kernels(c)[1] == (specs.main, (5,))  # 512 tile pairs: three launches


def test_compact_specs():
    main = kernels.bwd_specs("bfloat16", 128, True, compact=True).main
    assert dict(main.defines)["DASH_COMPACT"] == 1 and main.label == "bwd_main[bf16,d128,causal,compact]"
    plain = kernels.bwd_specs("bfloat16", 128, True).main
    assert "DASH_COMPACT" not in dict(plain.defines)      # the default build's defines (and cache key) unchanged
    with pytest.raises(ValueError, match="timeline"):
        kernels.bwd_specs("bfloat16", 128, True, timeline=True, compact=True)


def test_opt_in_env(monkeypatch):
    monkeypatch.delenv(compact_device.ENV, raising=False)
    assert not compact_device.enabled()
    for value, on in (("0", False), ("", False), ("1", True)):
        monkeypatch.setenv(compact_device.ENV, value)
        assert compact_device.enabled() is on


@pytest.mark.parametrize("S,heads,causal,big", [(16384, 16, True, False), (65536, 16, True, False),
                                                (131072, 32, True, True), (65536, 64, False, True),
                                                (1 << 20, 16, True, True)])
def test_compact_tables_by_size(S, heads, causal, big, monkeypatch):
    """Without the variable, large problems (per-visit table > AUTO_VISITS visits) take the compact build;
    the variable forces either."""
    monkeypatch.delenv(compact_device.ENV, raising=False)
    args = (S, S, 64, 128, heads, causal, (-1, 0) if causal else (-1, -1))
    visits = compact.num_visits(*args)
    assert compact_device.wanted(*args) is big is (visits > compact_device.AUTO_VISITS)
    for value, on in (("0", False), ("1", True)):
        monkeypatch.setenv(compact_device.ENV, value)
        assert compact_device.wanted(*args) is on


def test_device_arrays_rejects_bad_records():
    plan = schedule.build_compact("fa3", seqlen_q=256, seqlen_k=256, block_m=64, block_n=128, num_heads=2,
                                 causal=True, num_sms=2)
    bad = types.SimpleNamespace(**{k: getattr(plan, k) for k in ("cta_columns", "cta_col_start", "n_first",
                                                                 "columns_per_head", "tie_sign", "rank_rule")},
                                records=np.zeros((3, 7), np.int32), scan_bounds=None)
    with pytest.raises(ValueError, match="columns, 8"):
        compact_device.device_arrays(bad)
    assert list(itertools.islice(compact_device.device_arrays(plan), 4)) == ["col_records", "cta_columns",
                                                                             "cta_col_start", "scan_bounds"]


def test_compact_backward_runs_auto_as_kernel_auto(monkeypatch):
    """device_tables.compact builds KERNEL_AUTO's records for "auto" (counted ranks cost the writer)."""
    from cupy_dash.cuda import device_tables
    from device_fakes import install
    seen = []
    real = schedule.build_compact

    def build(policy, **kw):
        seen.append(policy)
        return real(policy, **kw)
    monkeypatch.setattr(schedule, "build_compact", build)
    monkeypatch.setattr(device_tables, "upload_compact",
                        lambda plan, dev, stream, wait=False: types.SimpleNamespace(policy=plan.policy))
    monkeypatch.setitem(device_tables._caches, "compact", collections.OrderedDict())
    stream = types.SimpleNamespace(synchronize=lambda: None, ptr=0)
    install(monkeypatch)
    t = device_tables.compact("auto", 1000, 1000, 64, 128, 4, True, 7, 0, stream, window=(-1, 0))
    assert seen == [compact_device.KERNEL_AUTO] and t.policy == compact_device.KERNEL_AUTO
    device_tables.compact("shift", 1000, 1000, 64, 128, 4, True, 7, 0, stream, window=(-1, 0))
    assert seen[-1] == "shift"
