# cython: boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""A packed batch's records, built (``schedule_varlen``) and packed in the byte layout that is uploaded (``pack``,
and both in one call: ``new_packing``); docs/schedules.md, "Where the code is".

The arrays NAMES (what the DASH_COMPACT kernel in a varlen launch and kernels_src/bwd_expand.cu read), each CTA's
first row in the per-visit table and the lengths as cu_seqlens, each at a 256-byte aligned offset of one uint8
buffer (docs/architecture.md, "Byte layouts"). tile_columns and the CTAs' row starts are computed here in one pass
each (tests/unit/test_varlen_compact.py compares them with numpy statements of the same values).
"""
import numpy as np
from libc.stdlib cimport free
from libc.string cimport memcpy, memset

from cupy_dash.schedule._records cimport REC_FIELDS, REC_HI, REC_LO, REC_STEP
from cupy_dash.schedule._scratch cimport Arena, arena_reserve, arena_take, room, stable_argsort
from cupy_dash.schedule._units cimport POLICY_DESCENDING, POLICY_FA3, POLICY_SYMMETRIC_SHIFT
from cupy_dash.schedule._varlen_sched cimport (INFO_FIELDS, Built, Dispatch, Shapes, build_varlen, busiest_load,
                                               shapes_count, shapes_fill, total_columns)

NAMES = ("col_records", "cta_columns", "cta_col_start", "seg_col_start", "seq_n_first", "tile_columns",
         "seq_tile_start", "cta_start", "cu_seqlens_q", "cu_seqlens_k")
DTYPES = (np.int32, np.int32, np.int64, np.int32, np.int32, np.int32, np.int32, np.int64, np.int32, np.int32)


cdef inline long long aligned(long long nbytes) noexcept:
    return (nbytes + 255) // 256 * 256


# NOTES: one pair of arenas serves every call; a call that finds them taken (another thread's, suspended in the
# pinned-memory callback of new_packing, the one place the GIL can change hands) uses arenas of its own.
cdef Arena _small, _big
cdef bint _busy = False


cdef struct Work:               # schedule_core's buffers and results
    long long* win              # (B, 2) canonical windows
    long long* order            # (B,) sequences in dispatch order
    int* n_first                # (B,) pack's per-sequence columns (new_packing fills them)
    long long* m_blocks
    Shapes sh
    Built built
    int policy
    int ran[8]
    int nran
    long long ncols, widest


# ------------------------------------------------------------------------------------------------------------
# packing
# ------------------------------------------------------------------------------------------------------------
cdef long long pack_layout(long long ncols, long long G, long long S, long long B, long long total_m,
                           bint visit_starts, long long* off, long long* sizes) noexcept:
    """Byte sizes and 256-aligned offsets of the arrays NAMES (cta_start only with visit_starts, else offset -1);
    returns the buffer's size."""
    cdef long long total = 0, i
    sizes[0], sizes[1], sizes[2], sizes[3], sizes[4] = ncols * REC_FIELDS * 4, ncols * 4, (G + 1) * 8, \
        (S + 1) * 4, B * 4
    sizes[5], sizes[6], sizes[7], sizes[8], sizes[9] = total_m * 8, (B + 1) * 4, \
        (G + 1) * 8 if visit_starts else 0, (B + 1) * 4, (B + 1) * 4
    for i in range(10):
        off[i] = -1
        if i != 7 or visit_starts:
            off[i] = total
            total += aligned(sizes[i])
    return total


