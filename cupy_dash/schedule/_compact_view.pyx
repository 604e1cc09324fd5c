# cython: boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""What the backward kernel computes from compact records alone, as a CPU reference: ``visit_of`` (the producer's
walk of a CTA's column list), ``rank_of`` (the dQ writer: counted, windowed by the scan bounds, or the rank rule's
closed form) and ``window_scan_stats`` (what the windowed count costs). docs/schedules.md, "Compact records".
"""
import numpy as np

from cupy_dash.schedule._records cimport (RANK_ASC_N, RANK_COUNT, RANK_DESC_N, REC_FIELDS, REC_HEAD, REC_HI, REC_LO,
                                          REC_N, REC_STEP, rule_index, rule_tile)

cdef enum:
    MODE_KERNEL = 0
    MODE_COUNT = 1
    MODE_WINDOW = 2

MODES = {"kernel": MODE_KERNEL, "count": MODE_COUNT, "window": MODE_WINDOW}


cdef struct View:
    const int* rec              # records, REC_FIELDS int32 each, in (kv head, n_block) order
    const int* bounds           # scan bounds (x, y, x2, y2) per record (NULL: count over every column)
    const int* cols             # cta_columns
    const long long* cs         # cta_col_start
    long long num_ctas, n_first, NC, g
    int tie_sign, rank_rule


cdef inline long long first_above(const int* rec, int field, long long lo, long long hi, long long m) noexcept nogil:
    """The first record index in [lo, hi) whose ``field`` is > m, or hi (the records are sorted by that field
    over the range): a binary search, as the kernel's dQ writer does it."""
    cdef long long mid
    while lo < hi:
        mid = (lo + hi) >> 1
        if rec[mid * REC_FIELDS + field] > m:
            hi = mid
        else:
            lo = mid + 1
    return lo


cdef View make_view(const int[:, ::1] rec, const int[::1] cols, const long long[::1] cs, long long n_first,
                    long long NC, long long g, int tie_sign, int rank_rule, const int[:, ::1] bounds=None):
    cdef View v
    if rec.shape[1] != REC_FIELDS or cols.shape[0] != rec.shape[0] or cs.shape[0] < 2 or NC < 1 or g < 1:
        raise ValueError("inconsistent compact records")
    if bounds is not None and (bounds.shape[0] != rec.shape[0] or bounds.shape[1] != 4):
        raise ValueError("scan bounds must be (columns, 4)")
    v.bounds = &bounds[0, 0] if bounds is not None and bounds.shape[0] else NULL
    v.rec = &rec[0, 0] if rec.shape[0] else NULL
    v.cols = &cols[0] if cols.shape[0] else NULL
    v.cs = &cs[0]
    v.num_ctas = cs.shape[0] - 1
    v.n_first, v.NC, v.g, v.tie_sign, v.rank_rule = n_first, NC, g, tie_sign, rank_rule
    return v


cdef inline bint visit_at(const View* v, long long cta, long long i, long long* head, long long* n,
                          long long* m) noexcept nogil:
    """Producer / MMA warpgroups: the i-th visit of CTA cta (grouped: query-head visits). False if past the end."""
    cdef long long iv = i // v.g, j, L
    cdef const int* r
    for j in range(v.cs[cta], v.cs[cta + 1]):
        r = v.rec + <long long>v.cols[j] * REC_FIELDS
        L = r[REC_HI] - r[REC_LO]
        if iv < r[REC_STEP] + L:
            head[0] = r[REC_HEAD] * v.g + i % v.g
            n[0] = r[REC_N]
            m[0] = rule_tile(r, iv - r[REC_STEP])
            return True
    return False


cdef inline long long overlap(long long a0, long long a1, long long b0, long long b1) noexcept nogil:
    cdef long long lo = a0 if a0 > b0 else b0, hi = a1 if a1 < b1 else b1
    return hi - lo if hi > lo else 0


cdef inline long long count_smaller(const View* v, long long j0, long long j1, long long m, long long key,
                                    long long tb) noexcept nogil:
    cdef long long j, st, cnt = 0
    cdef const int* q
    for j in range(j0, j1):
        q = v.rec + j * REC_FIELDS
        st = q[REC_STEP] + rule_index(q, m)
        if st < key or (st == key and v.tie_sign * q[REC_N] < tb):
            cnt += 1
    return cnt


cdef inline long long rank_at(const View* v, long long head, long long m, long long n, int mode,
                              long long* scanned) noexcept nogil:
    """dQ writer: rank of visit (head, m, n), assumed to be in the table. The columns of KV head head // g that
    visit Q tile m are one run of records [a, b) (range ends rise with n): two binary searches find it.
    mode MODE_COUNT: count the run's columns whose key (step at which they reach m, tie_sign * n) is smaller.
    MODE_WINDOW: count wholesale the columns the scan bounds of column n put before it, skip those they put after
    it, compare only the rest. MODE_KERNEL: the closed form of the table's rank rule, else MODE_WINDOW.
    scanned = records whose keys were compared."""
    cdef long long base = head // v.g * v.NC, me = base + n - v.n_first, a, b, lo_i, hi_i, cnt
    cdef long long tb = v.tie_sign * n, NC = v.NC
    cdef const int* r = v.rec + me * REC_FIELDS
    cdef const int* bd
    cdef long long key = r[REC_STEP] + rule_index(r, m)
    a = first_above(v.rec, REC_HI, base, me, m)           # first record with hi > m (me qualifies)
    b = first_above(v.rec, REC_LO, me + 1, base + NC, m)   # first record with lo > m
    scanned[0] = 0
    if mode == MODE_KERNEL and v.rank_rule == RANK_ASC_N:
        return me - a
    if mode == MODE_KERNEL and v.rank_rule == RANK_DESC_N:
        return b - 1 - me
    if mode == MODE_COUNT or v.bounds == NULL:
        scanned[0] = b - a
        return count_smaller(v, a, b, m, key, tb)
    bd = v.bounds + me * 4
    a -= base
    b -= base
    cnt = overlap(0, bd[0], a, b) + overlap(NC - bd[1], NC, a, b)
    lo_i = a if a > bd[0] else bd[0]
    hi_i = b if b < bd[2] else bd[2]
    if hi_i > lo_i:
        cnt += count_smaller(v, base + lo_i, base + hi_i, m, key, tb)
        scanned[0] += hi_i - lo_i
    lo_i = a if a > NC - bd[3] else NC - bd[3]
    hi_i = b if b < NC - bd[1] else NC - bd[1]
    if hi_i > lo_i:
        cnt += count_smaller(v, base + lo_i, base + hi_i, m, key, tb)
        scanned[0] += hi_i - lo_i
    return cnt


