# cython: boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Schedule tables for the deterministic dQ reduction: build, validate, simulate (the DAG model).

A table is three arrays:
  visits    int32 (V, 4)  rows (cta, head, n_block, m_block), grouped by cta, each cta's rows in execution order
  rank      int32 (V,)    position of the visit in the reduction order of its dQ tile (head, m_block)
  cta_start int64 (C+1,)  visits of cta c are rows [cta_start[c], cta_start[c+1])
"head" is a (batch, query head) pair. With grouped-query attention (GQA, MQA) g = group_size consecutive heads
share the KV head head // g, and a KV column is (head // g, n_block): its visits cover the g query heads of the
group, back to back on one CTA, so that dK and dV stay in registers for the whole group.

NOTES: every policy is (1) an ordered list of work units (one KV column, or a pair of columns for the symmetric
shift) dispatched greedily to the CTA that frees up first, (2) a Q-tile order inside each column, (3) a tie-break
between columns.  Ranks are then *derived*: visits are ordered by (step, tie-break), where step is the visit's
position in its CTA's list, and each dQ tile receives ranks in that order.  Every wait then points from a later
(step, tie-break) key to an earlier one, so no table built here can deadlock, whatever the number of CTAs.

NOTES: grouped columns (g > 1) are Q-tile-major: the table is the g = 1 table of the KV heads with every visit
repeated for the g query heads of its group, in ascending order, and its rank repeated with it. Dispatch, Q-tile
orders and ties are those of the KV heads' table, every CTA is at query head j = step mod g at every step and
time runs g times slower; so dQ tile (head, m) ranks its visits in the order the g = 1 table ranks tile
(head // g, m), deadlock freedom carries over, the start-up waits are paid once rather than once per query head,
and the paper's closed forms hold with m = query heads. Head-major columns (all Q tiles of one query head, then
the next) would start head j's pass of column n at step j * (M - lo[n]): with a causal mask that differs between
columns and breaks the phase relations the policies are built on (descending's common start at the last Q tile,
the shift rotations). On the paper's shapes (132 SMs, H = 32, Hkv = 8 or 1) head-major was never faster in
either model and up to 1.45x the lower bound where Q-tile-major stays at 1.17x (shift, d64 causal, S = 4096,
engine model).

