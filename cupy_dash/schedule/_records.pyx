# cython: boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The checks that every table of column records shares (_compact.check_records, _varlen_sched.check_varlen,
_varlen_view.expand); the record layout and its rule are in _records.pxd."""
import numpy as np


cdef int rule_error(long long i, long long split, long long rot, long long lo, long long hi) except -1:
    """check_rule's error."""
    raise ValueError(f"record {i}: split {split}, rot {rot} do not give an order of [{lo}, {hi})")


cdef int check_cta_lists(const int[:, ::1] rec, const int[::1] cols, const long long[::1] cs, long long ncols,
                         long long G) except -1:
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
    return 0
