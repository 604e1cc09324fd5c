# cython: boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# One column record of a compact schedule (docs/schedules.md, "Compact records"): its fields, the Q-tile order rule
# and its inverse, the CTAs' column lists that the builders make (cta_lists_into) and the checks every table of
# records shares (_records.pyx). Inline: the per-visit loops use them. A record is 8 int32 fields:

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


cdef int rule_error(long long i, long long split, long long rot, long long lo, long long hi) except -1


cdef inline int check_rule(long long i, long long split, long long rot, long long lo, long long hi) except -1:
    """Raises ValueError unless record i's (split, rot) order the Q tiles [lo, hi): a bijection onto them."""
    if split == -1 and rot == 0 or lo <= split < hi and 0 <= rot < hi - split:
        return 0
    return rule_error(i, split, rot, lo, hi)


cdef int check_cta_lists(const int[:, ::1] rec, const int[::1] cols, const long long[::1] cs, long long ncols,
                         long long G) except -1


cdef inline void cta_lists_into(const int* rec, const long long* order, long long ncols, long long G,
                                int* cta_columns, long long* cs, long long* fill) noexcept:
    """cta_columns (ncols,) and cs (G + 1,): every CTA's record indices in dispatch order, a stable counting sort
    of ``order`` (record indices in dispatch order) by the records' CTA; ``fill``: G entries of scratch."""
    cdef long long idx, c, u
    for c in range(G + 1):
        cs[c] = 0
    for idx in range(ncols):
        cs[rec[idx * REC_FIELDS + REC_CTA] + 1] += 1
    for c in range(G):
        cs[c + 1] += cs[c]
        fill[c] = cs[c]
    for u in range(ncols):
        c = rec[order[u] * REC_FIELDS + REC_CTA]
        cta_columns[fill[c]] = <int>order[u]
        fill[c] += 1
