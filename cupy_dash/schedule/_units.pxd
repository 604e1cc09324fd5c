# cython: boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# What the schedule builders share (_schedule.pyx: per-visit tables; _compact.pyx: column records of one problem;
# _varlen_sched.pyx: column records of packed batches, which varlen_pack.pyx builds through it), so that they
# dispatch the same units to the same CTAs. Inline: the builders call them per unit, column or visit. The NOTES
# are in _schedule.pyx.

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


cdef inline void pair_rectangle(long long u, long long base, long long G, long long P, const long long* lo,
                                long long* rs, long long* rot) noexcept:
    """Paired long column of unit u (its head's units: base .. base + P - 1, lo: the head's visible columns'
    range starts): the rectangle [rs, M) of Q tiles shared by every long column of its head in its dispatch
    wave (units w G .. (w + 1) G - 1), and its rotation there (its index in the wave)."""
    cdef long long w = u // G, k0, k1
    k0 = (w * G if w * G > base else base) - base
    k1 = ((w + 1) * G if (w + 1) * G < base + P else base + P) - 1 - base
    rs[0] = lo[k1]
    rot[0] = u - base - k0


cdef struct UnitShape:
    long long M, N          # Q tiles, KV tiles
    long long n_first, NC   # the visible columns are n_first .. n_first + NC - 1
    long long T             # start-clipped columns (their ranges all begin at lo[n_first])
    long long P             # units per head (pairs when paired, else NC)
    long long U, G          # units in all, CTAs used
    bint band, paired, mirrored, spt
    int tb_sign             # tie-break between columns at one step: +1 ascending n, -1 descending n


cdef inline UnitShape unit_shape(int policy, long long M, const long long[::1] lo, const long long[::1] hi,
                                 long long num_heads, bint causal, long long num_sms,
                                 long long window_right) noexcept:
    """The units of one problem; lo / hi are column_ranges (N entries)."""
    cdef UnitShape sh
    cdef long long n, N = lo.shape[0]
    cdef bint triangular = causal or window_right >= 0
    sh.M = M
    sh.N = N
    sh.n_first = -1
    sh.NC = 0
    sh.T = 0
    sh.band = False
    for n in range(N):
        if lo[n] < hi[n]:
            if sh.n_first < 0:
                sh.n_first = n
            sh.NC += 1
            sh.T += lo[n] == lo[sh.n_first]
            triangular = triangular and hi[n] == M
            sh.band = sh.band or hi[n] < M
    sh.paired = (policy == POLICY_SYMMETRIC_SHIFT and triangular and num_heads * ((sh.NC + 1) // 2) >= num_sms)
    sh.mirrored = policy == POLICY_SYMMETRIC_SHIFT and sh.band
    sh.spt = policy == POLICY_FA3 and (causal or window_right >= 0)
    sh.P = (sh.NC + 1) // 2 if sh.paired else sh.NC
    sh.U = num_heads * sh.P
    sh.G = num_sms if num_sms < sh.U else sh.U
    sh.tb_sign = -1 if (policy == POLICY_SYMMETRIC_SHIFT or sh.spt) else 1
    return sh


cdef inline void unit_columns(int policy, bint spt, bint paired, bint mirrored, long long u,
                              long long num_heads, long long n_first, long long NC, long long T, long long P,
                              long long* head, long long* n0, long long* n1) noexcept:
    """Work unit u (in dispatch order) -> head and one or two KV columns (n1 = -1 when single), among the NC
    visible columns n_first .. n_first + NC - 1 of every head; ``mirrored`` (symmetric_shift on a band): the
    T start-clipped columns in ascending n, then the others in descending n."""
    cdef long long k
    if mirrored:
        head[0] = u // NC
        k = u % NC
        n0[0] = n_first + k if k < T else n_first + NC - 1 - (k - T)
        n1[0] = -1
    elif paired:
        head[0] = u // P
        k = u % P
        n0[0] = n_first + k
        n1[0] = n_first + NC - 1 - k if NC - 1 - k != k else -1
    elif spt:
        # upstream FA3's shortest-processing-time-first launch order: short (high n) columns first
        n0[0] = n_first + NC - 1 - u // num_heads
        head[0] = u % num_heads
        n1[0] = -1
    else:
        head[0] = u // NC
        n0[0] = n_first + u % NC
        n1[0] = -1
