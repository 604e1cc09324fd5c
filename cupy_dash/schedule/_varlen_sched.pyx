# cython: boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The one builder of every schedule's column records (a fixed-length problem is one packed sequence): segments,
records and dispatch as in docs/schedules.md, "Packed batches" and "Where the code is"; fields: _records.pxd.
``build_varlen`` list-schedules the units of every segment at column granularity (a bucket queue that pops as the
heap of _heap.pxd); ``busiest_load`` runs the same dispatch on the units' lengths alone, for ``auto``;
``check_varlen`` proves a table in O(columns). The policies' NOTES: _units.pxd.
"""
import numpy as np
from libc.stdlib cimport calloc, malloc, free

from cupy_dash.schedule._records cimport (REC_CTA, REC_FIELDS, REC_HEAD, REC_HI, REC_LO, REC_N, REC_ROT, REC_SPLIT,
                                          REC_STEP, check_cta_lists, check_rule, cta_lists_into, rule_index)
from cupy_dash.schedule._units cimport (POLICY_DESCENDING, POLICY_FA3, POLICY_SYMMETRIC_SHIFT, pair_rectangle,
                                        shift_rotation, tile_range)

cdef long long INT32_MAX = 0x7fffffff


cdef long long shapes_count(const long long* sq, const long long* sk, const long long* win, long long bm,
                            long long bn, bint causal, Shapes* sh) except -1:
    """First half of a packed batch's shapes (sh.B sequences; win (B, 2) their canonical windows): per sequence
    b, sh.info[b] = (M, N, -1, NC, 0, 0) and sh.off = the visible columns' offsets (B + 1,); returns off[B]."""
    cdef long long b, n, N, M, lo, hi
    cdef long long* info
    sh.off[0] = 0
    for b in range(sh.B):
        info = sh.info + INFO_FIELDS * b
        M = (sq[b] + bm - 1) // bm
        N = (sk[b] + bn - 1) // bn
        info[0], info[1], info[2], info[3], info[4], info[5] = M, N, -1, 0, 0, 0
        if M > INT32_MAX or N > INT32_MAX:
            raise ValueError("compact records hold int32 tiles")
        for n in range(N):
            tile_range(n, sq[b], sk[b], bm, bn, causal, win[2 * b], win[2 * b + 1], &lo, &hi)
            if lo < hi:
                info[3] += 1
        sh.off[b + 1] = sh.off[b] + info[3]
    return sh.off[sh.B]


cdef void shapes_fill(const long long* sq, const long long* sk, const long long* win, long long bm, long long bn,
                      bint causal, Shapes* sh) noexcept:
    """Second half (after shapes_count): the visible columns' ranges sh.lo, sh.hi (off[B],), and per sequence
    n_first, T and the flags (1 band, 2 triangular) in sh.info."""
    cdef long long b, n, N, M, lo, hi, k
    cdef long long* info
    cdef bint band, tri
    for b in range(sh.B):
        info = sh.info + INFO_FIELDS * b
        M, N, k = info[0], info[1], sh.off[b]
        band, tri = False, causal or win[2 * b + 1] >= 0
        for n in range(N):
            tile_range(n, sq[b], sk[b], bm, bn, causal, win[2 * b], win[2 * b + 1], &lo, &hi)
            if lo < hi:
                if info[2] < 0:
                    info[2] = n
                sh.lo[k], sh.hi[k] = lo, hi
                info[4] += lo == sh.lo[sh.off[b]]
                tri = tri and hi == M
                band = band or hi < M
                k += 1
        info[5] = (1 if band else 0) + (2 if tri else 0)


cdef extern from *:
    """
    static inline int dash_ctz64(unsigned long long x) { return __builtin_ctzll(x); }
    """
    int dash_ctz64(unsigned long long x) nogil


