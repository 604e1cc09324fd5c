# cython: boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Oracles for the tests, which the runtime no longer uses: the direct builders of the fixed-length schedule and
the sort-based expansion of its records (docs/schedules.md, "Where the code is"). ``build_table``: the per-visit
table (docs/architecture.md, "Byte layouts"), heap dispatch and step-by-step rank derivation;
``build_columns``: the column records of one problem with the same heap dispatch; ``expand_sorted``: the per-visit
table of such records, ranks by sorting every dQ tile's visits by key. The rules and why they hold: the NOTES of
_units.pxd and docs/schedules.md, "Why the rules hold".
"""
import numpy as np
from libc.stdlib cimport malloc, free, qsort

from cupy_dash.schedule._heap cimport heap_pop, heap_push
from cupy_dash.schedule._records cimport (RANK_ASC_N, RANK_COUNT, RANK_DESC_N, REC_CTA, REC_FIELDS, REC_HEAD, REC_HI,
                                          REC_LO, REC_N, REC_ROT, REC_SPLIT, REC_STEP, cta_lists_into, rule_index,
                                          rule_tile)
from cupy_dash.schedule._schedule import column_ranges
from cupy_dash.schedule._units cimport (POLICY_DESCENDING, POLICY_FA3, POLICY_SHIFT, POLICY_SYMMETRIC_SHIFT,
                                        pair_rectangle, shift_rotation)

cdef long long LLMAX = 0x7fffffffffffffff
cdef long long INT32_MAX = 0x7fffffff

cdef struct UnitShape:
    long long n_first, NC   # the visible columns are n_first .. n_first + NC - 1
    long long T             # start-clipped columns (their ranges all begin at lo[n_first])
    long long P             # units per head (pairs when paired, else NC)
    long long U, G          # units in all, CTAs used
    bint band, paired, mirrored, spt
    int tb_sign             # tie-break between columns at one step: +1 ascending n, -1 descending n


cdef inline UnitShape unit_shape(int policy, long long M, const long long[::1] lo, const long long[::1] hi,
                                 long long num_heads, bint causal, long long num_sms,
                                 long long window_right) noexcept:
    """The units of one problem; lo / hi are column_ranges (N entries)."""
    cdef UnitShape sh
    cdef long long n, N = lo.shape[0]
    cdef bint triangular = causal or window_right >= 0
    sh.n_first, sh.NC, sh.T, sh.band = -1, 0, 0, False
    for n in range(N):
        if lo[n] < hi[n]:
            if sh.n_first < 0:
                sh.n_first = n
            sh.NC += 1
            sh.T += lo[n] == lo[sh.n_first]
            triangular = triangular and hi[n] == M
            sh.band = sh.band or hi[n] < M
    sh.paired = (policy == POLICY_SYMMETRIC_SHIFT and triangular and num_heads * ((sh.NC + 1) // 2) >= num_sms)
    sh.mirrored = policy == POLICY_SYMMETRIC_SHIFT and sh.band
    sh.spt = policy == POLICY_FA3 and (causal or window_right >= 0)
    sh.P = (sh.NC + 1) // 2 if sh.paired else sh.NC
    sh.U = num_heads * sh.P
    sh.G = num_sms if num_sms < sh.U else sh.U
    sh.tb_sign = -1 if (policy == POLICY_SYMMETRIC_SHIFT or sh.spt) else 1
    return sh


cdef inline void unit_columns(int policy, bint spt, bint paired, bint mirrored, long long u,
                              long long num_heads, long long n_first, long long NC, long long T, long long P,
                              long long* head, long long* n0, long long* n1) noexcept:
    """Work unit u (in dispatch order) -> head and one or two KV columns (n1 = -1 when single), among the NC
    visible columns n_first .. n_first + NC - 1 of every head; ``mirrored`` (symmetric_shift on a band): the
    T start-clipped columns in ascending n, then the others in descending n."""
    cdef long long k
    if mirrored:
        head[0] = u // NC
        k = u % NC
        n0[0] = n_first + k if k < T else n_first + NC - 1 - (k - T)
        n1[0] = -1
    elif paired:
        head[0] = u // P
        k = u % P
        n0[0] = n_first + k
        n1[0] = n_first + NC - 1 - k if NC - 1 - k != k else -1
    elif spt:
        # upstream FA3's shortest-processing-time-first launch order: short (high n) columns first
        n0[0] = n_first + NC - 1 - u // num_heads
        head[0] = u % num_heads
        n1[0] = -1
    else:
        head[0] = u // NC
        n0[0] = n_first + u % NC
        n1[0] = -1


def build_table(int policy, long long seqlen_q, long long seqlen_k, long long block_m, long long block_n,
                long long num_heads, bint causal, long long num_sms, long long group_size=1,
                long long window_left=-1, long long window_right=-1):
    """Build (visits, rank, cta_start) for one policy; see the module docstring for the layout. num_heads counts
    (batch, query head) pairs, group_size the query heads per KV head (it must divide num_heads); the mask is
    causal or full with the sliding window (window_left, window_right) of :func:`column_ranges`."""
    if group_size < 1 or num_heads % group_size:
        raise ValueError(f"group_size must be >= 1 and divide num_heads={num_heads}, got {group_size}")
    if window_left < -1 or window_right < -1:
        raise ValueError(f"window sides must be >= -1, got ({window_left}, {window_right})")
    # the g = 1 table of Hkv (batch, KV head) pairs, then (group_size > 1) repeated for the query heads
    cdef long long Hkv = num_heads // group_size
    cdef long long M = (seqlen_q + block_m - 1) // block_m
    cdef long long N = (seqlen_k + block_n - 1) // block_n
    lo_arr, hi_arr = column_ranges(seqlen_q, seqlen_k, block_m, block_n, causal, window_left, window_right)
    cdef long long[::1] lo = lo_arr, hi = hi_arr
    # NOTES: only the visible columns, one run [n_first, n_first + NC) with NC >= 1, become work units. Pairing
    # only for the triangular shape with at least as many pairs as CTAs; symmetric_shift on a band treats its two
    # clipped triangles mirror-wise; fa3 takes upstream's SPT order (high n first, ties to high n) whenever the
    # mask bounds keys on the right, so every dQ tile adds in descending n whatever the dispatch timing. Why each
    # holds: docs/schedules.md, "Why the rules hold".
    cdef UnitShape sh = unit_shape(policy, M, lo, hi, Hkv, causal, num_sms, window_right)
    cdef long long n_first = sh.n_first, NC = sh.NC, T = sh.T, P = sh.P, U = sh.U, G = sh.G, n
    cdef bint band = sh.band, paired = sh.paired, mirrored = sh.mirrored, spt = sh.spt
    cdef long long u, c, h, n0, n1, L, s, m, v, rs, rot, off, i, j, key
    cdef int tb_sign = sh.tb_sign

    # (1) greedy dispatch of units to the CTA that frees up first (ties: lowest CTA index)
    unit_cta_arr = np.empty(U, dtype=np.int32)
    cdef int[::1] unit_cta = unit_cta_arr
    count_arr = np.zeros(G, dtype=np.int64)
    cdef long long[::1] count = count_arr
    cdef double* ht = <double*>malloc(G * sizeof(double))
    cdef long long* hc = <long long*>malloc(G * sizeof(long long))
    cdef long long hsize = 0
    cdef double t
    for c in range(G):
        heap_push(ht, hc, &hsize, 0.0, c)
    for u in range(U):
        unit_columns(policy, spt, paired, mirrored, u, Hkv, n_first, NC, T, P, &h, &n0, &n1)
        L = hi[n0] - lo[n0]
        if n1 >= 0:
            L += hi[n1] - lo[n1]
        heap_pop(ht, hc, &hsize, &t, &c)
        unit_cta[u] = <int>c
        count[c] += L
        heap_push(ht, hc, &hsize, t + L, c)
    free(ht)
    free(hc)

    cta_start_arr = np.zeros(G + 1, dtype=np.int64)
    cdef long long[::1] cta_start = cta_start_arr
    for c in range(G):
        cta_start[c + 1] = cta_start[c] + count[c]
    cdef long long V = cta_start[G]
    visits_arr = np.empty((V, 4), dtype=np.int32)
    rank_arr = np.empty(V, dtype=np.int32)
    cdef int[:, ::1] visits = visits_arr
    cdef int[::1] rank = rank_arr
    wp_arr = cta_start_arr[:G].copy()
    cdef long long[::1] wp = wp_arr

    # (2) each CTA's visit list, Q-tile order per column
    # NOTES: shift on a band rotates column n's range by tau + n + M - hi[n] on the CTA's clock tau (the step of
    # the rank derivation below), not the column's own, so that equally long columns never meet on a dQ tile,
    # whenever each one started (docs/schedules.md, "Why the rules hold").
    cdef long long col
    cdef long long cols[2]
    for u in range(U):
        unit_columns(policy, spt, paired, mirrored, u, Hkv, n_first, NC, T, P, &h, &n0, &n1)
        c = unit_cta[u]
        cols[0], cols[1] = n0, n1
        for col in range(2 if n1 >= 0 else 1):
            n = cols[col]
            L = hi[n] - lo[n]
            v = wp[c]
            wp[c] += L
            for s in range(L):
                if policy == POLICY_FA3 or (mirrored and n >= n_first + T):
                    m = lo[n] + s
                elif policy == POLICY_DESCENDING or mirrored:
                    m = hi[n] - 1 - s
                elif paired and col == 1:
                    m = hi[n] - 1 - s                   # short column of a pair: descending
                elif paired:
                    # long column: cyclic shift over the rectangle of Q tiles that every long column of this
                    # head in the same dispatch wave covers, then its own triangle in ascending order (paired
                    # columns all end at hi = M)
                    pair_rectangle(u, h * P, G, P, M, &lo[n_first], &rs, &rot)
                    if s < M - rs:
                        m = rs + (rot + s) % (M - rs)
                    else:
                        m = lo[n] + (s - (M - rs))
                elif band:
                    m = lo[n] + (v - cta_start[c] + s + n + M - hi[n]) % L   # band shift on the CTA's clock
                else:                                 # shift: rotate the column's range
                    m = lo[n] + (shift_rotation(n - n_first, n_first, L, T, NC) + s) % L
                visits[v + s, 0], visits[v + s, 1] = <int>c, <int>h
                visits[v + s, 2], visits[v + s, 3] = <int>n, <int>m

    # (3) derived ranks: walk the wait-free timeline step by step; within a step, CTAs in (tie-break, cta) order
    cdef long long maxlen = 0
    for c in range(G):
        if count[c] > maxlen:
            maxlen = count[c]
    counter_arr = np.zeros(Hkv * M, dtype=np.int32)
    cdef int[::1] counter = counter_arr
    order_arr = np.arange(G, dtype=np.int64)
    keys_arr = np.zeros(G, dtype=np.int64)
    cdef long long[::1] order = order_arr
    cdef long long[::1] keys = keys_arr
    cdef long long nact = G
    cdef bint changed
    for s in range(maxlen):
        changed = False
        for i in range(nact):
            c = order[i]
            if s >= count[c]:
                keys[c] = LLMAX
                changed = True
            else:
                v = cta_start[c] + s
                if s == 0 or visits[v, 1] != visits[v - 1, 1] or visits[v, 2] != visits[v - 1, 2]:
                    keys[c] = (tb_sign * <long long>visits[v, 2] + N) * G + c
                    changed = True
        if changed:
            for i in range(1, nact):
                c = order[i]
                key = keys[c]
                j = i - 1
                while j >= 0 and keys[order[j]] > key:
                    order[j + 1] = order[j]
                    j -= 1
                order[j + 1] = c
            while nact > 0 and keys[order[nact - 1]] == LLMAX:
                nact -= 1
        for i in range(nact):
            c = order[i]
            v = cta_start[c] + s
            off = <long long>visits[v, 1] * M + visits[v, 3]
            rank[v] = counter[off]
            counter[off] += 1
    if group_size == 1:
        return visits_arr, rank_arr, cta_start_arr
    # every visit of KV head kh, once per query head kh * g + j, j = 0..g-1 (Q-tile-major: _units.pxd)
    grouped = np.repeat(visits_arr, group_size, axis=0)
    grouped[:, 1] = grouped[:, 1] * group_size + np.tile(np.arange(group_size, dtype=np.int32), len(rank_arr))
    return grouped, np.repeat(rank_arr, group_size), cta_start_arr * group_size


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
        cols[0], cols[1] = n0, n1
        for col in range(2 if n1 >= 0 else 1):
            n = cols[col]
            L = hi[n] - lo[n]
            t0 = loads[c]
            if policy == POLICY_FA3 or (sh.mirrored and n >= n_first + sh.T):
                split, rot = lo[n], 0                        # ascending
            elif policy == POLICY_DESCENDING or sh.mirrored or (sh.paired and col == 1):
                split, rot = -1, 0                           # descending (also the short column of a pair)
            elif sh.paired:
                pair_rectangle(u, h * P, G, P, M, &lo[n_first], &split, &rot)  # rectangle rotation, then triangle
            elif sh.band:
                split, rot = lo[n], (t0 + n + M - hi[n]) % L  # band shift on the CTA's clock
            else:
                split, rot = lo[n], shift_rotation(n - n_first, n_first, L, sh.T, NC)   # shift: the range rotated
            idx = h * NC + n - n_first
            rec[idx, REC_STEP], rec[idx, REC_LO], rec[idx, REC_HI] = <int>t0, <int>lo[n], <int>hi[n]
            rec[idx, REC_SPLIT], rec[idx, REC_ROT], rec[idx, REC_CTA] = <int>split, <int>rot, <int>c
            rec[idx, REC_HEAD], rec[idx, REC_N] = <int>h, <int>n
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


cdef struct KeyIdx:
    long long key
    long long idx


cdef int cmp_key(const void* x, const void* y) noexcept nogil:
    cdef long long a = (<const KeyIdx*>x).key, b = (<const KeyIdx*>y).key
    return (a > b) - (a < b)


def expand_sorted(records, cta_columns, cta_col_start, long long num_m_blocks, long long n_first, long long NC,
           long long g, int tie_sign):
    """The per-visit table (visits (V, 4) int32, rank (V,) int32, cta_start (num_ctas + 1,) int64) of
    ``_schedule.build_table``'s layout. Visits come from the rules in list order (positions, not the records'
    steps); ranks from sorting every dQ tile's visits by (step, tie_sign * n) with the records' steps."""
    cdef const int[:, ::1] rec = records
    cdef const int[::1] cols = cta_columns
    cdef const long long[::1] cs = cta_col_start
    cdef long long G = cs.shape[0] - 1, ncols = rec.shape[0], M = num_m_blocks, Nb = n_first + NC
    cdef long long c, j, idx, s, q, L, m, pos, row, kvh, a, b, end, k, h, n
    if rec.shape[1] != REC_FIELDS or cols.shape[0] != ncols or NC < 1 or ncols % NC or g < 1:
        raise ValueError("inconsistent compact records")
    cta_start_arr = np.zeros(G + 1, dtype=np.int64)
    colpos_arr = np.empty(ncols, dtype=np.int64)
    cdef long long[::1] cta_start = cta_start_arr, colpos = colpos_arr
    pos = 0
    for c in range(G):
        for j in range(cs[c], cs[c + 1]):
            colpos[cols[j]] = pos
            pos += rec[cols[j], REC_HI] - rec[cols[j], REC_LO]
        cta_start[c + 1] = pos * g
    visits_arr = np.empty((pos * g, 4), dtype=np.int32)
    rank_arr = np.full(pos * g, -1, dtype=np.int32)
    cdef int[:, ::1] visits = visits_arr
    cdef int[::1] rank = rank_arr
    for c in range(G):
        for j in range(cs[c], cs[c + 1]):
            idx = cols[j]
            L = rec[idx, REC_HI] - rec[idx, REC_LO]
            for s in range(L):
                m = rule_tile(&rec[idx, 0], s)
                for q in range(g):
                    row = (colpos[idx] + s) * g + q
                    visits[row, 0] = <int>c
                    visits[row, 1] = <int>(rec[idx, REC_HEAD] * g + q)
                    visits[row, 2] = rec[idx, REC_N]
                    visits[row, 3] = <int>m
    cdef KeyIdx* buf = <KeyIdx*>malloc((NC + 1) * sizeof(KeyIdx))
    for kvh in range(ncols // NC):
        a = kvh * NC
        b = a
        end = a + NC
        for m in range(M):
            while a < end and rec[a, REC_HI] <= m:
                a += 1
            while b < end and rec[b, REC_LO] <= m:
                b += 1
            k = 0
            for idx in range(a, b):
                s = rule_index(&rec[idx, 0], m)
                buf[k].key = (rec[idx, REC_STEP] + s) * (2 * Nb + 1) + tie_sign * rec[idx, REC_N] + Nb
                buf[k].idx = colpos[idx] + s
                k += 1
            qsort(buf, k, sizeof(KeyIdx), cmp_key)
            for j in range(k):
                for q in range(g):
                    rank[buf[j].idx * g + q] = <int>j
    free(buf)
    return visits_arr, rank_arr, cta_start_arr
