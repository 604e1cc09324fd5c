# cython: boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# What the schedule builders share: the policy codes, the Q-tile range of a KV tile and the rectangle of a
# symmetric_shift pair, for the one builder (_varlen_sched.pyx, which varlen_pack.pyx runs) and the tests' oracles
# (testing.pyx). Inline: the builders call them per unit or column.
#
# NOTES: every policy is (1) an ordered list of work units (one KV column, or a pair of columns for the symmetric
# shift) dispatched greedily to the CTA that frees up first, (2) a Q-tile order inside each column, (3) a tie-break
# between columns. Ranks are then *derived*: visits are ordered by (step, tie-break), where step is the visit's
# position in its CTA's list, and each dQ tile receives ranks in that order. Every wait then points from a later
# (step, tie-break) key to an earlier one, so no table built this way can deadlock, whatever the number of CTAs.
#
# NOTES: grouped columns (g > 1) are Q-tile-major: the table is the g = 1 table of the KV heads with every visit
# repeated for the g query heads of its group, in ascending order, and its rank repeated with it. Dispatch, Q-tile
# orders and ties are those of the KV heads' table, every CTA is at query head j = step mod g at every step and time
# runs g times slower; so dQ tile (head, m) ranks its visits in the order the g = 1 table ranks tile (head // g, m),
# deadlock freedom carries over, the start-up waits are paid once rather than once per query head, and the paper's
# closed forms hold with m = query heads. Head-major columns (all Q tiles of one query head, then the next) would
# start head j's pass of column n at step j * (M - lo[n]): with a causal mask that differs between columns and
# breaks the phase relations the policies are built on (descending's common start at the last Q tile, the shift
# rotations). On the paper's shapes (132 SMs, H = 32, Hkv = 8 or 1) head-major was never faster in either model and
# up to 1.45x the lower bound where Q-tile-major stays at 1.17x (shift, d64 causal, S = 4096, engine model).
#
# NOTES: masks are band-shaped (causal, full and sliding windows alike): KV tile n sees the contiguous range of Q
# tiles [lo[n], hi[n]) of ``column_ranges``, and both ends rise with n. A KV tile that no query sees has an empty
# range and no visits (the backward zeroes its dK, dV rows on the host side); the others form one run of columns,
# which are the work units. Every policy keeps its meaning on causal and full masks (their tables are those of a
# build without windows). With a left window bound ("band": hi[n] < M for some n) the interior columns all have the
# same length, as in a full mask restricted to a diagonal band, and its two ends are clipped triangles: ``fa3`` and
# ``descending`` walk each column's range up or down as before (fa3 with upstream's shortest-first order whenever
# the window bounds keys on the right: the NOTES at ``spt`` in testing.pyx); ``shift`` rotates each column along the
# band, on the clock of its CTA (the NOTES at step (2) in testing.pyx), so that equally long columns never meet
# however the dispatch staggers them; ``symmetric_shift`` needs no pairing (a band's columns are equally long) and
# handles the two triangles mirror-wise, which arrives at every dQ tile in a strict order (the NOTES at ``mirrored``
# in testing.pyx). With a right bound alone the shape is triangular like a causal mask, and it is paired as one.

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
