# cython: boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# What the schedule builders share: the policy codes, the Q-tile range of a KV tile and the rectangle of a
# symmetric_shift pair, for the one builder (_varlen_sched.pyx, which varlen_pack.pyx runs) and the tests' oracles
# (testing.pyx). Inline: the builders call them per unit or column.
#
# NOTES: a policy is (1) work units dispatched greedily to the CTA that frees up first, (2) a Q-tile order per
# column, (3) a tie-break; ranks are derived from (step, tie-break) keys, so every wait points to an earlier key and
# no table can deadlock, whatever the number of CTAs (docs/schedules.md, "Every policy is three choices").
# NOTES: grouped columns (g > 1) are Q-tile-major: the g = 1 table of the KV heads with every visit, and its rank,
# repeated for the g query heads of its group; head-major columns would break the phase relations the policies are
# built on (docs/schedules.md, "Why the rules hold").
# NOTES: every mask is band-shaped: KV tile n sees the Q tiles [lo[n], hi[n]), both ends rising with n; a tile that
# no query sees has an empty range and no visits. How each policy walks a band, and why its tables stay wait-free:
# docs/schedules.md, "Sliding windows" and "Why the rules hold".

cdef enum:
    POLICY_FA3 = 0
    POLICY_DESCENDING = 1
    POLICY_SHIFT = 2
    POLICY_SYMMETRIC_SHIFT = 3


cdef inline void tile_range(long long n, long long sq, long long sk, long long bm, long long bn, bint causal,
                            long long left, long long right, long long* lo, long long* hi) noexcept:
    """Q tiles [lo, hi) that KV tile n of one sequence sees (the rule of _schedule.column_ranges)."""
    cdef long long M = (sq + bm - 1) // bm, diag = sk - sq, k0 = n * bn, k1, first, last
    if causal:
        right = 0
    k1 = k0 + bn if k0 + bn < sk else sk
    lo[0], hi[0] = 0, M
    first = (k0 - diag - right if k0 - diag - right > 0 else 0) if right >= 0 else 0
    last = (k1 - 1 - diag + left if k1 - 1 - diag + left < sq - 1 else sq - 1) if left >= 0 else sq - 1
    if last < 0:
        hi[0] = 0
    elif first > sq - 1:
        lo[0] = M
    else:
        lo[0] = first // bm
        hi[0] = last // bm + 1


cdef inline void pair_rectangle(long long u, long long base, long long G, long long P, long long M,
                                const long long* lo, long long* rs, long long* rot) noexcept:
    """Paired long column of unit u (its head's units: base .. base + P - 1, lo: the head's visible columns'
    range starts): the rectangle [rs, M) of Q tiles shared by every long column of its head in its dispatch
    wave (units w G .. (w + 1) G - 1), and its rotation there: its index i in the wave, spread to i W // k when
    the wave's k columns are fewer than the rectangle's W rows (consecutive ranks one or two steps apart), else
    i mod W."""
    cdef long long w = u // G, k0, k1, W
    k0 = (w * G if w * G > base else base) - base
    k1 = ((w + 1) * G if (w + 1) * G < base + P else base + P) - 1 - base
    rs[0] = lo[k1]
    W = M - rs[0]
    if W > k1 - k0 + 1:
        rot[0] = (u - base - k0) * W // (k1 - k0 + 1)
    else:
        rot[0] = (u - base - k0) % W


cdef inline long long shift_rotation(long long k, long long n_first, long long L, long long T,
                                     long long NC) noexcept:
    """Rotation of a `shift` column k of its head's NC (KV tile n_first + k) over its L Q tiles: spread to k L // NC
    when every column shares the range (T == NC) and the Q tiles outnumber the columns (consecutive ranks one or two
    steps apart), else (n_first + k) mod L."""
    if T == NC and L > NC:
        return k * L // NC
    return (n_first + k) % L
