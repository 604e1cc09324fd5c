# cython: boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Compact schedules: one record per KV column instead of one row per visit (the format is documented in
cupy_dash/schedule/compact.py, the fields in _records.pxd).

``build_columns`` dispatches the same work units as ``_schedule.build_table`` (shared code: _units.pxd, _heap.pxd)
to the same CTAs, but at column granularity: a column's position in its CTA's list is the CTA's load when the
column is dispatched, and its Q-tile order is a closed-form rule with two parameters, so nothing is done per
visit. ``check_records`` proves, in O(columns), everything ``Schedule.validate`` proves on the expanded table.
"""
import numpy as np
from libc.stdlib cimport malloc, free

from cupy_dash.schedule._heap cimport heap_pop, heap_push
from cupy_dash.schedule._records cimport (RANK_ASC_N, RANK_COUNT, RANK_DESC_N, REC_CTA, REC_FIELDS, REC_HEAD, REC_HI,
                                          REC_LO, REC_N, REC_ROT, REC_SPLIT, REC_STEP, check_cta_lists, check_rule,
                                          cta_lists_into)
from cupy_dash.schedule._schedule import column_ranges
from cupy_dash.schedule._units cimport (POLICY_DESCENDING, POLICY_FA3, UnitShape, pair_rectangle, unit_columns,
                                        unit_shape)

cdef long long INT32_MAX = 0x7fffffff


def build_columns(int policy, long long seqlen_q, long long seqlen_k, long long block_m, long long block_n,
                  long long num_kv_heads, bint causal, long long num_sms, long long window_left=-1,
                  long long window_right=-1):
    """Column records of the g = 1 schedule of num_kv_heads (batch, KV head) pairs.

    Returns (records int32 (num_kv_heads * NC, 8) in (kv head, n_block) order, cta_columns int32 (same length):
    record indices in every CTA's execution order, cta_col_start int64 (G + 1,), loads int64 (G,): visits per
    CTA, meta dict: M, N, n_first, NC, num_ctas, tie_sign, rank_rule)."""
    cdef long long M = (seqlen_q + block_m - 1) // block_m
    cdef long long N = (seqlen_k + block_n - 1) // block_n
    lo_arr, hi_arr = column_ranges(seqlen_q, seqlen_k, block_m, block_n, causal, window_left, window_right)
    cdef long long[::1] lo = lo_arr, hi = hi_arr
    cdef UnitShape sh = unit_shape(policy, M, lo, hi, num_kv_heads, causal, num_sms, window_right)
    cdef long long n_first = sh.n_first, NC = sh.NC, G = sh.G, P = sh.P
    cdef long long ncols = num_kv_heads * NC
    if num_kv_heads > INT32_MAX or M > INT32_MAX or N > INT32_MAX:
        raise ValueError("compact records hold int32 heads and tiles")
    records_arr = np.empty((ncols, REC_FIELDS), dtype=np.int32)
    cdef int[:, ::1] rec = records_arr
    order_arr = np.empty(ncols, dtype=np.int64)          # record indices in dispatch order
    cdef long long[::1] order = order_arr
    loads_arr = np.zeros(G, dtype=np.int64)
    cdef long long[::1] loads = loads_arr
    cdef double* ht = <double*>malloc(G * sizeof(double))
    cdef long long* hc = <long long*>malloc(G * sizeof(long long))
    cdef long long hsize = 0, nd = 0, u, c, h, n0, n1, n, col, L, idx, split, rot, t0
    cdef long long cols[2]
    cdef double t
    for c in range(G):
        heap_push(ht, hc, &hsize, 0.0, c)
    # NOTES: list scheduling at column granularity: the unit goes to the CTA that frees up first (ties: lowest
    # index), exactly as _schedule.build_table, whose heap time is the CTA's load so far, i.e. the position
    # (step) of the unit's first visit in that CTA's list. The rules are those of build_table's step (2).
    for u in range(sh.U):
        unit_columns(policy, sh.spt, sh.paired, sh.mirrored, u, num_kv_heads, n_first, NC, sh.T, P, &h, &n0, &n1)
        heap_pop(ht, hc, &hsize, &t, &c)
        cols[0] = n0
        cols[1] = n1
        for col in range(2 if n1 >= 0 else 1):
            n = cols[col]
            L = hi[n] - lo[n]
            t0 = loads[c]
            if policy == POLICY_FA3 or (sh.mirrored and n >= n_first + sh.T):
                split, rot = lo[n], 0                        # ascending
            elif policy == POLICY_DESCENDING or sh.mirrored or (sh.paired and col == 1):
                split, rot = -1, 0                           # descending (also the short column of a pair)
            elif sh.paired:
                pair_rectangle(u, h * P, G, P, &lo[n_first], &split, &rot)   # rectangle rotation, then triangle
                rot %= M - split
            elif sh.band:
                split, rot = lo[n], (t0 + n + M - hi[n]) % L  # band shift on the CTA's clock
            else:
                split, rot = lo[n], n % L                    # shift: the column's range rotated by n
            idx = h * NC + n - n_first
            rec[idx, REC_STEP] = <int>t0
            rec[idx, REC_LO] = <int>lo[n]
            rec[idx, REC_HI] = <int>hi[n]
            rec[idx, REC_SPLIT] = <int>split
            rec[idx, REC_ROT] = <int>rot
            rec[idx, REC_CTA] = <int>c
            rec[idx, REC_HEAD] = <int>h
            rec[idx, REC_N] = <int>n
            order[nd] = idx
            nd += 1
            loads[c] += L
        heap_push(ht, hc, &hsize, <double>loads[c], c)
    free(ht)
    free(hc)
    for c in range(G):
        if loads[c] > INT32_MAX:
            raise ValueError(f"CTA {c} has {loads[c]} visits: a record's step is int32")
    cta_col_start_arr, fill_arr = np.empty(G + 1, dtype=np.int64), np.empty(G, dtype=np.int64)
    cta_columns_arr = np.empty(ncols, dtype=np.int32)
    cdef long long[::1] cs = cta_col_start_arr, fill = fill_arr
    cdef int[::1] ccols = cta_columns_arr
    cta_lists_into(&rec[0, 0] if ncols else NULL, &order[0] if ncols else NULL, ncols, G,
                   &ccols[0] if ncols else NULL, &cs[0], &fill[0] if G else NULL)
    cdef int rank_rule = RANK_COUNT
    if policy == POLICY_FA3:
        rank_rule = RANK_DESC_N if sh.spt else RANK_ASC_N
    elif policy == POLICY_DESCENDING:
        rank_rule = RANK_ASC_N
    meta = {"M": M, "N": N, "n_first": n_first, "NC": NC, "num_ctas": G, "tie_sign": sh.tb_sign,
            "rank_rule": rank_rule}
    return records_arr, cta_columns_arr, cta_col_start_arr, order_arr, loads_arr, meta


def scan_bounds(records_arr, order_arr, long long NC):
    """int32 (columns, 4) (x, y, x2, y2) per column, which bound the dQ writer's count (see rank_at in
    _compact_view.pyx): every column of the same KV head among its first x and last y visible columns (n order)
    ends before this column starts, so it precedes it at every Q tile; every column outside the first x2 and the
    last y2 starts after this one ends. Only the columns in between, running at some time with this one, need
    their keys compared. order_arr: the records in dispatch order.
    NOTES: for every policy, a head's columns dispatched first are a run of its lowest n, a run of its highest n,
    or both (ascending n, shortest-first descending n, symmetric_shift's pairs (k, NC - 1 - k), a band's mirrored
    triangles), so a prefix of the head's dispatch order is such a pair of runs (x, y); and a column's start times
    never fall along the dispatch order except inside a pair, so the prefix of columns finished before it starts
    and the suffix of columns starting after it ends are found by binary search on prefix maxima of the ends and
    suffix minima of the starts (pmax[0] = -1 <= any start, so the walk down stops at 0)."""
    cdef const int[:, ::1] rec = records_arr
    cdef const long long[::1] order = order_arr
    cdef long long ncols = rec.shape[0], heads = ncols // NC, h, d, i, n, lo_i, hi_i, s, e
    bounds_arr = np.zeros((ncols, 4), dtype=np.int32)
    cdef int[:, ::1] bounds = bounds_arr
    fill_arr = np.zeros(heads + 1, dtype=np.int64)
    hord_arr = np.empty(ncols, dtype=np.int64)         # each head's records in dispatch order
    cdef long long[::1] fill = fill_arr, hord = hord_arr
    for d in range(ncols):
        fill[rec[order[d], REC_HEAD] + 1] += 1
    for h in range(heads):
        fill[h + 1] += fill[h]
    for d in range(ncols):
        h = rec[order[d], REC_HEAD]
        hord[fill[h]] = order[d]
        fill[h] += 1
    xs_arr = np.zeros(NC + 1, dtype=np.int64)
    ys_arr = np.zeros(NC + 1, dtype=np.int64)
    pmax_arr = np.zeros(NC + 1, dtype=np.int64)        # max end over dispatch positions [0, d)
    smin_arr = np.zeros(NC + 1, dtype=np.int64)        # min start over dispatch positions [d, NC)
    cdef long long[::1] xs = xs_arr, ys = ys_arr, pmax = pmax_arr, smin = smin_arr
    for h in range(heads):
        pmax[0] = -1
        for d in range(NC):
            i = hord[h * NC + d]
            n = i - h * NC
            if n == xs[d]:
                xs[d + 1], ys[d + 1] = xs[d] + 1, ys[d]
            elif n == NC - 1 - ys[d]:
                xs[d + 1], ys[d + 1] = xs[d], ys[d] + 1
            else:
                raise ValueError(f"KV head {h}: dispatch order is not runs of lowest and highest n")
            e = rec[i, REC_STEP] + rec[i, REC_HI] - rec[i, REC_LO]
            pmax[d + 1] = e if e > pmax[d] else pmax[d]
        smin[NC] = INT32_MAX + 1
        for d in range(NC - 1, -1, -1):
            s = rec[hord[h * NC + d], REC_STEP]
            smin[d] = s if s < smin[d + 1] else smin[d + 1]
        lo_i = 0
        hi_i = 1
        for d in range(NC):
            i = hord[h * NC + d]
            s = rec[i, REC_STEP]
            e = s + rec[i, REC_HI] - rec[i, REC_LO]
            # largest prefix (<= d) whose columns all end by s; shortest prefix (> d) after which every column
            # starts at e or later. Starts barely fall along the dispatch order: walk from the last answers.
            if lo_i > d:
                lo_i = d
            while lo_i < d and pmax[lo_i + 1] <= s:
                lo_i += 1
            while pmax[lo_i] > s:
                lo_i -= 1
            bounds[i, 0], bounds[i, 1] = <int>xs[lo_i], <int>ys[lo_i]
            if hi_i <= d:
                hi_i = d + 1
            while hi_i < NC and smin[hi_i] < e:
                hi_i += 1
            while hi_i > d + 1 and smin[hi_i - 1] >= e:
                hi_i -= 1
            bounds[i, 2], bounds[i, 3] = <int>xs[hi_i], <int>ys[hi_i]
    return bounds_arr


def check_records(records_arr, cta_columns_arr, cta_col_start_arr, long long num_kv_heads, lo_arr, hi_arr,
                  long long n_first, long long NC, int tie_sign, bounds_arr=None):
    """Raise ValueError (naming the first offending record) unless the records describe a valid table.

    Checked, in O(columns): every visible column (kv head, n) has exactly one record, at index
    kv_head * NC + n - n_first, with its mask range [lo[n], hi[n]); its rule is a bijection onto that range
    (split = -1, or lo <= split < hi and 0 <= rot < hi - split); every record is on exactly one CTA's list, and
    along a list the steps are the positions: 0, then each step the previous one plus that column's length.
    NOTES: this proves what Schedule.validate proves on the expanded table, because ranks are derived, not
    stored: (1) coverage, from the bijections; (2) ranks 0..k-1 per dQ tile, since a tile's visits get distinct
    keys (step, tie_sign * n) (columns of one head have distinct n) and a rank is the number of smaller keys;
    (3) no deadlock: if every unfinished CTA were stuck, take the stuck visit v with the smallest key; the visit
    it waits for has a smaller key, so its CTA's current visit has a key no larger (steps are positions, so a
    CTA's keys rise along its list) and is not stuck, a contradiction.
    With ``bounds_arr`` (scan_bounds), also that every column's bounds are true: the columns they put before it
    end by its start, those they put after it start at or after its end (then the windowed count of
    _compact_view.rank_at equals the full count)."""
    cdef const int[:, ::1] rec = np.ascontiguousarray(records_arr, dtype=np.int32)
    cdef const int[::1] cols = np.ascontiguousarray(cta_columns_arr, dtype=np.int32)
    cdef const long long[::1] cs = np.ascontiguousarray(cta_col_start_arr, dtype=np.int64)
    cdef const long long[::1] lo = np.ascontiguousarray(lo_arr, dtype=np.int64)
    cdef const long long[::1] hi = np.ascontiguousarray(hi_arr, dtype=np.int64)
    cdef long long ncols = num_kv_heads * NC, G = cs.shape[0] - 1, i, j, n, c, step, L, split, rot
    if tie_sign != 1 and tie_sign != -1:
        raise ValueError(f"tie_sign must be +1 or -1, got {tie_sign}")
    if rec.shape[0] != ncols or rec.shape[1] != REC_FIELDS or cols.shape[0] != ncols:
        raise ValueError(f"expected {ncols} records of {REC_FIELDS} int32 and {ncols} list entries, got "
                         f"{records_arr.shape} and {cta_columns_arr.shape}")
    if G < 1 or cs[0] != 0 or cs[G] != ncols:
        raise ValueError("cta_col_start must rise from 0 to the number of records")
    for n in range(lo.shape[0]):
        if (lo[n] < hi[n]) != (n_first <= n < n_first + NC):
            raise ValueError(f"KV tile {n}: visible columns must be n_first .. n_first + NC - 1 "
                             f"({n_first}, {NC})")
    for i in range(ncols):
        n = n_first + i % NC
        split = rec[i, REC_SPLIT]
        rot = rec[i, REC_ROT]
        if rec[i, REC_HEAD] != i // NC or rec[i, REC_N] != n:
            raise ValueError(f"record {i}: (kv head {rec[i, REC_HEAD]}, n_block {rec[i, REC_N]}) belongs at "
                             f"another index (expected kv head {i // NC}, n_block {n})")
        if rec[i, REC_LO] != lo[n] or rec[i, REC_HI] != hi[n]:
            raise ValueError(f"record {i}: range [{rec[i, REC_LO]}, {rec[i, REC_HI]}) is not KV tile {n}'s "
                             f"visible range [{lo[n]}, {hi[n]})")
        check_rule(i, split, rot, lo[n], hi[n])
    check_cta_lists(rec, cols, cs, ncols, G)
    if bounds_arr is not None:
        _check_bounds(rec, np.ascontiguousarray(bounds_arr, dtype=np.int32), num_kv_heads, NC)


cdef _check_bounds(const int[:, ::1] rec, const int[:, ::1] bd, long long heads, long long NC):
    if bd.shape[0] != heads * NC or bd.shape[1] != 4:
        raise ValueError(f"scan bounds must be ({heads * NC}, 4), got ({bd.shape[0]}, {bd.shape[1]})")
    cdef long long levels = 1, h, n, i, k, x, y, x2, y2, s, e, lo_i, hi_i, w, a, b
    while (1 << levels) <= NC:
        levels += 1
    pmax_arr = np.zeros(NC + 1, dtype=np.int64)          # max end over n < x
    smax_arr = np.zeros(NC + 1, dtype=np.int64)          # max end over n >= NC - y
    table_arr = np.zeros((levels, NC), dtype=np.int64)   # sparse table: min start over [n, n + 2^k)
    cdef long long[::1] pmax = pmax_arr, smax = smax_arr
    cdef long long[:, ::1] table = table_arr
    for h in range(heads):
        pmax[0] = smax[0] = -1
        for n in range(NC):
            i = h * NC + n
            e = rec[i, REC_STEP] + rec[i, REC_HI] - rec[i, REC_LO]
            pmax[n + 1] = e if e > pmax[n] else pmax[n]
            table[0, n] = rec[i, REC_STEP]
            i = h * NC + NC - 1 - n
            e = rec[i, REC_STEP] + rec[i, REC_HI] - rec[i, REC_LO]
            smax[n + 1] = e if e > smax[n] else smax[n]
        for k in range(1, levels):
            for n in range(NC - (1 << k) + 1):
                a, b = table[k - 1, n], table[k - 1, n + (1 << (k - 1))]
                table[k, n] = a if a < b else b
        for n in range(NC):
            i = h * NC + n
            x, y, x2, y2 = bd[i, 0], bd[i, 1], bd[i, 2], bd[i, 3]
            s = rec[i, REC_STEP]
            e = s + rec[i, REC_HI] - rec[i, REC_LO]
            if not (0 <= x <= x2 and 0 <= y <= y2 and x2 + y2 <= NC):
                raise ValueError(f"record {i}: scan bounds {x, y, x2, y2} are not nested runs of {NC} columns")
            if pmax[x] > s or smax[y] > s:
                raise ValueError(f"record {i}: scan bounds put a column before it that ends after it starts")
            lo_i, hi_i = x2, NC - y2                     # these must all start at e or later
            if hi_i > lo_i:
                k = 0
                while (2 << k) <= hi_i - lo_i:
                    k += 1
                a, b = table[k, lo_i], table[k, hi_i - (1 << k)]
                if (a if a < b else b) < e:
                    raise ValueError(f"record {i}: scan bounds put a column after it that starts before it ends")
