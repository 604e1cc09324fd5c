# cython: boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""A packed batch's compact varlen records in the byte layout that is uploaded (one host buffer, one copy).

The arrays of varlen_device.device_arrays (what the DASH_COMPACT + DASH_VARLEN kernel and kernels_src/bwd_expand.cu
read) plus, for the GPU expansion, each CTA's first row in the per-visit table, and the lengths as cu_seqlens,
each at a 256-byte aligned offset of one uint8 buffer. tile_columns and the CTAs' row starts are computed here
in one pass each (varlen_device.tile_columns / cta_visit_start are the numpy statements of the same values,
which the tests compare with these), so that a new packing costs one call rather than a dozen numpy ones.
"""
import numpy as np

include "_compact_rule.pxi"

NAMES = ("col_records", "cta_columns", "cta_col_start", "seg_col_start", "seq_n_first", "tile_columns",
         "seq_tile_start", "cta_start", "cu_seqlens_q", "cu_seqlens_k")
DTYPES = (np.int32, np.int32, np.int64, np.int32, np.int32, np.int32, np.int32, np.int64, np.int32, np.int32)


cdef inline long long aligned(long long nbytes) noexcept:
    return (nbytes + 255) // 256 * 256


def pack(const int[:, ::1] records, const int[::1] cta_columns, const long long[::1] cta_col_start,
         const int[::1] seg_col_start, const int[::1] n_first, const long long[::1] num_m_blocks,
         const long long[::1] seqlens_q, const long long[::1] seqlens_k, long long kv_heads, long long group_size,
         bint visit_starts):
    """(buffer uint8, offsets int64 (10,), shapes tuple, num_visits) of the arrays NAMES (dtypes DTYPES), the
    CTAs' row starts ``cta_start`` int64 (num_ctas + 1,) only with ``visit_starts`` (else its offset is -1).
    records (columns, 8), cta_columns, cta_col_start, seg_col_start, n_first: a VarlenSchedule's; num_m_blocks,
    seqlens_q, seqlens_k int64 (B,). num_visits: the per-visit table's rows (query heads included)."""
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
    buf_arr = np.empty(max(total, 1), dtype=np.uint8)
    cdef unsigned char[::1] buf = buf_arr
    cdef unsigned char* base = &buf[0]
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
    # and hi rising with n) with hi > m, and the first with lo > m (varlen_device.tile_columns).
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