def visit_of(records, cta_columns, cta_col_start, long long n_first, long long NC, long long g, long long cta,
             long long i):
    """(cta, head, n_block, m_block) of the i-th visit of CTA cta; IndexError past its last visit."""
    cdef View v = make_view(records, cta_columns, cta_col_start, n_first, NC, g, 1, RANK_COUNT)
    cdef long long head, n, m
    if not 0 <= cta < v.num_ctas or i < 0 or not visit_at(&v, cta, i, &head, &n, &m):
        raise IndexError(f"CTA {cta} has no visit {i}")
    return cta, head, n, m


def rank_of(records, cta_columns, cta_col_start, bounds, long long n_first, long long NC, long long g,
            int tie_sign, int rank_rule, long long head, long long m, long long n, mode="kernel"):
    """(rank, records compared) of visit (head, m_block, n_block) by rank_at's ``mode`` ("kernel", "count",
    "window"); ValueError if the table has no such visit."""
    cdef View v = make_view(records, cta_columns, cta_col_start, n_first, NC, g, tie_sign, rank_rule, bounds)
    cdef long long scanned, idx = head // g * NC + n - n_first
    if head < 0 or n < n_first or n >= n_first + NC or idx >= records.shape[0]:
        raise ValueError(f"no column (head {head}, n_block {n}) in the table")
    if not records[idx, REC_LO] <= m < records[idx, REC_HI]:
        raise ValueError(f"column (head {head}, n_block {n}) does not visit Q tile {m}")
    r = rank_at(&v, head, m, n, MODES[mode], &scanned)
    return r, scanned


def visits_and_ranks(records, cta_columns, cta_col_start, bounds, long long n_first, long long NC, long long g,
                     int tie_sign, int rank_rule, mode="kernel"):
    """Every visit computed by visit_of's walk and every rank by rank_of's loop, in table order: (visits (V, 4)
    int32, rank (V,) int32, scanned (V,) int32). The reference of the kernel side, to compare with expand()."""
    cdef View v = make_view(records, cta_columns, cta_col_start, n_first, NC, g, tie_sign, rank_rule, bounds)
    cdef const int[:, ::1] rec = records
    cdef long long c, i, j, V = 0, k = 0, head, n, m, sc
    cdef int md = MODES[mode]
    for j in range(rec.shape[0]):
        V += rec[j, REC_HI] - rec[j, REC_LO]
    V *= g
    visits_arr = np.empty((V, 4), dtype=np.int32)
    rank_arr = np.empty(V, dtype=np.int32)
    scanned_arr = np.empty(V, dtype=np.int32)
    cdef int[:, ::1] visits = visits_arr
    cdef int[::1] rank = rank_arr, scanned = scanned_arr
    for c in range(v.num_ctas):
        i = 0
        while visit_at(&v, c, i, &head, &n, &m):
            visits[k, 0] = <int>c
            visits[k, 1] = <int>head
            visits[k, 2] = <int>n
            visits[k, 3] = <int>m
            rank[k] = <int>rank_at(&v, head, m, n, md, &sc)
            scanned[k] = <int>sc
            i += 1
            k += 1
    if k != V:
        raise ValueError(f"the CTA lists hold {k} visits, the records {V}")
    return visits_arr, rank_arr, scanned_arr


def window_scan_stats(records, bounds, long long NC, long long stride=1):
    """(mean, max) over every KV-head visit of the records rank_at compares in MODE_WINDOW, computed per column
    and Q tile without the visit lists (O(visits) time, O(columns) memory); stride > 1: over the visits of every
    stride-th record only."""
    cdef const int[:, ::1] rec = records
    cdef const int[:, ::1] bd = bounds
    cdef long long ncols = rec.shape[0], i, h, base, m, a, b, sc, total = 0, peak = 0, visits = 0, rel
    for i in range(0, ncols, stride):
        base = i // NC * NC
        rel = i - base
        a = base
        b = base + rel + 1
        for m in range(rec[i, REC_LO], rec[i, REC_HI]):
            while rec[a, REC_HI] <= m:              # first column of the head with hi > m
                a += 1
            while b < base + NC and rec[b, REC_LO] <= m:
                b += 1
            sc = (overlap(bd[i, 0], bd[i, 2], a - base, b - base)
                  + overlap(NC - bd[i, 3], NC - bd[i, 1], a - base, b - base))
            total += sc
            visits += 1
            if sc > peak:
                peak = sc
    return (<double>total / visits if visits else 0.0), peak
