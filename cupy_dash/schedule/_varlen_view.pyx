# cython: boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The per-visit table of column records, fixed-length or packed, in O(visits + columns * CTAs) without sorting
the visits: a sweep over the steps t meets the visits in (step, tie_sign * n) key order, CTAs kept sorted by their
current column's (segment, tie_sign * n), one rank counter per dQ tile (docs/schedules.md, "Where the code is");
the rows are then written CTA by CTA, sequentially.
"""
import numpy as np
from libc.stdlib cimport malloc, calloc, free
from libc.string cimport memmove

from cupy_dash.schedule._records cimport (REC_FIELDS, REC_HEAD, REC_HI, REC_LO, REC_N, REC_ROT, REC_SPLIT, check_rule,
                                          rule_tile)

cdef long long N_OFFSET = (<long long>1) << 31     # tie_sign * n + N_OFFSET > 0 (n < 2^31)


cdef struct Cta:
    # one CTA in the sweep. Its current column col (list position cur, order key ckey: segment, then
    # tie_sign * n), started at step t0, walks Q tile m by dm until step brk (the end of a linear piece of the
    # rule); cnt: its segment's dQ tile counters (index m); out: its ranks (index t); nxt: the next CTA whose
    # column ends at the same step
    int* cnt
    int* out
    const int* col
    long long m, dm, brk, t0, ckey, cur, nxt


cdef inline void walk_from(Cta* x, long long t) noexcept:
    """Set the walk of CTA x at step t to its column's rule (_records.pxd) from visit s = t - t0 on: one
    linear piece of the rule (the descending walk, or [split + rot, hi), [split, split + rot), [lo, split))."""
    cdef const int* col = x.col
    cdef long long s = t - x.t0, split = col[REC_SPLIT], r = col[REC_HI] - split
    x.m = rule_tile(col, s)
    x.dm = -1 if split < 0 else 1
    if split >= 0 and s < r - col[REC_ROT]:
        x.brk = x.t0 + r - col[REC_ROT]
    elif split >= 0 and s < r:
        x.brk = x.t0 + r
    else:
        x.brk = x.t0 + col[REC_HI] - col[REC_LO]


cdef inline long long find(const long long* order, const Cta* cta, long long A, long long key) noexcept:
    """First position in order[0:A] (CTAs sorted by ckey) whose key is not below ``key``."""
    cdef long long lo = 0, hi = A, mid
    while lo < hi:
        mid = (lo + hi) >> 1
        if cta[order[mid]].ckey < key:
            lo = mid + 1
        else:
            hi = mid
    return lo


cdef int check_column(const int[:, ::1] rec, long long idx, long long ncols, long long S, long long Hkv,
                      const long long[::1] num_m_blocks) except -1:
    """Raise ValueError unless record idx can be walked without leaving the tables (its segment, range and
    rule)."""
    cdef long long seg, lo, hi
    if idx < 0 or idx >= ncols:
        raise ValueError(f"a CTA list names record {idx}, outside 0..{ncols - 1}")
    seg, lo, hi = rec[idx, REC_HEAD], rec[idx, REC_LO], rec[idx, REC_HI]
    if seg < 0 or seg >= S or not 0 <= lo < hi <= num_m_blocks[seg // Hkv]:
        raise ValueError(f"record {idx}: segment {seg} or range [{lo}, {hi}) outside the batch")
    return check_rule(idx, rec[idx, REC_SPLIT], rec[idx, REC_ROT], lo, hi)


def expand(records, cta_columns, cta_col_start, const long long[::1] num_m_blocks, long long Hkv, long long g,
           int tie_sign):
    """(visits int32 (V, 4) rows (cta, bh, n_block, m_block) in every CTA's execution order, rank int32 (V,),
    cta_start int64 (num_ctas + 1,)) of records int32 (columns, 8), cta_columns int32 (columns,), cta_col_start
    int64 (num_ctas + 1,) and the sequences' Q tiles num_m_blocks int64 (B,): visit row (cta_start[c] + t) * g + j
    is CTA c's t-th visit for query head seg * g + j; ranks from the (step, tie_sign * n) keys of every dQ tile,
    steps taken as the positions in the lists (as in a table that check_varlen accepts)."""
    cdef const int[:, ::1] rec = records
    cdef const int[::1] cols = cta_columns
    cdef const long long[::1] cs = cta_col_start
    cdef long long G = cs.shape[0] - 1, ncols = rec.shape[0], S = num_m_blocks.shape[0] * Hkv
    cdef long long c, j, seg, T = 0, V = 0
    if rec.shape[1] != REC_FIELDS or cols.shape[0] != ncols or G < 0 or g < 1 or Hkv < 1:
        raise ValueError("inconsistent varlen records")
    cta_start_arr = np.zeros(G + 1, dtype=np.int64)
    cdef long long[::1] cta_start = cta_start_arr
    cdef long long* tile_base = <long long*>malloc((S + 1) * sizeof(long long))
    cdef Cta* cta = <Cta*>malloc((G + 1) * sizeof(Cta))
    cdef long long* order = <long long*>malloc((G + 1) * sizeof(long long))     # the CTAs with a column, by ckey
    cdef long long* ends = NULL          # the CTAs whose column ends at step t: ends[t], then cta[c].nxt (-1: none)
    cdef int* count = NULL               # ranks handed out per dQ tile (segment seg's from tile_base[seg])
    cdef int* ranks = NULL               # the ranks, CTA c's t-th at cta[c].out[t]
    try:
        if tile_base == NULL or cta == NULL or order == NULL:
            raise MemoryError()
        tile_base[0] = 0
        for seg in range(S):
            tile_base[seg + 1] = tile_base[seg] + num_m_blocks[seg // Hkv]
        for c in range(G):
            if cs[c + 1] < cs[c] or cs[c] < 0 or cs[c + 1] > ncols:
                raise ValueError("cta_col_start must rise within the lists")
            for j in range(cs[c], cs[c + 1]):
                check_column(rec, cols[j], ncols, S, Hkv, num_m_blocks)
                V += rec[cols[j], REC_HI] - rec[cols[j], REC_LO]
            T = V - cta_start[c] if V - cta_start[c] > T else T
            cta_start[c + 1] = V
            cta[c].cur = cs[c] - 1
        visits_arr = np.empty((V * g, 4), dtype=np.int32)
        rank_arr = np.empty(V * g, dtype=np.int32)
        ends = <long long*>malloc((T + 1) * sizeof(long long))
        count = <int*>calloc(tile_base[S] + 1, sizeof(int))
        # NOTES: 16 ints (a cache line) between the CTAs' rank runs, so that the sweep's writes, one per CTA and
        # step, do not all map to one cache set when the CTAs' loads are multiples of 4 KB apart (full masks)
        ranks = <int*>malloc((V + 16 * G + 1) * sizeof(int))
        if ends == NULL or count == NULL or ranks == NULL:
            raise MemoryError()
        for j in range(T + 1):
            ends[j] = -1
        for c in range(G):
            cta[c].out = ranks + cta_start[c] + 16 * c
            if cs[c + 1] > cs[c]:
                cta[c].nxt, ends[0] = ends[0], c
        sweep(rec, cols, cs, T, tie_sign, tile_base, cta, order, ends, count)
        write_rows(rec, cols, cs, visits_arr, rank_arr, g, ranks)
    finally:
        free(tile_base)
        free(cta)
        free(order)
        free(ends)
        free(count)
        free(ranks)
    for c in range(G + 1):
        cta_start[c] *= g
    return visits_arr, rank_arr, cta_start_arr


cdef void sweep(const int[:, ::1] rec, const int[::1] cols, const long long[::1] cs, long long T, int tie_sign,
                const long long* tile_base, Cta* cta, long long* order, long long* ends, int* count) noexcept:
    """The sweep over the steps t (module docstring); order[0:A]: the CTAs with a column, sorted by ckey."""
    cdef long long A = 0, t, c, e, i, p, r, m
    cdef Cta* x
    for t in range(T):
        c = ends[t]
        while c >= 0:
            x = &cta[c]
            e = x.nxt
            if x.cur >= cs[c]:                           # its column ends: leave the order
                p = find(order, cta, A, x.ckey)
                while order[p] != c:
                    p += 1
                memmove(&order[p], &order[p + 1], (A - p - 1) * sizeof(long long))
                A -= 1
            x.cur += 1
            if x.cur < cs[c + 1]:                        # its next column starts: enter the order at its key
                x.col, x.t0 = &rec[cols[x.cur], 0], t
                x.cnt = count + tile_base[x.col[REC_HEAD]]
                x.ckey = (<long long>x.col[REC_HEAD] << 32) + tie_sign * <long long>x.col[REC_N] + N_OFFSET
                walk_from(x, t)
                p = find(order, cta, A, x.ckey)
                memmove(&order[p + 1], &order[p], (A - p) * sizeof(long long))
                order[p] = c
                A += 1
                r = t + x.col[REC_HI] - x.col[REC_LO]
                x.nxt, ends[r] = ends[r], c
            c = e
        for i in range(A):
            x = &cta[order[i]]
            if t == x.brk:
                walk_from(x, t)
            m = x.m
            x.m = m + x.dm
            r = x.cnt[m]
            x.cnt[m] = <int>(r + 1)
            x.out[t] = <int>r


cdef inline void emit(int* v, int* rank, long long c, long long bh0, long long n, long long m, long long g,
                      int r) noexcept:
    """g rows (c, bh0 + q, n, m) of rank r at v, rank."""
    cdef long long q
    for q in range(g):
        v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3] = <int>c, <int>(bh0 + q), <int>n, <int>m
        rank[q] = r


cdef void write_rows(const int[:, ::1] rec, const int[::1] cols, const long long[::1] cs, int[:, ::1] visits,
                     int[::1] rank, long long g, const int* ranks) noexcept:
    """The rows of the table in order (CTA by CTA, sequential writes), ranks from the sweep's buffer; each
    column's walk in its rule's pieces (_records.pxd)."""
    cdef long long c, j, m, lo, hi, split, rot, bh0, n, row = 0, k
    cdef int* v = &visits[0, 0] if visits.shape[0] else NULL
    cdef int* rk = &rank[0] if rank.shape[0] else NULL
    cdef const int* col
    for c in range(cs.shape[0] - 1):
        k = row // g + 16 * c
        for j in range(cs[c], cs[c + 1]):
            col = &rec[cols[j], 0]
            lo, hi, split, rot = col[REC_LO], col[REC_HI], col[REC_SPLIT], col[REC_ROT]
            bh0, n = <long long>col[REC_HEAD] * g, col[REC_N]
            if split < 0:
                for m in range(hi - 1, lo - 1, -1):
                    emit(v + 4 * row, rk + row, c, bh0, n, m, g, ranks[k])
                    row += g
                    k += 1
                continue
            for m in range(split + rot, hi):
                emit(v + 4 * row, rk + row, c, bh0, n, m, g, ranks[k])
                row += g
                k += 1
            for m in range(split, split + rot):
                emit(v + 4 * row, rk + row, c, bh0, n, m, g, ranks[k])
                row += g
                k += 1
            for m in range(lo, split):
                emit(v + 4 * row, rk + row, c, bh0, n, m, g, ranks[k])
                row += g
                k += 1
