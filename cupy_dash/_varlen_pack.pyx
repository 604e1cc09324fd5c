# cython: boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""A packed batch's compact varlen records in the byte layout that is uploaded (one host buffer, one copy).

The compact arrays NAMES (what the DASH_COMPACT + DASH_VARLEN kernel and kernels_src/bwd_expand.cu read) plus,
for the GPU expansion, each CTA's first row in the per-visit table, and the lengths as cu_seqlens, each at a
256-byte aligned offset of one uint8 buffer. tile_columns and the CTAs' row starts are computed here in one pass
each (tests/test_varlen_compact.py holds the numpy statements of the same values and compares them with these),
so that a new packing costs one call rather than a dozen numpy ones.

``schedule_varlen`` builds a packed batch's records (the per-sequence windows, shapes and dispatch order,
``auto``'s choice, the records: what cupy_dash.varlen_schedule.build_varlen returns after its argument checks);
``new_packing`` is the host side of a training step's new packing in one call: those records, packed.
"""
import numpy as np
from libc.string cimport memset

from cupy_dash._varlen_sched cimport build_varlen, busiest_load, plain_units, sequence_shapes

include "_units.pxi"
include "_compact_rule.pxi"

NAMES = ("col_records", "cta_columns", "cta_col_start", "seg_col_start", "seq_n_first", "tile_columns",
         "seq_tile_start", "cta_start", "cu_seqlens_q", "cu_seqlens_k")
DTYPES = (np.int32, np.int32, np.int64, np.int32, np.int32, np.int32, np.int32, np.int64, np.int32, np.int32)


cdef inline long long aligned(long long nbytes) noexcept:
    return (nbytes + 255) // 256 * 256


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
    cdef long long S = seg_col_start.shape[0] - 1, b, m, r0, L, total_m = 0, c, last, visits = 0
    if ncols * REC_FIELDS >= 2 ** 31:
        raise ValueError(f"{ncols} columns: the kernel indexes records with 32-bit ints")
    for b in range(B):
        total_m += num_m_blocks[b]
    shapes = ((ncols, REC_FIELDS), (ncols,), (G + 1,), (S + 1,), (B,), (total_m, 2), (B + 1,), (G + 1,),
              (B + 1,), (B + 1,))
    sizes = (ncols * REC_FIELDS * 4, ncols * 4, (G + 1) * 8, (S + 1) * 4, B * 4, total_m * 8, (B + 1) * 4,
             (G + 1) * 8 if visit_starts else 0, (B + 1) * 4, (B + 1) * 4)
    offsets_arr = np.full(10, -1, dtype=np.int64)
    cdef long long[::1] off = offsets_arr
    cdef long long total = 0, i
    for i in range(10):
        if i != 7 or visit_starts:
            off[i] = total
            total += aligned(sizes[i])
    buf_arr = np.empty(max(total, 1), dtype=np.uint8) if alloc is None else alloc(max(total, 1))[:max(total, 1)]
    cdef unsigned char[::1] buf = buf_arr
    cdef unsigned char* base = &buf[0]
    cdef long long nbytes
    for i in range(10):                                  # the padding after each array: zeros, not leftovers
        if off[i] >= 0:
            nbytes = sizes[i]
            memset(base + off[i] + nbytes, 0, aligned(nbytes) - nbytes)
    cdef int* rec_out = <int*>(base + off[0])
    cdef int* cols_out = <int*>(base + off[1])
    cdef long long* cs_out = <long long*>(base + off[2])
    cdef int* seg_out = <int*>(base + off[3])
    cdef int* nf_out = <int*>(base + off[4])
    cdef int* tiles = <int*>(base + off[5])
    cdef int* tile_start = <int*>(base + off[6])
    cdef int* cu_q = <int*>(base + off[8])
    cdef int* cu_k = <int*>(base + off[9])
    cdef long long* vstart
    cdef long long k
    for i in range(ncols):
        for k in range(REC_FIELDS):
            rec_out[i * REC_FIELDS + k] = records[i, k]
        cols_out[i] = cta_columns[i]
    for c in range(G + 1):
        cs_out[c] = cta_col_start[c]
    for i in range(S + 1):
        seg_out[i] = seg_col_start[i]
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
            while p_hi < L and records[r0 + p_hi, REC_HI] <= m:
                p_hi += 1
            while p_lo < L and records[r0 + p_lo, REC_LO] <= m:
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
                last = cta_columns[cta_col_start[c + 1] - 1]
                visits += (records[last, REC_STEP] + records[last, REC_HI] - records[last, REC_LO]) * group_size
            vstart[c + 1] = visits
    else:
        for c in range(G):
            if cta_col_start[c + 1] > cta_col_start[c]:
                last = cta_columns[cta_col_start[c + 1] - 1]
                visits += (records[last, REC_STEP] + records[last, REC_HI] - records[last, REC_LO]) * group_size
    return buf_arr, offsets_arr, shapes, visits


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


cpdef tuple schedule_varlen(int policy, const long long[::1] sq, const long long[::1] sk, long long left,
                            long long right, long long bm, long long bn, long long heads, long long group,
                            bint causal, long long num_sms, tuple candidates, double c, double r,
                            double tolerance, long long few_grouped):
    """The compact records of a packed batch's backward schedule (cupy_dash.varlen_schedule.build_varlen, which
    checks the arguments): ``(policy, windows int64 (B, 2), sequence_shapes' four arrays, build_varlen's seven
    outputs, the candidates auto dispatched)``. ``policy``: a _schedule.POLICY_CODES value, or -1 for auto over
    the codes ``candidates``: their column models (engine costs c, r) from their busiest CTA's load alone, the
    first within ``tolerance`` of the best among those the model applies to (symmetric_shift and fa3, the others
    only with equal columns), except that grouped columns with at most ``few_grouped`` per CTA take descending
    (schedule.AUTO_FEW_GROUPED). (left, right): the checked window (schedule.check_window), canonicalised per
    sequence here; sq, sk int64 (B,) lengths in [0, 2^31).

    NOTES: the sequences are dispatched longest first by visible tiles (stable). No table's model time is below
    ``floor`` (its busiest CTA holds at least the mean load over num_sms CTAs; stairs >= 0), so a first candidate
    within the tolerance of it is within the tolerance of the best and is the choice: the other candidates'
    dispatches are skipped (most packings of several sequences). The chosen candidate's dispatch (each unit's
    CTA) is handed to the builder, which does not list-schedule again."""
    cdef long long B = sq.shape[0], Hkv = heads // group, b, i, ncols_seq, total = 0, widest = 0, units
    win_arr = np.empty((B, 2), dtype=np.int64)
    cdef long long[:, ::1] win = win_arr
    cdef bint right_bound = False
    for b in range(B):                                   # schedule.canonical_window per sequence
        win[b, 0] = -1 if left >= sk[b] - 1 else left
        win[b, 1] = right if causal else (-1 if right >= sq[b] - 1 else right)
        right_bound = right_bound or win[b, 1] >= 0
    shapes = sequence_shapes(sq, sk, win, bm, bn, causal)
    cdef long long[:, ::1] info = shapes[0]
    cdef long long[::1] voff = shapes[1], vlo = shapes[2], vhi = shapes[3]
    key_arr = np.empty(B, dtype=np.int64)
    cdef long long[::1] key = key_arr
    for b in range(B):
        key[b] = 0
        for i in range(voff[b], voff[b + 1]):
            key[b] -= vhi[i] - vlo[i]
        widest = info[b, 3] if info[b, 3] > widest else widest
    order_arr = np.argsort(key_arr, kind="stable")
    cdef long long[::1] order = order_arr
    ncols_seq = voff[B]
    for i in range(ncols_seq):
        total += vhi[i] - vlo[i]
    cdef bint equal = True
    for i in range(1, ncols_seq):
        equal = equal and vhi[i] - vlo[i] == vhi[0] - vlo[0]
    assign = built = first = None
    ran = []
    cdef int cand, tie, first_cand = -1
    cdef long long load, G, plain_load = -1, k
    cdef long long[::1] first_loads
    cdef double t, floor, best = 0.0
    cdef list times
    cdef bint spt
    if policy < 0 and group > 1 and Hkv * ncols_seq <= few_grouped * num_sms:
        policy = POLICY_DESCENDING
    elif policy < 0:
        floor = column_model(((total * Hkv + num_sms - 1) // num_sms) * group, 1, 0, 0, c, r)
        units = ncols_seq * Hkv if ncols_seq * Hkv > 0 else 1
        times, plain_assign = [], None
        for cand in candidates:
            if not (cand == POLICY_SYMMETRIC_SHIFT or cand == POLICY_FA3 or equal):
                continue
            spt = cand == POLICY_FA3 and (causal or right_bound)
            a = None
            if first is None:
                # NOTES: the first candidate is built outright (its records, its loads): it is the choice in most
                # packings (within tolerance of the floor), which then cost one dispatch, not two.
                first, first_cand = build_varlen(cand, info, voff, vlo, vhi, order, Hkv, spt, num_sms), cand
                first_loads, G, tie = first[4], first[5], first[6]
                load = 0
                for k in range(G):
                    load = first_loads[k] if first_loads[k] > load else load
                ran.append(cand)
                if plain_units(cand, info, order, Hkv, spt, num_sms):
                    plain_load = load                # the later plain candidates' load (their dispatch: this one)
            else:
                a = np.empty(units, dtype=np.int32)
                load, G, tie, plain = busiest_load(cand, info, voff, vlo, vhi, order, Hkv, spt, num_sms,
                                                   plain_load, a)
                if plain:                                # the plain policies share one dispatch
                    if plain_load < 0:
                        plain_load, plain_assign = load, a
                        ran.append(cand)
                    a = plain_assign                     # None: the first candidate's (dispatched again if chosen)
                else:
                    ran.append(cand)
            t = column_model(load * group, G, widest, rank_rule_of(cand, tie), c, r)
            if not times and t <= floor * (1 + tolerance):
                policy, assign = cand, a
                break
            times.append((cand, t, a))
        if policy < 0:
            best = times[0][1]
            for cand, t, a in times:
                best = t if t < best else best
            for cand, t, a in times:
                if t <= best * (1 + tolerance):
                    policy, assign = cand, a
                    break
        if policy == first_cand:
            built = first
    if built is None:
        built = build_varlen(policy, info, voff, vlo, vhi, order, Hkv,
                             policy == POLICY_FA3 and (causal or right_bound), num_sms, assign)
    return policy, win_arr, shapes, built, tuple(ran)


def new_packing(int policy, const long long[::1] sq, const long long[::1] sk, long long left, long long right,
                long long bm, long long bn, long long heads, long long group, bint causal, long long num_sms,
                tuple candidates, double c, double r, double tolerance, long long few_grouped, bint visit_starts,
                alloc=None):
    """(policy, pack's four outputs, num_ctas, tie_sign, rank_rule, most Q tiles, most KV tiles of a sequence
    (at least 1 each)) of :func:`schedule_varlen`'s records for these arguments, packed as :func:`pack` packs
    them (into ``alloc``'s buffer, as pack): the host side of a training step's new packing in one call."""
    policy, _, shapes, built, _ = schedule_varlen(policy, sq, sk, left, right, bm, bn, heads, group, causal,
                                                  num_sms, candidates, c, r, tolerance, few_grouped)
    cdef long long[:, ::1] info = shapes[0]
    cdef long long B = sq.shape[0], b, most_m = 1, most_n = 1
    records, cols, cs, seg, loads, G, tie = built
    n_first_arr = np.empty(B, dtype=np.int32)
    m_blocks_arr = np.empty(B, dtype=np.int64)
    cdef int[::1] n_first = n_first_arr
    cdef long long[::1] m_blocks = m_blocks_arr
    for b in range(B):
        n_first[b] = <int>(info[b, 2] if info[b, 2] > 0 else 0)
        m_blocks[b] = info[b, 0]
        most_m = info[b, 0] if info[b, 0] > most_m else most_m
        most_n = info[b, 1] if info[b, 1] > most_n else most_n
    out = pack(records, cols, cs, seg.astype(np.int32), n_first, m_blocks, sq, sk, heads // group, group,
               visit_starts, alloc)
    return (policy,) + out + (G, tie, rank_rule_of(policy, tie), most_m, most_n)


cpdef tuple checked_cu_seqlens(const long long[::1] cu, long long total, long long max_len):
    """``(code, longest, cu int32)`` of host cu_seqlens (B + 1 >= 2 entries): code 0 when 0 = cu[0] <= ... <= cu[B]
    = total and no length exceeds max_len (then the int32 copy), 1 when the entries are not such a sequence, 2 when
    the longest length exceeds max_len (the copy then None): cupy_dash.varlen's check in one pass."""
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
