# cython: boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Compact schedules: one record per KV column instead of one row per visit (the format is documented in
cupy_dash/compact.py, the fields in _compact_rule.pxi).

``build_columns`` dispatches the same work units as ``_schedule.build_table`` (shared code: _units.pxi, _heap.pxi)
to the same CTAs, but at column granularity: a column's position in its CTA's list is the CTA's load when the
column is dispatched, and its Q-tile order is a closed-form rule with two parameters, so nothing is done per
visit. ``check_records`` proves, in O(columns), everything ``Schedule.validate`` proves on the expanded table.
"""
import numpy as np
from libc.stdlib cimport malloc, free

from cupy_dash._schedule import column_ranges

include "_heap.pxi"
include "_units.pxi"
include "_compact_rule.pxi"

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
                pair_rectangle(u, h, G, P, n_first, lo, &split, &rot)   # rectangle rotation, then triangle
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
    # the CTAs' lists: a stable counting sort of the dispatch order by CTA
    cta_col_start_arr = np.zeros(G + 1, dtype=np.int64)
    cdef long long[::1] cs = cta_col_start_arr
    for idx in range(ncols):
        cs[rec[idx, REC_CTA] + 1] += 1
    for c in range(G):
        cs[c + 1] += cs[c]
    fill_arr = cta_col_start_arr[:G].copy()
    cdef long long[::1] fill = fill_arr
    cta_columns_arr = np.empty(ncols, dtype=np.int32)
    cdef int[::1] cta_columns = cta_columns_arr
    for u in range(ncols):
        c = rec[order[u], REC_CTA]
        cta_columns[fill[c]] = <int>order[u]
        fill[c] += 1
    cdef int rank_rule = RANK_COUNT
    if policy == POLICY_FA3:
        rank_rule = RANK_DESC_N if sh.spt else RANK_ASC_N
    elif policy == POLICY_DESCENDING:
        rank_rule = RANK_ASC_N
    meta = {"M": M, "N": N, "n_first": n_first, "NC": NC, "num_ctas": G, "tie_sign": sh.tb_sign,
            "rank_rule": rank_rule}
    return records_arr, cta_columns_arr, cta_col_start_arr, loads_arr, meta


def check_records(records_arr, cta_columns_arr, cta_col_start_arr, long long num_kv_heads, lo_arr, hi_arr,
                  long long n_first, long long NC, int tie_sign):
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
    CTA's keys rise along its list) and is not stuck, a contradiction."""
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
        if not (split == -1 and rot == 0 or lo[n] <= split < hi[n] and 0 <= rot < hi[n] - split):
            raise ValueError(f"record {i}: split {split}, rot {rot} do not give an order of [{lo[n]}, {hi[n]})")
    seen_arr = np.zeros(ncols, dtype=np.uint8)
    cdef unsigned char[::1] seen = seen_arr
    for c in range(G):
        if cs[c + 1] < cs[c]:
            raise ValueError(f"cta_col_start falls at CTA {c}")
        step = 0
        for j in range(cs[c], cs[c + 1]):
            i = cols[j]
            if i < 0 or i >= ncols:
                raise ValueError(f"CTA {c}'s list names record {i}, outside 0..{ncols - 1}")
            if seen[i]:
                raise ValueError(f"record {i} is on a CTA list twice (again on CTA {c})")
            seen[i] = 1
            if rec[i, REC_CTA] != c:
                raise ValueError(f"record {i} says CTA {rec[i, REC_CTA]} but is on CTA {c}'s list")
            if rec[i, REC_STEP] != step:
                raise ValueError(f"record {i} on CTA {c}: step {rec[i, REC_STEP]}, but its position there is {step}")
            L = rec[i, REC_HI] - rec[i, REC_LO]
            step += L
            if step > INT32_MAX:
                raise ValueError(f"CTA {c}: more than 2^31 - 1 visits")
