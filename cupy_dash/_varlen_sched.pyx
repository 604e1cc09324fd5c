# cython: boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Compact schedules of packed variable-length batches (format: cupy_dash/varlen_schedule.py).

A *segment* is one (sequence, KV head) pair, seg = b * Hkv + kv_head; it owns the visible KV columns of its
sequence, with the sequence's own M, N and mask ranges (bottom-right causal and windows per sequence). The
records are those of _compact.pyx (8 int32 fields, _compact_rule.pxi) with REC_HEAD = seg and REC_N the KV tile
local to the sequence; segment seg's records are rows seg_col_start[seg] .. seg_col_start[seg + 1] - 1, in n
order. ``build_varlen`` dispatches the units of every segment by list scheduling at column granularity (the heap
of _heap.pxi); ``check_varlen`` proves coverage, rank permutations, deadlock freedom and the rank rule in
O(columns).
"""
import numpy as np
from libc.stdlib cimport malloc, free

include "_heap.pxi"
include "_units.pxi"
include "_compact_rule.pxi"
include "_cta_lists.pxi"

cdef long long INT32_MAX = 0x7fffffff


cdef inline void tile_range(long long n, long long sq, long long sk, long long bm, long long bn, bint causal,
                            long long left, long long right, long long* lo, long long* hi) noexcept:
    """Q tiles [lo, hi) that KV tile n of one sequence sees (_schedule.column_ranges, one tile)."""
    cdef long long M = (sq + bm - 1) // bm, diag = sk - sq, k0 = n * bn, k1, first, last
    if causal:
        right = 0
    k1 = k0 + bn if k0 + bn < sk else sk
    lo[0], hi[0] = 0, M
    first = (k0 - diag - right if k0 - diag - right > 0 else 0) if right >= 0 else 0
    last = (k1 - 1 - diag + left if k1 - 1 - diag + left < sq - 1 else sq - 1) if left >= 0 else sq - 1
    if last < 0:
        hi[0] = 0
    elif first > sq - 1:
        lo[0] = M
    else:
        lo[0] = first // bm
        hi[0] = last // bm + 1


def sequence_shapes(const long long[::1] sq, const long long[::1] sk, const long long[:, ::1] win,
                    long long bm, long long bn, bint causal):
    """Per sequence b: seq_info int64 (B, 6) = (M, N, n_first, NC, T, flags: 1 band, 2 triangular) and the
    visible columns' ranges vis_lo, vis_hi int64 (sum NC,) (sequence b's at vis_off[b] .. vis_off[b + 1])."""
    cdef long long B = sq.shape[0], b, n, N, M, lo, hi, tot = 0, k
    info_arr = np.zeros((B, 6), dtype=np.int64)
    off_arr = np.zeros(B + 1, dtype=np.int64)
    cdef long long[:, ::1] info = info_arr
    cdef long long[::1] off = off_arr
    for b in range(B):
        M = (sq[b] + bm - 1) // bm
        N = (sk[b] + bn - 1) // bn
        info[b, 0], info[b, 1], info[b, 2] = M, N, -1
        if M > INT32_MAX or N > INT32_MAX:
            raise ValueError("compact records hold int32 tiles")
        for n in range(N):
            tile_range(n, sq[b], sk[b], bm, bn, causal, win[b, 0], win[b, 1], &lo, &hi)
            if lo < hi:
                info[b, 3] += 1
        off[b + 1] = off[b] + info[b, 3]
    vlo_arr = np.empty(off[B], dtype=np.int64)
    vhi_arr = np.empty(off[B], dtype=np.int64)
    cdef long long[::1] vlo = vlo_arr, vhi = vhi_arr
    cdef bint band, tri
    for b in range(B):
        M, N, k = info[b, 0], info[b, 1], off[b]
        band, tri = False, causal or win[b, 1] >= 0
        for n in range(N):
            tile_range(n, sq[b], sk[b], bm, bn, causal, win[b, 0], win[b, 1], &lo, &hi)
            if lo < hi:
                if info[b, 2] < 0:
                    info[b, 2] = n
                vlo[k], vhi[k] = lo, hi
                info[b, 4] += lo == vlo[off[b]]
                tri = tri and hi == M
                band = band or hi < M
                k += 1
        info[b, 5] = (1 if band else 0) + (2 if tri else 0)
    return info_arr, off_arr, vlo_arr, vhi_arr


def build_varlen(int policy, const long long[:, ::1] info, const long long[::1] voff, const long long[::1] vlo,
                 const long long[::1] vhi, const long long[::1] seq_order, long long Hkv, bint spt,
                 long long num_sms):
    """Records of the g = 1 schedule of B * Hkv segments (sequence_shapes' output; seq_order: the sequences in
    dispatch order). Returns records, cta_columns, cta_col_start, seg_col_start, loads, num_ctas, tie_sign."""
    cdef long long B = info.shape[0], S = B * Hkv, b, o, kh, seg, k, j, U = 0, P, NC, T, maxnc = 0, pairable = 0
    seg_arr = np.zeros(S + 1, dtype=np.int64)
    cdef long long[::1] segc = seg_arr
    for seg in range(S):
        segc[seg + 1] = segc[seg] + info[seg // Hkv, 3]
    cdef long long ncols = segc[S]
    if ncols > INT32_MAX:
        raise ValueError("compact records are indexed by int32")
    for b in range(B):
        NC = info[b, 3]
        maxnc = NC if NC > maxnc else maxnc
        pairable += Hkv * ((NC + 1) // 2 if info[b, 5] & 2 else NC)
    cdef bint sym = policy == POLICY_SYMMETRIC_SHIFT, paired_all = sym and pairable >= num_sms
    # the units in dispatch order: (segment, local column, second column or -1, first unit of the segment)
    useg_arr = np.empty(ncols, dtype=np.int64)
    uk0_arr = np.empty(ncols, dtype=np.int64)
    uk1_arr = np.empty(ncols, dtype=np.int64)
    ubase_arr = np.empty(ncols, dtype=np.int64)
    cdef long long[::1] useg = useg_arr, uk0 = uk0_arr, uk1 = uk1_arr, ubase = ubase_arr
    cdef bint paired, mirrored
    if spt:
        # NOTES: upstream FA3's shortest-first order, per sequence: round j dispatches every segment's j-th
        # column from the right (the j-th shortest), segments in dispatch order.
        for j in range(maxnc):
            for o in range(B):
                b = seq_order[o]
                NC = info[b, 3]
                if j < NC:
                    for kh in range(Hkv):
                        useg[U], uk0[U], uk1[U], ubase[U] = b * Hkv + kh, NC - 1 - j, -1, 0
                        U += 1
    else:
        for o in range(B):
            b = seq_order[o]
            NC, T = info[b, 3], info[b, 4]
            paired = paired_all and info[b, 5] & 2
            mirrored = sym and info[b, 5] & 1
            P = (NC + 1) // 2 if paired else NC
            for kh in range(Hkv):
                for k in range(P):
                    useg[U + k], ubase[U + k], uk1[U + k] = b * Hkv + kh, U, -1
                    if mirrored:
                        uk0[U + k] = k if k < T else NC - 1 - (k - T)
                    else:
                        uk0[U + k] = k
                        if paired and NC - 1 - k != k:
                            uk1[U + k] = NC - 1 - k
                U += P
    cdef long long G = num_sms if num_sms < U else U
    records_arr = np.empty((ncols, REC_FIELDS), dtype=np.int32)
    cdef int[:, ::1] rec = records_arr
    order_arr = np.empty(ncols, dtype=np.int64)
    cdef long long[::1] order = order_arr
    loads_arr = np.zeros(G, dtype=np.int64)
    cdef long long[::1] loads = loads_arr
    cdef double* ht = <double*>malloc((G + 1) * sizeof(double))
    cdef long long* hc = <long long*>malloc((G + 1) * sizeof(long long))
    cdef long long hsize = 0, nd = 0, u, c, col, kk, M, n, lo, hi, L, split, rot, t0, idx, w, q0, q1
    cdef double t
    for c in range(G):
        heap_push(ht, hc, &hsize, 0.0, c)
    for u in range(U):
        seg = useg[u]
        b = seg // Hkv
        M, NC, T = info[b, 0], info[b, 3], info[b, 4]
        paired = paired_all and info[b, 5] & 2
        mirrored = sym and info[b, 5] & 1
        P = (NC + 1) // 2 if paired else NC
        heap_pop(ht, hc, &hsize, &t, &c)
        for col in range(2 if uk1[u] >= 0 else 1):
            kk = uk0[u] if col == 0 else uk1[u]
            n = info[b, 2] + kk
            lo, hi = vlo[voff[b] + kk], vhi[voff[b] + kk]
            L = hi - lo
            t0 = loads[c]
            if policy == POLICY_FA3 or (mirrored and kk >= T):
                split, rot = lo, 0                            # ascending
            elif policy == POLICY_DESCENDING or mirrored or (paired and col == 1):
                split, rot = -1, 0                            # descending
            elif paired:
                # the rectangle shared by the long columns of this segment in this dispatch wave
                w = u // G
                q0 = (w * G if w * G > ubase[u] else ubase[u]) - ubase[u]
                q1 = ((w + 1) * G if (w + 1) * G < ubase[u] + P else ubase[u] + P) - 1 - ubase[u]
                split = vlo[voff[b] + q1]
                rot = (u - ubase[u] - q0) % (M - split)
            elif info[b, 5] & 1:
                split, rot = lo, (t0 + n + M - hi) % L         # band shift on the CTA's clock
            else:
                split, rot = lo, n % L                        # shift
            idx = segc[seg] + kk
            rec[idx, REC_STEP], rec[idx, REC_LO], rec[idx, REC_HI] = <int>t0, <int>lo, <int>hi
            rec[idx, REC_SPLIT], rec[idx, REC_ROT], rec[idx, REC_CTA] = <int>split, <int>rot, <int>c
            rec[idx, REC_HEAD], rec[idx, REC_N] = <int>seg, <int>n
            order[nd] = idx
            nd += 1
            loads[c] += L
        heap_push(ht, hc, &hsize, <double>loads[c], c)
    free(ht)
    free(hc)
    for c in range(G):
        if loads[c] > INT32_MAX:
            raise ValueError(f"CTA {c} has {loads[c]} visits: a record's step is int32")
    cols_arr, cs_arr = cta_lists(rec, order, ncols, G)
    tie = -1 if (sym or spt) else 1
    return records_arr, cols_arr, cs_arr, seg_arr, loads_arr, G, tie


cdef inline bint key_less(const int* a, const int* b, long long m, int tie_sign) noexcept:
    """Whether column a reaches Q tile m with a smaller (step, tie_sign * n) key than column b."""
    cdef long long ka = a[REC_STEP] + rule_index(a, m), kb = b[REC_STEP] + rule_index(b, m)
    return ka < kb or (ka == kb and tie_sign * a[REC_N] < tie_sign * b[REC_N])


def check_varlen(records_arr, cta_columns_arr, cta_col_start_arr, seg_col_start_arr, const long long[::1] sq,
                 const long long[::1] sk, const long long[:, ::1] win, long long bm, long long bn, bint causal,
                 long long Hkv, int tie_sign, int rank_rule):
    """Raise ValueError (naming the first offending record) unless the records are a valid varlen table.

    Checked in O(columns), from the sequence lengths and windows alone (the ranges are recomputed here): segment
    seg = b * Hkv + kv_head has one record per visible KV tile of sequence b, in n order, at rows
    seg_col_start[seg] .., with that tile's mask range and a rule that is a bijection onto it; every record is
    on exactly one CTA list and the steps along a list are the positions. As in _compact.check_records this
    proves coverage, ranks 0..k-1 per dQ tile (keys (step, tie_sign * n) are distinct among a segment's columns)
    and no deadlock (the stuck visit with the smallest key would wait for a smaller key). rank_rule 1 / 2 (the
    kernel's closed forms): every pair of adjacent columns of a segment must reach each Q tile they share in
    ascending / descending n order; the rules of such tables are monotone walks, so the key difference is
    linear in m and both ends of the shared range decide; and since ranges rise with n, a tile's columns are a
    run of n, so adjacent pairs order the whole run."""
    cdef const int[:, ::1] rec = np.ascontiguousarray(records_arr, dtype=np.int32)
    cdef const int[::1] cols = np.ascontiguousarray(cta_columns_arr, dtype=np.int32)
    cdef const long long[::1] cs = np.ascontiguousarray(cta_col_start_arr, dtype=np.int64)
    cdef const long long[::1] segc = np.ascontiguousarray(seg_col_start_arr, dtype=np.int64)
    cdef long long B = sq.shape[0], S = B * Hkv, ncols = rec.shape[0], G = cs.shape[0] - 1
    cdef long long seg, b, n, N, i, j, c, step, lo, hi, split, rot, a, e, nf
    if tie_sign != 1 and tie_sign != -1:
        raise ValueError(f"tie_sign must be +1 or -1, got {tie_sign}")
    if rank_rule < 0 or rank_rule > 2:
        raise ValueError(f"unknown rank rule {rank_rule}")
    if rec.shape[1] != REC_FIELDS or cols.shape[0] != ncols or segc.shape[0] != S + 1 or segc[0] != 0 \
            or segc[S] != ncols:
        raise ValueError(f"expected records (columns, {REC_FIELDS}), as many list entries and {S + 1} segment "
                         f"starts from 0 to the number of records")
    if G < 0 or cs[0] != 0 or cs[G] != ncols or (G == 0 and ncols):
        raise ValueError("cta_col_start must rise from 0 to the number of records")
    for seg in range(S):
        b = seg // Hkv
        N = (sk[b] + bn - 1) // bn
        i, nf = segc[seg], -1
        for n in range(N):
            tile_range(n, sq[b], sk[b], bm, bn, causal, win[b, 0], win[b, 1], &lo, &hi)
            if lo >= hi:
                continue
            nf = n if nf < 0 else nf
            if i >= segc[seg + 1]:
                raise ValueError(f"segment {seg}: too few records (KV tile {n} of sequence {b} has none)")
            if rec[i, REC_HEAD] != seg or rec[i, REC_N] != n:
                raise ValueError(f"record {i}: (segment {rec[i, REC_HEAD]}, n_block {rec[i, REC_N]}) belongs at "
                                 f"another index (expected segment {seg}, n_block {n})")
            if rec[i, REC_LO] != lo or rec[i, REC_HI] != hi:
                raise ValueError(f"record {i}: range [{rec[i, REC_LO]}, {rec[i, REC_HI]}) is not KV tile {n}'s "
                                 f"visible range [{lo}, {hi}) in sequence {b}")
            split, rot = rec[i, REC_SPLIT], rec[i, REC_ROT]
            if not (split == -1 and rot == 0 or lo <= split < hi and 0 <= rot < hi - split):
                raise ValueError(f"record {i}: split {split}, rot {rot} do not give an order of [{lo}, {hi})")
            if rank_rule and not (split == -1 or split == lo and rot == 0):
                raise ValueError(f"record {i}: rank rule {rank_rule} needs monotone walks")
            if rank_rule and i > segc[seg]:
                _check_pair(&rec[i - 1, 0], &rec[i, 0], tie_sign, rank_rule, i)
            i += 1
        if i != segc[seg + 1]:
            raise ValueError(f"segment {seg}: {segc[seg + 1] - segc[seg]} records for {i - segc[seg]} visible "
                             f"KV tiles")
    check_cta_lists(rec, cols, cs, ncols, G)


cdef _check_pair(const int* p, const int* q, int tie_sign, int rank_rule, long long i):
    """Adjacent columns p (n) and q (n + 1) of a segment: q after p (rank_rule 1) or before it (2) at both ends of
    the Q tiles they share."""
    cdef long long a = p[REC_LO] if p[REC_LO] > q[REC_LO] else q[REC_LO]
    cdef long long e = p[REC_HI] if p[REC_HI] < q[REC_HI] else q[REC_HI]
    cdef long long m
    if a >= e:
        return
    for m in (a, e - 1):
        if (rank_rule == 1 and not key_less(p, q, m, tie_sign)) or (rank_rule == 2 and not key_less(q, p, m, tie_sign)):
            raise ValueError(f"record {i}: Q tile {m} is not reached in "
                             f"{'ascending' if rank_rule == 1 else 'descending'} n order, as rank rule {rank_rule} says")