cdef long long pack_write(unsigned char* base, const long long* off, const long long* sizes, const int* records,
                          const int* cta_columns, const long long* cta_col_start, const long long* seg_col_start,
                          const int* n_first, const long long* num_m_blocks, const long long* seqlens_q,
                          const long long* seqlens_k, long long ncols, long long G, long long B, long long S,
                          long long kv_heads, long long group_size, bint visit_starts) noexcept:
    """The arrays NAMES written at ``off`` in ``base`` (padding zeroed); returns the per-visit table's rows."""
    cdef long long b, m, r0, L, c, last, visits = 0, i, k, nbytes
    for i in range(10):                                  # the padding after each array: zeros, not leftovers
        if off[i] >= 0:
            nbytes = sizes[i]
            memset(base + off[i] + nbytes, 0, aligned(nbytes) - nbytes)
    cdef int* tiles = <int*>(base + off[5])
    cdef int* tile_start = <int*>(base + off[6])
    cdef int* cu_q = <int*>(base + off[8])
    cdef int* cu_k = <int*>(base + off[9])
    cdef int* seg_out = <int*>(base + off[3])
    cdef int* nf_out = <int*>(base + off[4])
    cdef long long* vstart = NULL
    memcpy(base + off[0], records, ncols * REC_FIELDS * 4)
    memcpy(base + off[1], cta_columns, ncols * 4)
    memcpy(base + off[2], cta_col_start, (G + 1) * 8)
    for i in range(S + 1):
        seg_out[i] = <int>seg_col_start[i]
    # NOTES: Q tile m of sequence b: the first column of the sequence's first segment (records in n order, lo
    # and hi rising with n) with hi > m, and the first with lo > m.
    cdef long long row = 0, p_hi, p_lo
    cu_q[0] = cu_k[0] = 0
    for b in range(B):
        nf_out[b] = n_first[b]
        tile_start[b] = <int>row
        cu_q[b + 1] = <int>(cu_q[b] + seqlens_q[b])
        cu_k[b + 1] = <int>(cu_k[b] + seqlens_k[b])
        r0 = seg_col_start[b * kv_heads]
        L = seg_col_start[b * kv_heads + 1] - r0
        p_hi = p_lo = 0
        for m in range(num_m_blocks[b]):
            while p_hi < L and records[(r0 + p_hi) * REC_FIELDS + REC_HI] <= m:
                p_hi += 1
            while p_lo < L and records[(r0 + p_lo) * REC_FIELDS + REC_LO] <= m:
                p_lo += 1
            tiles[2 * row] = <int>p_hi
            tiles[2 * row + 1] = <int>p_lo
            row += 1
    tile_start[B] = <int>row
    # NOTES: a CTA runs (step + hi - lo) x group_size visits up to the end of its last column (steps count
    # KV-head visits); the per-visit table holds every CTA's rows in CTA order.
    if visit_starts:
        vstart = <long long*>(base + off[7])
        vstart[0] = 0
    for c in range(G):
        if cta_col_start[c + 1] > cta_col_start[c]:
            last = cta_columns[cta_col_start[c + 1] - 1] * REC_FIELDS
            visits += (records[last + REC_STEP] + records[last + REC_HI] - records[last + REC_LO]) * group_size
        if visit_starts:
            vstart[c + 1] = visits
    return visits


cdef tuple pack_into(const int* records, const int* cta_columns, const long long* cta_col_start,
                     const long long* seg_col_start, const int* n_first, const long long* num_m_blocks,
                     const long long* seqlens_q, const long long* seqlens_k, long long ncols, long long G,
                     long long B, long long S, long long kv_heads, long long group_size, bint visit_starts, alloc):
    """pack's result for these arrays (pointers to ncols records, G CTAs, B sequences, S segments)."""
    cdef long long b, total_m = 0, total
    cdef long long off[10]
    cdef long long sizes[10]
    if ncols * REC_FIELDS >= 2 ** 31:
        raise ValueError(f"{ncols} columns: the kernel indexes records with 32-bit ints")
    for b in range(B):
        total_m += num_m_blocks[b]
    total = pack_layout(ncols, G, S, B, total_m, visit_starts, off, sizes)
    buf_arr = np.empty(max(total, 1), dtype=np.uint8) if alloc is None else alloc(max(total, 1))[:max(total, 1)]
    cdef unsigned char[::1] buf = buf_arr
    visits = pack_write(&buf[0], off, sizes, records, cta_columns, cta_col_start, seg_col_start, n_first,
                        num_m_blocks, seqlens_q, seqlens_k, ncols, G, B, S, kv_heads, group_size, visit_starts)
    shapes = ((ncols, REC_FIELDS), (ncols,), (G + 1,), (S + 1,), (B,), (total_m, 2), (B + 1,), (G + 1,), (B + 1,),
              (B + 1,))
    return buf_arr, np.array([off[i] for i in range(10)], dtype=np.int64), shapes, visits


