# The CTAs' column lists of per-column records: built by the compact and varlen builders, checked by their
# record checks (include after _compact_rule.pxi).
cdef void cta_lists_into(const int* rec, const long long* order, long long ncols, long long G, int* cta_columns,
                         long long* cs, long long* fill) noexcept:
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


cdef tuple cta_lists(int[:, ::1] rec, const long long[::1] order, long long ncols, long long G):
    """(cta_columns int32 (ncols,), cta_col_start int64 (G + 1,)) of :func:`cta_lists_into`."""
    cta_col_start_arr = np.empty(G + 1, dtype=np.int64)
    fill_arr = np.empty(G + 1, dtype=np.int64)
    cta_columns_arr = np.empty(ncols, dtype=np.int32)
    cdef long long[::1] cs = cta_col_start_arr, fill = fill_arr
    cdef int[::1] cols = cta_columns_arr
    cta_lists_into(&rec[0, 0] if ncols else NULL, &order[0] if ncols else NULL, ncols, G,
                   &cols[0] if ncols else NULL, &cs[0], &fill[0])
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
