# The varlen builder's entry points, for cimport by varlen_pack (a new packing's table in one call): C-level, on
# caller-owned buffers, so that a training step's new packing allocates no Python objects on the way.

cdef enum:
    INFO_FIELDS = 6     # a sequence's shape: M, N, n_first, NC, T, flags (1 band, 2 triangular)

cdef struct Shapes:     # a packed batch of B sequences (shapes_count, shapes_fill)
    long long B
    long long* info     # (B, INFO_FIELDS)
    long long* off      # (B + 1,): sequence b's visible columns are off[b] .. off[b + 1] - 1
    long long* lo       # (off[B],): their Q-tile ranges [lo, hi)
    long long* hi

cdef struct Built:      # build_varlen's buffers (the caller's) and scalars
    int* rec            # (columns, 8) records
    long long* order    # (columns,) scratch: record indices in dispatch order
    long long* loads    # (num_ctas,)
    long long* segc     # (B * Hkv + 1,) seg_col_start
    int* cols           # (columns,) cta_columns
    long long* cs       # (num_ctas + 1,) cta_col_start
    long long* fill     # (num_sms,) scratch
    long long G         # num_ctas
    int tie             # tie_sign
    bint plain          # the units are every segment's columns alone in ascending n (Units.plain)

cdef struct Dispatch:   # busiest_load's other outputs
    long long G
    int tie
    bint plain

cdef long long shapes_count(const long long* sq, const long long* sk, const long long* win, long long bm,
                            long long bn, bint causal, Shapes* sh) except -1
cdef void shapes_fill(const long long* sq, const long long* sk, const long long* win, long long bm, long long bn,
                      bint causal, Shapes* sh) noexcept
cdef long long total_columns(const Shapes* sh, long long Hkv) except -1
cdef long long busiest_load(int policy, const Shapes* sh, const long long* seq_order, long long Hkv, long long spt,
                            long long num_sms, long long plain_load, int* assign, Dispatch* out) except -1
cdef int build_varlen(int policy, const Shapes* sh, const long long* seq_order, long long Hkv, long long spt,
                      long long num_sms, const int* assign, Built* out) except -1