cpdef tuple pack(const int[:, ::1] records, const int[::1] cta_columns, const long long[::1] cta_col_start,
                const int[::1] seg_col_start, const int[::1] n_first, const long long[::1] num_m_blocks,
                const long long[::1] seqlens_q, const long long[::1] seqlens_k, long long kv_heads,
                long long group_size, bint visit_starts, alloc=None):
    """(buffer uint8, offsets int64 (10,), shapes tuple, num_visits) of the arrays NAMES (dtypes DTYPES), the
    CTAs' row starts ``cta_start`` int64 (num_ctas + 1,) only with ``visit_starts`` (else its offset is -1).
    records (columns, 8), cta_columns, cta_col_start, seg_col_start, n_first: a VarlenSchedule's; num_m_blocks,
    seqlens_q, seqlens_k int64 (B,). num_visits: the per-visit table's rows (query heads included).
    ``alloc(nbytes)``: a writable uint8 array of at least nbytes to pack into (e.g. pinned memory, the buffer
    is then its first bytes); default numpy.empty."""
    cdef long long ncols = records.shape[0], G = cta_col_start.shape[0] - 1, B = seqlens_q.shape[0]
    cdef long long S = seg_col_start.shape[0] - 1
    cdef const long long[::1] seg64 = np.asarray(seg_col_start, dtype=np.int64)
    return pack_into(&records[0, 0] if ncols else NULL, &cta_columns[0] if ncols else NULL, &cta_col_start[0],
                     &seg64[0], &n_first[0] if B else NULL, &num_m_blocks[0] if B else NULL,
                     &seqlens_q[0] if B else NULL, &seqlens_k[0] if B else NULL, ncols, G, B, S, kv_heads,
                     group_size, visit_starts, alloc)


cpdef double column_model(long long load, long long num_ctas, long long widest, int rank_rule, double c, double r,
                          bint engine=True):
    """The column model of a table (VarlenSchedule.model_makespan): ``load`` visits on its busiest CTA (group
    size included), ``widest`` the most columns of a segment; the start-up staircase for the ascending rank
    rule."""
    cdef double busy = load * (c if c > r else r) + (c if c < r else r) if engine else load * (c + r)
    if rank_rule == 1:
        return busy + ((widest if widest < num_ctas else num_ctas) - 1) * r
    return busy


cpdef int rank_rule_of(int policy, int tie_sign):
    """The closed-form rank rule of a policy's tables: 0 none (counted), 1 ascending n, 2 descending n."""
    if policy == POLICY_FA3:
        return 2 if tie_sign < 0 else 1
    return 1 if policy == POLICY_DESCENDING else 0


