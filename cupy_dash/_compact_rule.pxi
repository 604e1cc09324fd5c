# One column record of a compact schedule (layout in cupy_dash/compact.py): the Q-tile order rule and its
# inverse, included by _compact.pyx (builder, record checks) and _compact_view.pyx (expansion and the per-visit
# computations of the kernel). A record is 8 int32 fields:

cdef enum:
    REC_STEP = 0    # position of the column's first visit in its CTA's list (KV-head visits)
    REC_LO = 1      # the column visits the Q tiles [lo, hi)
    REC_HI = 2
    REC_SPLIT = 3   # -1: descending walk hi - 1, ..., lo; else: [split, hi) rotated by rot, then lo .. split - 1
    REC_ROT = 4
    REC_CTA = 5
    REC_HEAD = 6    # KV head (batch * Hkv + kv head)
    REC_N = 7       # KV tile n_block
    REC_FIELDS = 8

cdef enum:
    RANK_COUNT = 0  # rank = number of the tile's columns with a smaller (step, tie-break) key
    RANK_ASC_N = 1  # every dQ tile adds in ascending n: rank = n - (first column that visits the tile)
    RANK_DESC_N = 2 # ... in descending n: rank = (last column that visits the tile) - n


cdef inline long long rule_tile(const int* rec, long long s) noexcept nogil:
    """The Q tile of the column's s-th visit (0 <= s < hi - lo)."""
    cdef long long split = rec[REC_SPLIT], r, x
    if split < 0:
        return rec[REC_HI] - 1 - s
    r = rec[REC_HI] - split
    if s < r:
        x = s + rec[REC_ROT]
        if x >= r:
            x -= r
        return split + x
    return rec[REC_LO] + s - r


cdef inline long long rule_index(const int* rec, long long m) noexcept nogil:
    """Inverse of rule_tile: at which of its visits the column reaches Q tile m (lo <= m < hi)."""
    cdef long long split = rec[REC_SPLIT], r, x
    if split < 0:
        return rec[REC_HI] - 1 - m
    r = rec[REC_HI] - split
    if m >= split:
        x = m - split - rec[REC_ROT]
        if x < 0:
            x += r
        return x
    return r + m - rec[REC_LO]


cdef tuple cta_lists(int[:, ::1] rec, const long long[::1] order, long long ncols, long long G):
    """(cta_columns int32 (ncols,), cta_col_start int64 (G + 1,)): every CTA's record indices in dispatch order,
    a stable counting sort of ``order`` (record indices in dispatch order) by the records' CTA."""
    cta_col_start_arr = np.zeros(G + 1, dtype=np.int64)
    cdef long long[::1] cs = cta_col_start_arr
    cdef long long idx, c, u
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
    return cta_columns_arr, cta_col_start_arr


cdef check_cta_lists(const int[:, ::1] rec, const int[::1] cols, const long long[::1] cs, long long ncols,
                     long long G):
    """Every CTA's list (cols[cs[c]:cs[c + 1]]): record indices in range, each record on one list only and on its
    own CTA's, its step the number of visits before it there, at most 2^31 - 1 visits per CTA. Raises
    ValueError naming the first offence."""
    seen_arr = np.zeros(ncols, dtype=np.uint8)
    cdef unsigned char[::1] seen = seen_arr
    cdef long long c, j, i, step
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
            step += rec[i, REC_HI] - rec[i, REC_LO]
            if step > 0x7fffffff:
                raise ValueError(f"CTA {c}: more than 2^31 - 1 visits")