NOTES: masks are band-shaped (causal, full and sliding windows alike): KV tile n sees the contiguous range of Q
tiles [lo[n], hi[n]) of ``column_ranges``, and both ends rise with n. A KV tile that no query sees has an empty
range and no visits (the backward zeroes its dK, dV rows on the host side); the others form one run of columns,
which are the work units. Every policy keeps its meaning on causal and full masks (their tables are those of a
build without windows). With a left window bound ("band": hi[n] < M for some n) the interior columns all have
the same length, as in a full mask restricted to a diagonal band, and its two ends are clipped triangles:
``fa3`` and ``descending`` walk each column's range up or down as before (fa3 with upstream's shortest-first
order whenever the window bounds keys on the right, see ``spt``); ``shift`` rotates each column along
the band, on the clock of its CTA (step (2) below), so that equally long columns never meet however the
dispatch staggers them; ``symmetric_shift`` needs no pairing (a band's columns are equally long) and handles
the two triangles mirror-wise, which arrives at every dQ tile in a strict order (the NOTES at ``mirrored``).
With a right bound alone the shape is triangular like a causal mask, and it is paired as one.

``analyze_table`` (validation and the two simulation models) lives in _schedule_check.pyx and is re-exported
here; the heap both use is _heap.pxd.
"""
import numpy as np
from libc.stdlib cimport malloc, free

from cupy_dash.schedule._heap cimport heap_pop, heap_push
from cupy_dash.schedule._units cimport (POLICY_DESCENDING, POLICY_FA3, POLICY_SHIFT, POLICY_SYMMETRIC_SHIFT, UnitShape,
                                        pair_rectangle, tile_range, unit_columns, unit_shape)
from cupy_dash.schedule._schedule_check import analyze_table  # noqa: F401  (re-exported)

POLICY_CODES = {"fa3": POLICY_FA3, "descending": POLICY_DESCENDING, "shift": POLICY_SHIFT,
                "symmetric_shift": POLICY_SYMMETRIC_SHIFT}

cdef long long LLMAX = 0x7fffffffffffffff


def column_ranges(long long seqlen_q, long long seqlen_k, long long block_m, long long block_n, bint causal,
                  long long window_left=-1, long long window_right=-1):
    """The Q tiles every KV tile sees: (lo, hi), int64 (N,) each, N = ceil(seqlen_k / block_n); KV tile n sees
    Q tiles [lo[n], hi[n]), an empty range when no query sees any of its keys.

    Masks are bottom-right aligned, as FlashAttention's: query i sees key j iff
    i + Sk - Sq - left <= j <= i + Sk - Sq + right, a side of -1 unbounded; causal means right = 0. Key j is
    seen by queries [j - (Sk - Sq) - right, j - (Sk - Sq) + left], at least one index wide and one further per
    key, so the keys [k0, k1) of KV tile n are seen by one interval of queries,
    [k0 - (Sk - Sq) - right, k1 - 1 - (Sk - Sq) + left] clipped to [0, Sq), and every Q tile that meets it has a
    visible element. Both ends rise with n; an empty range is [0, 0) before the visible tiles and [M, M) after
    them (M = ceil(seqlen_q / block_m)). Causal, no window: lo[n] = max(0, n block_n - Sk + Sq) // block_m,
    hi[n] = M, never empty; full mask: [0, M).
    """
    cdef long long N = (seqlen_k + block_n - 1) // block_n
    lo_arr, hi_arr = np.empty(N, dtype=np.int64), np.empty(N, dtype=np.int64)
    cdef long long[::1] lo = lo_arr, hi = hi_arr
    cdef long long n
    for n in range(N):
        tile_range(n, seqlen_q, seqlen_k, block_m, block_n, causal, window_left, window_right, &lo[n], &hi[n])
    return lo_arr, hi_arr


def column_starts(long long seqlen_q, long long seqlen_k, long long block_m, long long block_n, bint causal,
                  long long window_left=-1, long long window_right=-1):
    """First visible Q tile of every KV tile: int64 (N,), the ``lo`` of :func:`column_ranges`."""
    return column_ranges(seqlen_q, seqlen_k, block_m, block_n, causal, window_left, window_right)[0]


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
    visits, rank, cta_start = _build_kv_table(policy, seqlen_q, seqlen_k, block_m, block_n,
                                              num_heads // group_size, causal, num_sms, window_left, window_right)
    if group_size == 1:
        return visits, rank, cta_start
    # every visit of KV head kh, once per query head kh * g + j, j = 0..g-1 (Q-tile-major, see NOTES above)
    grouped = np.repeat(visits, group_size, axis=0)
    grouped[:, 1] = grouped[:, 1] * group_size + np.tile(np.arange(group_size, dtype=np.int32), len(rank))
    return grouped, np.repeat(rank, group_size), cta_start * group_size


def _build_kv_table(int policy, long long seqlen_q, long long seqlen_k, long long block_m, long long block_n,
                    long long num_heads, bint causal, long long num_sms, long long window_left,
                    long long window_right):
    """The g = 1 table of num_heads (batch, KV head) pairs."""
    cdef long long M = (seqlen_q + block_m - 1) // block_m
    cdef long long N = (seqlen_k + block_n - 1) // block_n
    lo_arr, hi_arr = column_ranges(seqlen_q, seqlen_k, block_m, block_n, causal, window_left, window_right)
    cdef long long[::1] lo = lo_arr, hi = hi_arr
    # NOTES: the columns that some query sees are one run [n_first, n_first + NC) (column_ranges: both range
    # ends rise with n) and NC >= 1 (the last query sees the last key); only they become work units.
    cdef UnitShape sh = unit_shape(policy, M, lo, hi, num_heads, causal, num_sms, window_right)
    cdef long long n_first = sh.n_first, NC = sh.NC, T = sh.T, n
    cdef bint band = sh.band
    # NOTES: pairing balances columns whose lengths fall with n and all end at the last Q tile (the triangular
    # shape of causal or right-bounded masks); a band's interior columns are equally long and need none. And it
    # only pays when there are at least as many pairs as CTAs; with spare SMs every column runs alone (the
    # longest column bounds the makespan anyway).
    cdef bint paired = sh.paired
    # NOTES: symmetric_shift on a band treats its two clipped triangles mirror-wise. The columns whose range
    # start rises with n (interior and end triangle) walk their Q tiles in ascending order and are dispatched
    # from the highest n down, as upstream's SPT does for causal masks: column n reaches dQ tile m at
    # start(n) + m - lo[n], and since start(n) falls (or stays) as n rises while lo[n] strictly rises, no two
    # of them reach one dQ tile at the same step, whatever the dispatch timing. The T start-clipped columns
    # (equal lo, rising hi) are the mirror image: dispatched first, in ascending n, each walking down from its
    # last Q tile. Columns of the two groups that share dQ tiles are dispatched far apart whenever a head spans
    # more than one wave of CTAs.
    cdef bint mirrored = sh.mirrored
    # NOTES: fa3 takes upstream's SPT order (high n dispatched first, ties to high n) whenever the mask bounds
    # keys on the right (causal, or window_right >= 0), i.e. whenever lo[n] can rise with n: column n reaches
    # dQ tile m at start(n) + m - lo[n], which then never rises with n, so every dQ tile adds in descending n
    # whatever the dispatch timing, and the bits do not depend on the CTA count (PORTABLE_POLICIES). Without a
    # right bound lo is 0 everywhere and ascending dispatch gives ascending n the same way.
    cdef bint spt = sh.spt
    cdef long long P = sh.P, U = sh.U, G = sh.G
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
        unit_columns(policy, spt, paired, mirrored, u, num_heads, n_first, NC, T, P, &h, &n0, &n1)
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
    # NOTES: shift on a band rotates column n's range by tau + n + M - hi[n], tau being the CTA's clock (the
    # visit's position in its CTA's list, the step of the rank derivation below), where DASH's full-mask shift
    # rotates by n + s. In a band's interior both range ends advance by a stride of block_n / block_m tiles per
    # column, so column n visits lo[n] + (tau + (1 - stride) n + const) mod L at time tau, which differs from
    # column n + d's tile (stride d further up, rotated by (1 - stride) d) for every d whose range overlaps
    # (stride d < L): equally long columns never meet on a dQ tile, whenever each one started. (On the column's
    # own clock s, columns started at different times, as the dispatch does once the shorter edge columns
    # finish early, meet often.)
    cdef long long col, ncols
    cdef long long cols[2]
    for u in range(U):
        unit_columns(policy, spt, paired, mirrored, u, num_heads, n_first, NC, T, P, &h, &n0, &n1)
        c = unit_cta[u]
        cols[0] = n0
        cols[1] = n1
        ncols = 2 if n1 >= 0 else 1
        for col in range(ncols):
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
                    pair_rectangle(u, h * P, G, P, &lo[n_first], &rs, &rot)
                    if s < M - rs:
                        m = rs + (rot + s) % (M - rs)
                    else:
                        m = lo[n] + (s - (M - rs))
                elif band:
                    m = lo[n] + (v - cta_start[c] + s + n + M - hi[n]) % L   # band shift on the CTA's clock
                else:
                    m = lo[n] + (n + s) % L           # shift: rotate the column's range by n
                visits[v + s, 0] = <int>c
                visits[v + s, 1] = <int>h
                visits[v + s, 2] = <int>n
                visits[v + s, 3] = <int>m

    # (3) derived ranks: walk the wait-free timeline step by step; within a step, CTAs in (tie-break, cta) order
    cdef long long maxlen = 0
    for c in range(G):
        if count[c] > maxlen:
            maxlen = count[c]
    counter_arr = np.zeros(num_heads * M, dtype=np.int32)
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
    return visits_arr, rank_arr, cta_start_arr