cdef struct CtaQueue:
    # the CTA that frees up first: least load, then lowest index (the order of _heap.pxd), from a bucket queue.
    # NOTES: every CTA's load lies in [m, m + R - 1], m the least load (it never falls: only the least loaded CTA
    # takes work, at most R - 1 visits per take), so bucket load & (R - 1) (R a power of two) holds exactly the
    # CTAs of that load, as a bitset of W words (lowest index: the lowest set bit) with its member count. With
    # R >= BUSY_MIN_R, ``busy`` (R bits) marks the buckets with members, so that the search for the next one skips
    # 64 empty loads a word: long columns on few CTAs leave most loads empty (1M tokens, full mask, 132 CTAs: 65M
    # loads, 3x the build time when walked one by one); short ones do not, and there the bits cost more than the
    # walk (NULL).
    long long G, W, R, m
    unsigned long long* bits
    long long* count
    long long* load
    unsigned long long* busy


cdef enum:
    BUSY_MIN_R = 4096


cdef int queue_init(CtaQueue* q, long long G, long long max_take) except -1:
    """G CTAs, all free at 0, each take of work at most ``max_take`` visits (queue_free releases it)."""
    cdef long long c
    q.G, q.W, q.R, q.m = G, (G + 63) // 64, 1, 0
    while q.R <= max_take:
        q.R *= 2
    q.bits = <unsigned long long*>calloc(q.R * q.W, sizeof(unsigned long long))
    q.count = <long long*>calloc(q.R + G + (q.R + 63) // 64, sizeof(long long))
    if q.bits == NULL or q.count == NULL:
        queue_free(q)
        raise MemoryError()
    q.load = q.count + q.R
    q.busy = <unsigned long long*>(q.load + G) if q.R >= BUSY_MIN_R else NULL
    for c in range(G):
        q.bits[c >> 6] |= 1ULL << (c & 63)
    q.count[0] = G
    if q.busy != NULL:
        q.busy[0] = 1
    return 0


cdef inline void queue_free(CtaQueue* q) noexcept:
    free(q.bits)
    free(q.count)
    q.bits, q.count = NULL, NULL


cdef long long first_busy(CtaQueue* q, long long r) noexcept:
    """The first bucket from r on (cyclically) that holds a CTA, q.m moved to its load: one by one, or 64 buckets a
    word of ``busy``. Not inline: the common case, bucket r holding one, stays a few instructions."""
    cdef long long w, b
    cdef unsigned long long bits
    if q.busy == NULL:
        while q.count[r] == 0:
            q.m += 1
            r = (r + 1) & (q.R - 1)
        return r
    w = r >> 6
    bits = q.busy[w] & (~0ULL << (r & 63))
    while bits == 0:                                     # ends: some bucket holds a CTA
        w = w + 1 if (w + 1) * 64 < q.R else 0
        bits = q.busy[w]
    b = w * 64 + dash_ctz64(bits)
    q.m += (b - r) & (q.R - 1)
    return b


cdef inline long long queue_first(CtaQueue* q) noexcept:
    """The CTA that frees up first (q.m becomes its load)."""
    cdef long long r = q.m & (q.R - 1), w
    if q.count[r] == 0:
        r = first_busy(q, r)
    cdef unsigned long long* word = q.bits + r * q.W
    w = 0
    while word[w] == 0:
        w += 1
    return w * 64 + dash_ctz64(word[w])


cdef inline void queue_add(CtaQueue* q, long long c, long long L) noexcept:
    """CTA c takes L more visits (c's load + L <= q.m + R - 1: max_take bounds every take). Loads are not checked
    here: the callers check the busiest one against a record's int32 step when they are done."""
    cdef long long old = q.load[c], new = old + L, r0 = old & (q.R - 1), r1 = new & (q.R - 1)
    q.load[c] = new
    if r0 != r1:
        q.bits[r0 * q.W + (c >> 6)] &= ~(1ULL << (c & 63))
        q.count[r0] -= 1
        q.bits[r1 * q.W + (c >> 6)] |= 1ULL << (c & 63)
        q.count[r1] += 1
        if q.busy != NULL:
            if q.count[r0] == 0:
                q.busy[r0 >> 6] &= ~(1ULL << (r0 & 63))
            q.busy[r1 >> 6] |= 1ULL << (r1 & 63)


cdef inline int check_loads(const long long* load, long long G) except -1:
    """Raises where a CTA holds more than 2^31 - 1 visits (a record's step is int32)."""
    cdef long long c
    for c in range(G):
        if load[c] > INT32_MAX:
            raise ValueError(f"CTA {c} has {load[c]} visits: a record's step is int32")
    return 0


cdef inline long long max_take(const Shapes* sh) noexcept:
    """At most the visits of one unit (two columns of a sequence): 2 M of the longest M."""
    cdef long long b, m = 0
    for b in range(sh.B):
        m = sh.info[INFO_FIELDS * b] if sh.info[INFO_FIELDS * b] > m else m
    return 2 * m


cdef struct Units:
    # build_varlen's work units in dispatch order: unit u is local column k0[u] (index among its sequence's
    # visible columns) of segment seg[u], paired with k1[u] (-1: alone); base[u] is its segment's first unit
    long long U
    long long* seg
    long long* k0
    long long* k1
    long long* base
    bint sym, paired_all
    bint plain              # every segment's columns alone in ascending n: the same units for every such policy
    int tie                 # tie_sign of the schedule: -1 (descending n) for symmetric_shift and spt, else +1


cdef int make_units(Units* un, int policy, const Shapes* sh, const long long* seq_order, long long Hkv, long long spt,
                    long long num_sms, long long ncols, bint fill) except -1:
    """The units of every segment in its policy's order, the sequences in seq_order (spt > 0: upstream's
    shortest-first rounds instead, over sections of spt KV heads, one section after the other): the flags and U,
    and with ``fill`` the arrays (ncols units at most; free_units releases them)."""
    cdef long long B = sh.B, b, o, kh, k, j, U = 0, P, NC, T, maxnc = 0, pairable = 0, first, last
    cdef const long long* info
    cdef bint paired, mirrored
    un.seg = NULL
    un.sym = policy == POLICY_SYMMETRIC_SHIFT
    un.plain = spt <= 0
    un.U = 0
    for b in range(B):
        info = sh.info + INFO_FIELDS * b
        NC = info[3]
        maxnc = NC if NC > maxnc else maxnc
        pairable += Hkv * ((NC + 1) // 2 if info[5] & 2 else NC)
    un.paired_all = un.sym and pairable >= num_sms
    un.tie = -1 if (un.sym or spt > 0) else 1
    for b in range(B):
        info = sh.info + INFO_FIELDS * b
        paired = un.paired_all and info[5] & 2
        un.U += Hkv * ((info[3] + 1) // 2 if paired else info[3])
        un.plain = un.plain and not paired and not (un.sym and info[5] & 1)
    if not fill:
        return 0
    un.seg = <long long*>malloc((4 * ncols + 1) * sizeof(long long))
    if un.seg == NULL:
        raise MemoryError()
    un.k0, un.k1, un.base = un.seg + ncols, un.seg + 2 * ncols, un.seg + 3 * ncols
    if spt > 0:
        # NOTES: upstream FA3's shortest-first order: round j dispatches every segment's j-th column from the
        # right, segments in dispatch order, over the KV heads [first, last) of one section, then the next's; a
        # dQ tile's columns stay in one section, so ranks and bits do not depend on the section size
        # (docs/schedules.md, "L2 sections").
        for first in range(0, Hkv, spt):
            last = first + spt if first + spt < Hkv else Hkv
            for j in range(maxnc):
                for o in range(B):
                    b = seq_order[o]
                    NC = sh.info[INFO_FIELDS * b + 3]
                    if j < NC:
                        for kh in range(first, last):
                            un.seg[U], un.k0[U], un.k1[U], un.base[U] = b * Hkv + kh, NC - 1 - j, -1, 0
                            U += 1
    else:
        for o in range(B):
            b = seq_order[o]
            info = sh.info + INFO_FIELDS * b
            NC, T = info[3], info[4]
            paired = un.paired_all and info[5] & 2
            mirrored = un.sym and info[5] & 1
            P = (NC + 1) // 2 if paired else NC
            for kh in range(Hkv):
                for k in range(P):
                    un.seg[U + k], un.base[U + k], un.k1[U + k] = b * Hkv + kh, U, -1
                    if mirrored:
                        un.k0[U + k] = k if k < T else NC - 1 - (k - T)
                    else:
                        un.k0[U + k] = k
                        if paired and NC - 1 - k != k:
                            un.k1[U + k] = NC - 1 - k
                U += P
    return 0


cdef inline void free_units(Units* un) noexcept:
    free(un.seg)


cdef long long total_columns(const Shapes* sh, long long Hkv) except -1:
    cdef long long b, ncols = 0
    for b in range(sh.B):
        if sh.info[INFO_FIELDS * b + 3] > (INT32_MAX - ncols) // Hkv:     # (before the product: nothing wraps)
            raise ValueError("heads: the compact records' columns (KV heads x KV tiles) are indexed by int32")
        ncols += Hkv * sh.info[INFO_FIELDS * b + 3]
    return ncols


cdef long long busiest_load(int policy, const Shapes* sh, const long long* seq_order, long long Hkv, long long spt,
                            long long num_sms, long long plain_load, int* assign, Dispatch* out) except -1:
    """The visits of the busiest CTA of build_varlen's schedule for the same arguments, by the same list
    scheduling on the units' lengths alone (no records): what ``auto``'s column model reads; ``out``: num_ctas,
    tie_sign and whether the units are plain (every segment's columns alone in ascending n, as for every policy
    that returns plain). plain_load >= 0 is such a policy's load, returned without dispatching again (``assign``
    untouched). ``assign`` (NULL, or one int per column): receives each unit's CTA, which build_varlen then
    takes instead of dispatching again."""
    cdef long long ncols = total_columns(sh, Hkv), u, c, b, L, best = 0, k
    cdef Units un
    make_units(&un, policy, sh, seq_order, Hkv, spt, num_sms, ncols, False)
    out.G, out.tie, out.plain = (num_sms if num_sms < un.U else un.U), un.tie, un.plain
    if un.plain and plain_load >= 0:
        return plain_load
    make_units(&un, policy, sh, seq_order, Hkv, spt, num_sms, ncols, True)
    cdef long long G = out.G
    cdef CtaQueue q
    q.bits, q.count = NULL, NULL
    try:
        queue_init(&q, G, max_take(sh))
        for u in range(un.U):
            b = un.seg[u] // Hkv
            k = sh.off[b] + un.k0[u]
            L = sh.hi[k] - sh.lo[k]
            if un.k1[u] >= 0:
                k = sh.off[b] + un.k1[u]
                L += sh.hi[k] - sh.lo[k]
            c = queue_first(&q)
            queue_add(&q, c, L)
            best = q.load[c] if q.load[c] > best else best
            if assign != NULL:
                assign[u] = <int>c
        check_loads(q.load, G)
    finally:
        queue_free(&q)
        free_units(&un)
    return best


cdef int build_varlen(int policy, const Shapes* sh, const long long* seq_order, long long Hkv, long long spt,
                      long long num_sms, const int* assign, Built* out) except -1:
    """Records of the g = 1 schedule of B * Hkv segments (``sh``: the batch's shapes; seq_order: the sequences
    in dispatch order) into ``out``'s buffers (rec (columns, 8), cta_columns, cta_col_start (num_ctas + 1,),
    seg_col_start (B * Hkv + 1,), loads (num_ctas,); order and fill are scratch of columns and num_sms
    entries), with out.G = num_ctas, out.tie = tie_sign and out.plain = whether the units are every segment's
    columns alone in ascending n (the same dispatch for every policy where this holds). ``assign``: NULL, or each
    unit's CTA as busiest_load found it for the same arguments (the list scheduling is then not run again)."""
    cdef long long B = sh.B, S = B * Hkv, b, seg, P, NC, T, ncols = total_columns(sh, Hkv)
    cdef long long* segc = out.segc
    cdef const long long* info
    segc[0] = 0
    for seg in range(S):
        segc[seg + 1] = segc[seg] + sh.info[INFO_FIELDS * (seg // Hkv) + 3]
    cdef Units un
    make_units(&un, policy, sh, seq_order, Hkv, spt, num_sms, ncols, True)
    cdef long long G = num_sms if num_sms < un.U else un.U
    cdef bint paired, mirrored
    cdef int* rec = out.rec
    cdef int* r
    cdef long long* order = out.order
    cdef long long* loads = out.loads
    cdef long long nd = 0, u, c, col, kk, M, n, lo, hi, L, split, rot, t0, idx
    for c in range(G):
        loads[c] = 0
    cdef CtaQueue q
    q.bits, q.count = NULL, NULL
    try:
        if assign == NULL:
            queue_init(&q, G, max_take(sh))
        for u in range(un.U):
            seg = un.seg[u]
            b = seg // Hkv
            info = sh.info + INFO_FIELDS * b
            M, NC, T = info[0], info[3], info[4]
            paired = un.paired_all and info[5] & 2
            mirrored = un.sym and info[5] & 1
            P = (NC + 1) // 2 if paired else NC
            c = queue_first(&q) if assign == NULL else assign[u]
            for col in range(2 if un.k1[u] >= 0 else 1):
                kk = un.k0[u] if col == 0 else un.k1[u]
                n = info[2] + kk
                lo, hi = sh.lo[sh.off[b] + kk], sh.hi[sh.off[b] + kk]
                L = hi - lo
                t0 = loads[c]
                if policy == POLICY_FA3 or (mirrored and kk >= T):
                    split, rot = lo, 0                            # ascending
                elif policy == POLICY_DESCENDING or mirrored or (paired and col == 1):
                    split, rot = -1, 0                            # descending
                elif paired:                                      # rectangle rotation, then triangle
                    pair_rectangle(u, un.base[u], G, P, M, sh.lo + sh.off[b], &split, &rot)
                elif info[5] & 1:
                    split, rot = lo, (t0 + n + M - hi) % L         # band shift on the CTA's clock
                else:
                    split, rot = lo, shift_rotation(kk, info[2], L, T, NC)   # shift
                idx = segc[seg] + kk
                r = rec + REC_FIELDS * idx
                r[REC_STEP], r[REC_LO], r[REC_HI] = <int>t0, <int>lo, <int>hi
                r[REC_SPLIT], r[REC_ROT], r[REC_CTA] = <int>split, <int>rot, <int>c
                r[REC_HEAD], r[REC_N] = <int>seg, <int>n
                order[nd] = idx
                nd += 1
                if assign == NULL:
                    queue_add(&q, c, L)
                loads[c] += L
        check_loads(loads, G)
    finally:
        queue_free(&q)
        free_units(&un)
    cta_lists_into(rec, order, ncols, G, out.cols, out.cs, out.fill)
    out.G, out.tie, out.plain = G, un.tie, un.plain
    return 0


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
    on exactly one CTA list and the steps along a list are the positions; with rank_rule 1 / 2, adjacent columns
    of a segment reach each Q tile they share in ascending / descending n. Why that proves the table:
    docs/schedules.md, "Compact records"."""
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
            check_rule(i, split, rot, lo, hi)
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
        if (rank_rule == 1 and not key_less(p, q, m, tie_sign)) or \
                (rank_rule == 2 and not key_less(q, p, m, tie_sign)):
            raise ValueError(f"record {i}: Q tile {m} is not reached in "
                             f"{'ascending' if rank_rule == 1 else 'descending'} n order, as rank rule {rank_rule} says")
