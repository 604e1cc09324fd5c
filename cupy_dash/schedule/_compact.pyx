# cython: boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""What only fixed-length column records have (built by _varlen_sched.pyx; fields in _records.pxd):
``scan_bounds``, the dQ writer's scan bounds from the dispatch order, and ``check_records``, which proves in
O(columns) everything ``Schedule.validate`` proves on the expanded table (docs/schedules.md, "Compact records").
"""
import numpy as np

from cupy_dash.schedule._records cimport (REC_FIELDS, REC_HEAD, REC_HI, REC_LO, REC_N, REC_ROT, REC_SPLIT, REC_STEP,
                                          check_cta_lists, check_rule)

cdef long long INT32_MAX = 0x7fffffff


def scan_bounds(records_arr, order_arr, long long NC):
    """int32 (columns, 4) (x, y, x2, y2) per column, which bound the dQ writer's count (docs/schedules.md, "Scan
    bounds"; rank_at in _compact_view.pyx). order_arr: the records in dispatch order.
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
    NOTES: since ranks are derived, not stored, this proves coverage, ranks 0..k-1 per dQ tile and no deadlock
    (docs/schedules.md, "Compact records"). With ``bounds_arr`` (scan_bounds), also that every column's bounds
    are true: the columns they put before it end by its start, those they put after it start at or after its end
    (then the windowed count of _compact_view.rank_at equals the full count)."""
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
