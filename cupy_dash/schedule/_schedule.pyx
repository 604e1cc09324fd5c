# cython: boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Schedule tables for the deterministic dQ reduction: the Q tiles every KV tile sees (``column_ranges``), the
policy codes of the builders, and ``analyze_table`` (validation and the two simulation models, from
_schedule_check.pyx, re-exported here).

A per-visit table is three arrays:
  visits    int32 (V, 4)  rows (cta, head, n_block, m_block), grouped by cta, each cta's rows in execution order
  rank      int32 (V,)    position of the visit in the reduction order of its dQ tile (head, m_block)
  cta_start int64 (C+1,)  visits of cta c are rows [cta_start[c], cta_start[c+1])
"head" is a (batch, query head) pair. With grouped-query attention (GQA, MQA) g = group_size consecutive heads
share the KV head head // g, and a KV column is (head // g, n_block): its visits cover the g query heads of the
group, back to back on one CTA, so that dK and dV stay in registers for the whole group.

Tables are built as column records by the one builder (_varlen_sched.pyx; the NOTES of _units.pxd say how the
policies are built and why their tables cannot deadlock) and expanded (_varlen_view.pyx); the direct per-visit
builder of earlier versions is the tests' oracle (testing.pyx).
"""
import numpy as np

from cupy_dash.schedule._units cimport (POLICY_DESCENDING, POLICY_FA3, POLICY_SHIFT, POLICY_SYMMETRIC_SHIFT,
                                        tile_range)
from cupy_dash.schedule._schedule_check import analyze_table  # noqa: F401  (re-exported)

POLICY_CODES = {"fa3": POLICY_FA3, "descending": POLICY_DESCENDING, "shift": POLICY_SHIFT,
                "symmetric_shift": POLICY_SYMMETRIC_SHIFT}


def column_ranges(long long seqlen_q, long long seqlen_k, long long block_m, long long block_n, bint causal,
                  long long window_left=-1, long long window_right=-1):
    """The Q tiles every KV tile sees: (lo, hi), int64 (N,) each, N = ceil(seqlen_k / block_n); KV tile n sees
    Q tiles [lo[n], hi[n]), an empty range when no query sees any of its keys.

    Masks are bottom-right aligned, as FlashAttention's: query i sees key j iff
    i + Sk - Sq - left <= j <= i + Sk - Sq + right, a side of -1 unbounded; causal means right = 0. Key j is
    seen by queries [j - (Sk - Sq) - right, j - (Sk - Sq) + left], at least one index wide and one further per
    key, so the keys [k0, k1) of KV tile n are seen by one interval of queries,
    [k0 - (Sk - Sq) - right, k1 - 1 - (Sk - Sq) + left] clipped to [0, Sq), and every Q tile that meets it has a
    visible element. Both ends rise with n; an empty range is [0, 0) before the visible tiles and [M, M) after
    them (M = ceil(seqlen_q / block_m)). Causal, no window: lo[n] = max(0, n block_n - Sk + Sq) // block_m,
    hi[n] = M, never empty; full mask: [0, M).
    """
    cdef long long N = (seqlen_k + block_n - 1) // block_n
    lo_arr, hi_arr = np.empty(N, dtype=np.int64), np.empty(N, dtype=np.int64)
    cdef long long[::1] lo = lo_arr, hi = hi_arr
    cdef long long n
    for n in range(N):
        tile_range(n, seqlen_q, seqlen_k, block_m, block_n, causal, window_left, window_right, &lo[n], &hi[n])
    return lo_arr, hi_arr

