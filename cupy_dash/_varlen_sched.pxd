# The varlen builder's entry points, for cimport by _varlen_pack (a new packing's table in one call).
cpdef tuple sequence_shapes(const long long[::1] sq, const long long[::1] sk, const long long[:, ::1] win,
                            long long bm, long long bn, bint causal)
cpdef tuple busiest_load(int policy, const long long[:, ::1] info, const long long[::1] voff,
                         const long long[::1] vlo, const long long[::1] vhi, const long long[::1] seq_order,
                         long long Hkv, bint spt, long long num_sms, long long plain_load=*, int[::1] assign=*)
cpdef tuple build_varlen(int policy, const long long[:, ::1] info, const long long[::1] voff,
                         const long long[::1] vlo, const long long[::1] vhi, const long long[::1] seq_order,
                         long long Hkv, bint spt, long long num_sms, const int[::1] assign=*)
cpdef bint plain_units(int policy, const long long[:, ::1] info, const long long[::1] seq_order, long long Hkv,
                       bint spt, long long num_sms) except -1
