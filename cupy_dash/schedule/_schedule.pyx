# cython: boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Schedule tables for the deterministic dQ reduction: the Q tiles every KV tile sees (``column_ranges``), the
policy codes of the builders, and ``analyze_table`` (validation and the two models, from _schedule_check.pyx,
re-exported here). A per-visit table is three arrays, visits int32 (V, 4) rows (cta, head, n_block, m_block),
rank int32 (V,) and cta_start int64 (C+1,): docs/architecture.md, "Byte layouts"; "head" is a (batch, query head)
pair, and with GQA a KV column is (head // group_size, n_block).
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

    Masks are bottom-right aligned, as FlashAttention's (docs/schedules.md, "Sliding windows"); a window side of -1
    is unbounded, and causal means right = 0. The keys [k0, k1) of KV tile n are seen by the queries
    [k0 - (Sk - Sq) - right, k1 - 1 - (Sk - Sq) + left] clipped to [0, Sq), one interval, and every Q tile that
    meets it has a visible element. Both ends rise with n; an empty range is [0, 0) before the visible tiles and
    [M, M) after them (M = ceil(seqlen_q / block_m)). Causal, no window: lo[n] = max(0, n block_n - Sk + Sq) //
    block_m, hi[n] = M, never empty; full mask: [0, M).
    """
    cdef long long N = (seqlen_k + block_n - 1) // block_n
    lo_arr, hi_arr = np.empty(N, dtype=np.int64), np.empty(N, dtype=np.int64)
    cdef long long[::1] lo = lo_arr, hi = hi_arr
    cdef long long n
    for n in range(N):
        tile_range(n, seqlen_q, seqlen_k, block_m, block_n, causal, window_left, window_right, &lo[n], &hi[n])
    return lo_arr, hi_arr