# ------------------------------------------------------------------------------------------------------------
# scheduling
# ------------------------------------------------------------------------------------------------------------
cdef int schedule_core(int policy, const long long* sq, const long long* sk, long long B, long long left,
                       long long right, long long bm, long long bn, long long heads, long long group, bint causal,
                       long long num_sms, tuple candidates, double c, double r, double tolerance,
                       long long few_grouped, long long head_section, Arena* small, Arena* big,
                       Work* w) except -1:
    """schedule_varlen's computation on the arenas' scratch (``w``: every buffer and result); ``candidates``:
    auto's codes, at most 8."""
    cdef int cands[8]
    cdef int ncand = len(candidates), n
    if ncand > 8:
        raise ValueError("at most 8 auto candidates")
    for n in range(ncand):
        cands[n] = candidates[n]
    cdef long long Hkv = heads // group, b, i, nv, total = 0, units, k, ncols, load, plain_load = -1, G, spt
    cdef long long section = head_section if 0 < head_section < Hkv else Hkv
    cdef bint right_bound = False, equal = True
    cdef long long* key
    cdef long long* tmp
    arena_reserve(small, room(2 * B * 8) + room(INFO_FIELDS * B * 8) + room((B + 1) * 8) + 4 * room(B * 8)
                  + room(B * 4))
    w.win = <long long*>arena_take(small, 2 * B * 8)
    w.sh.B = B
    w.sh.info = <long long*>arena_take(small, INFO_FIELDS * B * 8)
    w.sh.off = <long long*>arena_take(small, (B + 1) * 8)
    key = <long long*>arena_take(small, B * 8)
    w.order = <long long*>arena_take(small, B * 8)
    tmp = <long long*>arena_take(small, B * 8)
    w.n_first = <int*>arena_take(small, B * 4)
    w.m_blocks = <long long*>arena_take(small, B * 8)
    for b in range(B):                                   # schedule.canonical_window per sequence
        w.win[2 * b] = -1 if left >= sk[b] - 1 else left
        w.win[2 * b + 1] = right if causal else (-1 if right >= sq[b] - 1 else right)
        right_bound = right_bound or w.win[2 * b + 1] >= 0
    nv = shapes_count(sq, sk, w.win, bm, bn, causal, &w.sh)
    ncols = total_columns(&w.sh, Hkv)
    units = ncols if ncols > 0 else 1
    arena_reserve(big, 2 * room(nv * 8) + room(ncols * REC_FIELDS * 4) + room(ncols * 8) + 3 * room(num_sms * 8)
                  + room((num_sms + 1) * 8) + room((B * Hkv + 1) * 8) + room(ncols * 4) + ncand * room(units * 4))
    w.sh.lo = <long long*>arena_take(big, nv * 8)
    w.sh.hi = <long long*>arena_take(big, nv * 8)
    shapes_fill(sq, sk, w.win, bm, bn, causal, &w.sh)
    w.widest = 0
    for b in range(B):
        key[b] = 0
        for i in range(w.sh.off[b], w.sh.off[b + 1]):
            key[b] -= w.sh.hi[i] - w.sh.lo[i]
        w.widest = w.sh.info[INFO_FIELDS * b + 3] if w.sh.info[INFO_FIELDS * b + 3] > w.widest else w.widest
    stable_argsort(key, B, w.order, tmp)
    for i in range(nv):
        total += w.sh.hi[i] - w.sh.lo[i]
    for i in range(1, nv):
        equal = equal and w.sh.hi[i] - w.sh.lo[i] == w.sh.hi[0] - w.sh.lo[0]
    w.built.rec = <int*>arena_take(big, ncols * REC_FIELDS * 4)
    w.built.order = <long long*>arena_take(big, ncols * 8)
    w.built.loads = <long long*>arena_take(big, num_sms * 8)
    w.built.fill = <long long*>arena_take(big, num_sms * 8)
    w.built.cs = <long long*>arena_take(big, (num_sms + 1) * 8)
    w.built.segc = <long long*>arena_take(big, (B * Hkv + 1) * 8)
    w.built.cols = <int*>arena_take(big, ncols * 4)
    w.ncols, w.nran = ncols, 0
    # auto: candidates in order; the first is built outright (its records and loads), the others dispatched
    # on their loads alone into their own assignment buffers; times[j] = (candidate, model time, assignment)
    cdef int first_cand = -1, cand, j, ntimes = 0, chosen = -1
    cdef int t_cand[8]
    cdef double t_time[8]
    cdef int* t_assign[8]
    cdef int* a
    cdef int* plain_assign = NULL
    cdef int* assign = NULL
    cdef double t, floor, best
    cdef Dispatch d
    cdef bint built = False
    if policy < 0 and group > 1 and Hkv * nv <= few_grouped * num_sms:
        policy = POLICY_DESCENDING
    elif policy < 0:
        floor = column_model(((total * Hkv + num_sms - 1) // num_sms) * group, 1, 0, 0, c, r)
        for j in range(ncand):
            cand = cands[j]
            if not (cand == POLICY_SYMMETRIC_SHIFT or cand == POLICY_FA3 or equal):
                continue
            spt = section if cand == POLICY_FA3 and (causal or right_bound) else 0
            a = NULL
            if first_cand < 0:
                # NOTES: the first candidate is built outright (its records, its loads): it is the choice in most
                # packings (within tolerance of the floor), which then cost one dispatch, not two.
                build_varlen(cand, &w.sh, w.order, Hkv, spt, num_sms, NULL, &w.built)
                first_cand, built = cand, True
                G = w.built.G
                d.G, d.tie = G, w.built.tie
                load = 0
                for k in range(G):
                    load = w.built.loads[k] if w.built.loads[k] > load else load
                w.ran[w.nran] = cand
                w.nran += 1
                if w.built.plain:
                    plain_load = load                # the later plain candidates' load (their dispatch: this one)
            else:
                a = <int*>arena_take(big, units * 4)
                load = busiest_load(cand, &w.sh, w.order, Hkv, spt, num_sms, plain_load, a, &d)
                if d.plain:                          # the plain policies share one dispatch
                    if plain_load < 0:
                        plain_load, plain_assign = load, a
                        w.ran[w.nran] = cand
                        w.nran += 1
                    a = plain_assign                 # NULL: the first candidate's (dispatched again if chosen)
                else:
                    w.ran[w.nran] = cand
                    w.nran += 1
            t = column_model(load * group, d.G, w.widest, rank_rule_of(cand, d.tie), c, r)
            if ntimes == 0 and t <= floor * (1 + tolerance):
                policy, assign, chosen = cand, a, cand
                break
            t_cand[ntimes], t_time[ntimes], t_assign[ntimes] = cand, t, a
            ntimes += 1
        if chosen < 0:
            if ntimes == 0:
                raise ValueError("auto: none of its candidates applies to this batch")
            best = t_time[0]
            for j in range(ntimes):
                best = t_time[j] if t_time[j] < best else best
            for j in range(ntimes):
                if t_time[j] <= best * (1 + tolerance):
                    policy, assign = t_cand[j], t_assign[j]
                    break
        built = built and policy == first_cand
    if not built:
        build_varlen(policy, &w.sh, w.order, Hkv, section if policy == POLICY_FA3 and (causal or right_bound) else 0,
                     num_sms, assign, &w.built)
    w.policy = policy
    return 0


cdef inline void arenas(Arena** small, Arena** big, Arena* own_small, Arena* own_big) noexcept:
    """The shared arenas, marked taken, or (taken already) the caller's own, which it frees."""
    global _busy
    own_small.buf = own_big.buf = NULL
    own_small.cap = own_big.cap = 0
    if _busy:
        small[0], big[0] = own_small, own_big
    else:
        _busy = True
        small[0], big[0] = &_small, &_big


cdef inline void release(Arena* small, Arena* own_small, Arena* own_big) noexcept:
    global _busy
    if small == own_small:
        free(own_small.buf)
        free(own_big.buf)
    else:
        _busy = False


cpdef tuple schedule_varlen(int policy, const long long[::1] sq, const long long[::1] sk, long long left,
                            long long right, long long bm, long long bn, long long heads, long long group,
                            bint causal, long long num_sms, tuple candidates, double c, double r,
                            double tolerance, long long few_grouped, bint with_order=False,
                            long long head_section=0):
    """The compact records of a packed batch's backward schedule (cupy_dash.schedule.build_varlen, which
    checks the arguments): ``(policy, windows int64 (B, 2), (seq_info int64 (B, 6), vis_off (B + 1,), vis_lo,
    vis_hi (columns,)), (records (columns, 8), cta_columns, cta_col_start, seg_col_start int64, loads, num_ctas,
    tie_sign), the candidates auto dispatched, with ``with_order`` the dispatch order int64 (columns,): record
    indices in the order the columns were dispatched, else None)``. ``head_section``: as schedule.build's.
    ``policy``: a _schedule.POLICY_CODES value, or -1 for auto over the codes ``candidates`` by the column model
    (engine costs c, r; ``tolerance``; ``few_grouped``: schedule.AUTO_FEW_GROUPED; docs/schedules.md, "What auto
    means"). (left, right): the checked window (schedule.check_window),
    canonicalised per sequence here; sq, sk int64 (B,) lengths in [0, 2^31). seq_info per sequence: (M, N,
    n_first, NC, T, flags: 1 band, 2 triangular); sequence b's visible columns are vis_off[b] .. vis_off[b + 1].

    NOTES: no table's model time is below ``floor`` (the mean load over num_sms CTAs; stairs >= 0), so a first
    candidate within the tolerance of it is the choice and the others are not dispatched. The chosen
    candidate's dispatch (each unit's CTA) goes to the builder, which does not list-schedule again."""
    cdef long long B = sq.shape[0], S = B * (heads // group), nv
    cdef Arena own_small, own_big
    cdef Arena* small
    cdef Arena* big
    cdef Work w
    arenas(&small, &big, &own_small, &own_big)
    try:
        schedule_core(policy, &sq[0] if B else NULL, &sk[0] if B else NULL, B, left, right, bm, bn, heads, group,
                      causal, num_sms, candidates, c, r, tolerance, few_grouped, head_section, small, big, &w)
        nv = w.sh.off[B]
        G, ncols = w.built.G, w.ncols
        win_arr = np.empty((B, 2), dtype=np.int64)
        info_arr = np.empty((B, INFO_FIELDS), dtype=np.int64)
        off_arr = np.empty(B + 1, dtype=np.int64)
        lo_arr, hi_arr = np.empty(nv, dtype=np.int64), np.empty(nv, dtype=np.int64)
        rec_arr = np.empty((ncols, REC_FIELDS), dtype=np.int32)
        cols_arr, cs_arr = np.empty(ncols, dtype=np.int32), np.empty(G + 1, dtype=np.int64)
        seg_arr, loads_arr = np.empty(S + 1, dtype=np.int64), np.empty(G, dtype=np.int64)
        order_arr = np.empty(ncols if with_order else 0, dtype=np.int64)
        for dst, src, nbytes in ((win_arr, <size_t>w.win, 16 * B),
                                 (info_arr, <size_t>w.sh.info, 8 * INFO_FIELDS * B),
                                 (off_arr, <size_t>w.sh.off, 8 * (B + 1)), (lo_arr, <size_t>w.sh.lo, 8 * nv),
                                 (hi_arr, <size_t>w.sh.hi, 8 * nv),
                                 (rec_arr, <size_t>w.built.rec, 4 * REC_FIELDS * ncols),
                                 (cols_arr, <size_t>w.built.cols, 4 * ncols),
                                 (cs_arr, <size_t>w.built.cs, 8 * (G + 1)),
                                 (seg_arr, <size_t>w.built.segc, 8 * (S + 1)),
                                 (loads_arr, <size_t>w.built.loads, 8 * G),
                                 (order_arr, <size_t>w.built.order, 8 * ncols if with_order else 0)):
            copy_out(dst, src, nbytes)
        ran = []
        for j in range(w.nran):
            ran.append(w.ran[j])
        return (w.policy, win_arr, (info_arr, off_arr, lo_arr, hi_arr),
                (rec_arr, cols_arr, cs_arr, seg_arr, loads_arr, G, w.built.tie), tuple(ran),
                order_arr if with_order else None)
    finally:
        release(small, &own_small, &own_big)


cdef copy_out(dst, size_t src, long long nbytes):
    cdef unsigned char[::1] d = dst.reshape(-1).view(np.uint8)
    if nbytes:
        memcpy(&d[0], <void*>src, nbytes)


def new_packing(int policy, const long long[::1] sq, const long long[::1] sk, long long left, long long right,
                long long bm, long long bn, long long heads, long long group, bint causal, long long num_sms,
                tuple candidates, double c, double r, double tolerance, long long few_grouped, bint visit_starts,
                alloc=None, long long head_section=0):
    """(policy, pack's four outputs, num_ctas, tie_sign, rank_rule, most Q tiles, most KV tiles of a sequence
    (at least 1 each)) of :func:`schedule_varlen`'s records for these arguments (``head_section`` as there), packed
    as :func:`pack` packs them (into ``alloc``'s buffer): the host side of a training step's new packing in one
    call, with no intermediate Python object."""
    cdef long long B = sq.shape[0], b, most_m = 1, most_n = 1, S = B * (heads // group)
    cdef Arena own_small, own_big
    cdef Arena* small
    cdef Arena* big
    cdef Work w
    cdef const long long* info
    arenas(&small, &big, &own_small, &own_big)
    try:
        schedule_core(policy, &sq[0] if B else NULL, &sk[0] if B else NULL, B, left, right, bm, bn, heads, group,
                      causal, num_sms, candidates, c, r, tolerance, few_grouped, head_section, small, big, &w)
        for b in range(B):
            info = w.sh.info + INFO_FIELDS * b
            w.n_first[b] = <int>(info[2] if info[2] > 0 else 0)
            w.m_blocks[b] = info[0]
            most_m = info[0] if info[0] > most_m else most_m
            most_n = info[1] if info[1] > most_n else most_n
        out = pack_into(w.built.rec, w.built.cols, w.built.cs, w.built.segc, w.n_first, w.m_blocks,
                        &sq[0] if B else NULL, &sk[0] if B else NULL, w.ncols, w.built.G, B, S, heads // group, group,
                        visit_starts, alloc)
        return (w.policy,) + out + (w.built.G, w.built.tie, rank_rule_of(w.policy, w.built.tie), most_m, most_n)
    finally:
        release(small, &own_small, &own_big)


cpdef long long kv_tiles(const long long[::1] lens, long long bn):
    """The KV tiles of a packed batch, sum of ceil(lens[b] / bn): its KV columns per KV head."""
    cdef long long b, n = 0
    for b in range(lens.shape[0]):
        n += (lens[b] + bn - 1) // bn
    return n


cpdef tuple checked_cu_seqlens(const long long[::1] cu, long long total, long long max_len):
    """``(code, longest, cu int32)`` of host cu_seqlens (B + 1 >= 2 entries): code 0 when 0 = cu[0] <= ... <= cu[B]
    = total and no length exceeds max_len (then the int32 copy), 1 when the entries are not such a sequence, 2 when
    the longest length exceeds max_len (the copy then None): cupy_dash.core.varlen's check in one pass."""
    cdef Py_ssize_t n = cu.shape[0], i
    cdef long long L, longest = 0
    if n < 2 or cu[0] != 0 or cu[n - 1] != total:
        return 1, 0, None
    out_arr = np.empty(n, dtype=np.int32)
    cdef int[::1] out = out_arr
    out[0] = 0
    for i in range(1, n):
        L = cu[i] - cu[i - 1]
        if L < 0:
            return 1, 0, None
        longest = L if L > longest else longest
        out[i] = <int>cu[i]
    if longest > max_len:
        return 2, longest, None
    return 0, longest, out_arr
