# cython: boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Schedule tables for the deterministic dQ reduction: the Q tiles every KV tile sees (``column_ranges``), the
policy codes of the builders, and ``analyze_table`` (validation and simulation of per-visit tables in the two
models). A per-visit table is three arrays, visits int32 (V, 4) rows (cta, head, n_block, m_block),
rank int32 (V,) and cta_start int64 (C+1,): docs/architecture.md, "Byte layouts"; "head" is a (batch, query head)
pair, and with GQA a KV column is (head // group_size, n_block).
"""
import numpy as np
from libc.stdlib cimport free, malloc

from cupy_dash.schedule._heap cimport heap_pop, heap_push
from cupy_dash.schedule._units cimport (POLICY_DESCENDING, POLICY_FA3, POLICY_SHIFT, POLICY_SYMMETRIC_SHIFT,
                                        tile_range)

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


def analyze_table(visits_arr, rank_arr, cta_start_arr, long long num_heads, long long num_m_blocks, lo_arr,
                  bint timed=False, double c_cost=1.0, double r_cost=0.25, bint timeline=False, bint engine=False,
                  long long group_size=1, hi_arr=None, long long writers=1):
    """Validate a table and, if ``timed``, simulate it in the DAG model (``engine``: in the engine model).

    The mask is given per KV tile n as the range of Q tiles it sees, [lo_arr[n], hi_arr[n]) (int64 (N,) each;
    hi_arr None: every range ends at the last Q tile, num_m_blocks, as with causal and full masks); an empty
    range (lo == hi) is a KV tile that no query sees, which must have no visits.
    Raises ValueError naming the first offending tile unless: the layout is consistent; every visited tile is
    unmasked and in range; the visits of each non-empty KV column (head // group_size, n_block) form one
    contiguous chain on one CTA that covers every unmasked Q tile of each query head of its group once, in any
    order (so its dK, dV are written once); every dQ tile's ranks are 0..k-1 exactly once; execution cannot
    deadlock.
    Returns None, or with ``timed`` (makespan, per-CTA finish times, compute-start and reduce-start per visit
    when ``timeline``). The two models, with compute c_cost and reduction r_cost per visit: docs/schedules.md,
    "The two models". ``writers`` = 2: the kernel's two dQ writer warps, visits alternating between them: a
    reduction waits for the one two visits back to complete and for the previous one to have started (the writers
    hand the dQ buffer over in visit order), not for the previous one to complete.
    """
    cdef const int[:, ::1] visits = np.ascontiguousarray(visits_arr, dtype=np.int32)
    cdef const int[::1] rank = np.ascontiguousarray(rank_arr, dtype=np.int32)
    cdef const long long[::1] cta_start = np.ascontiguousarray(cta_start_arr, dtype=np.int64)
    cdef const long long[::1] lo = np.ascontiguousarray(lo_arr, dtype=np.int64)
    cdef const long long[::1] hi = np.ascontiguousarray(np.full(lo.shape[0], num_m_blocks) if hi_arr is None
                                                        else hi_arr, dtype=np.int64)
    cdef long long M = num_m_blocks, N = lo.shape[0], NH = num_heads, g = group_size
    cdef long long V = visits.shape[0], C = cta_start.shape[0] - 1
    cdef long long c, v, h = 0, n = 0, m = 0, r, i, idx, prev_h, prev_n, chain_len, chain_id = 0, k = 0, vend
    if g < 1 or NH % g:
        raise ValueError(f"group_size must be >= 1 and divide num_heads={NH}, got {g}")
    if visits.shape[1] != 4 or rank.shape[0] != V:
        raise ValueError(f"visits must be (V, 4) and rank (V,), got {visits_arr.shape} and {rank_arr.shape}")
    if C < 1 or cta_start[0] != 0 or cta_start[C] != V:
        raise ValueError("cta_start must start at 0 and end at the number of visits")
    if hi.shape[0] != N:
        raise ValueError(f"lo_arr and hi_arr must have one entry per KV tile, got {N} and {hi.shape[0]}")
    for n in range(N):
        if not 0 <= lo[n] <= hi[n] <= M:
            raise ValueError(f"KV tile {n}: its Q-tile range [{lo[n]}, {hi[n]}) is not inside [0, {M}]")
    # expected number of contributions per dQ tile and the offset of each tile's rank slots
    cnt_arr = np.zeros(M, dtype=np.int64)
    cdef long long[::1] cnt = cnt_arr
    for n in range(N):
        for m in range(lo[n], hi[n]):
            cnt[m] += 1
    pre_arr = np.zeros(M + 1, dtype=np.int64)
    cdef long long[::1] pre = pre_arr
    for m in range(M):
        pre[m + 1] = pre[m] + cnt[m]
    cdef long long per_head = pre[M]
    pos_arr = np.full(NH * per_head, -1, dtype=np.int64)
    cdef long long[::1] pos = pos_arr
    colseen_arr = np.zeros(NH // g * N, dtype=np.uint8)
    cdef unsigned char[::1] colseen = colseen_arr
    mstamp_arr = np.full(g * M, -1, dtype=np.int64)      # last chain to visit (query head of the group, m)
    cdef long long[::1] mstamp = mstamp_arr

    for c in range(C):
        if cta_start[c + 1] < cta_start[c]:
            raise ValueError(f"cta_start is not non-decreasing at cta {c}")
        prev_h = -1
        prev_n = -1
        chain_len = 0
        for v in range(cta_start[c], cta_start[c + 1] + 1):
            if v < cta_start[c + 1]:
                h = visits[v, 1]
                n = visits[v, 2]
                m = visits[v, 3]
                if visits[v, 0] != c:
                    raise ValueError(f"visit {v}: cta column is {visits[v, 0]} but the row lies in cta {c}'s range")
                if h < 0 or h >= NH or n < 0 or n >= N or m < 0 or m >= M:
                    raise ValueError(f"visit {v}: (head {h}, n_block {n}, m_block {m}) is out of range "
                                     f"(heads {NH}, n_blocks {N}, m_blocks {M})")
            if v == cta_start[c + 1] or h // g != prev_h // g or n != prev_n:
                if prev_h >= 0 and chain_len != g * (hi[prev_n] - lo[prev_n]):
                    for k in range(g * M):
                        if lo[prev_n] <= k % M < hi[prev_n] and mstamp[k] != chain_id:
                            break
                    raise ValueError(f"tile (head {prev_h // g * g + k // M}, n_block {prev_n}, m_block {k % M}) is "
                                     f"unmasked but not in its KV tile's chain on cta {c} ({chain_len} of "
                                     f"{g * (hi[prev_n] - lo[prev_n])} visits): a KV tile's visits must be one "
                                     f"contiguous chain covering each unmasked tile of each query head of its group")
                if v == cta_start[c + 1]:
                    break
                if colseen[h // g * N + n]:
                    raise ValueError(f"KV tile (kv head {h // g}, n_block {n}): its visits are not one contiguous "
                                     f"chain on one CTA (again at visit {v}, cta {c})")
                colseen[h // g * N + n] = 1
                chain_id += 1
                chain_len = 0
                prev_h = h
                prev_n = n
            if m < lo[n] or m >= hi[n]:
                raise ValueError(f"tile (head {h}, n_block {n}, m_block {m}) is fully masked but visited (visit {v})")
            if mstamp[h % g * M + m] == chain_id:
                raise ValueError(f"tile (head {h}, n_block {n}, m_block {m}) is visited twice")
            mstamp[h % g * M + m] = chain_id
            chain_len += 1
            r = rank[v]
            if r < 0 or r >= cnt[m]:
                raise ValueError(f"dQ tile (head {h}, m_block {m}): rank {r} of visit {v} is outside 0..{cnt[m] - 1}")
            idx = h * per_head + pre[m] + r
            if pos[idx] >= 0:
                raise ValueError(f"dQ tile (head {h}, m_block {m}): rank {r} is given to visits {pos[idx]} and {v}")
            pos[idx] = v
    for i in range(NH // g * N):
        if not colseen[i] and lo[i % N] < hi[i % N]:
            raise ValueError(f"tile (head {i // N * g}, n_block {i % N}, m_block {lo[i % N]}) is unmasked but never "
                             f"visited (its KV tile has no chain)")

    # execution: each CTA runs its visits in order; a visit's reduction waits until its rank is reached
    ptr_arr = np.array(cta_start[:C], dtype=np.int64)
    cdef long long[::1] ptr = ptr_arr
    sem_arr = np.zeros(NH * M, dtype=np.int64)
    cdef long long[::1] sem = sem_arr
    blocked_arr = np.zeros(C, dtype=np.uint8)
    cdef unsigned char[::1] blocked = blocked_arr
    cdef long long* stack = <long long*>malloc((C + 1) * sizeof(long long))
    cdef long long sp = 0, t_off, nxt, c2
    cdef double* ht
    cdef long long* hc
    cdef long long hsize = 0
    cdef double makespan = 0.0
    finish_arr = np.zeros(C, dtype=np.float64)
    cdef double[::1] finish = finish_arr
    cdef double[::1] comp_start
    cdef double[::1] red_start
    if timeline:
        comp_start_arr = np.zeros(V, dtype=np.float64)
        red_start_arr = np.zeros(V, dtype=np.float64)
        comp_start = comp_start_arr
        red_start = red_start_arr
    if not timed:
        for c in range(C):
            stack[sp] = c
            sp += 1
        while sp > 0:
            sp -= 1
            c = stack[sp]
            vend = cta_start[c + 1]
            while ptr[c] < vend:
                v = ptr[c]
                t_off = <long long>visits[v, 1] * M + visits[v, 3]
                if rank[v] != sem[t_off]:
                    blocked[c] = 1
                    break
                sem[t_off] += 1
                ptr[c] += 1
                c2 = unblocked(visits, ptr, blocked, pos, cnt, pre, per_head, v, sem[t_off])
                if c2 >= 0:
                    stack[sp] = c2
                    sp += 1
        free(stack)
    else:
        free(stack)
        ht = <double*>malloc((C + 1) * sizeof(double))
        hc = <long long*>malloc((C + 1) * sizeof(long long))
        tfree_arr = np.zeros(NH * M, dtype=np.float64)
        for c in range(C):
            if cta_start[c + 1] > cta_start[c]:
                heap_push(ht, hc, &hsize, c_cost, c)
        _simulate_loop(visits, rank, cta_start, ptr, sem, blocked, pos, cnt, pre, per_head, M, ht, hc, hsize,
                       tfree_arr, finish, c_cost, r_cost, engine, writers, np.zeros(C), np.full(C, c_cost),
                       np.zeros(C), timeline,
                       comp_start if timeline else None, red_start if timeline else None)
        free(ht)
        free(hc)
    for c in range(C):
        if ptr[c] < cta_start[c + 1]:
            v = ptr[c]
            h = visits[v, 1]
            m = visits[v, 3]
            t_off = h * M + m
            nxt = pos[h * per_head + pre[m] + sem[t_off]]
            raise ValueError(f"deadlock: cta {c} waits at visit {v} (head {h}, n_block {visits[v, 2]}, m_block {m}) "
                             f"for rank {rank[v]}, but dQ tile (head {h}, m_block {m}) is at {sem[t_off]}, whose "
                             f"visit {nxt} lies on cta {visits[nxt, 0]} behind visit {ptr[visits[nxt, 0]]}")
    if not timed:
        return None
    for c in range(C):
        if finish[c] > makespan:
            makespan = finish[c]
    if timeline:
        return makespan, finish_arr, comp_start_arr, red_start_arr
    return makespan, finish_arr, None, None


cdef void _simulate_loop(const int[:, ::1] visits, const int[::1] rank, const long long[::1] cta_start,
                         long long[::1] ptr,
                         long long[::1] sem, unsigned char[::1] blocked, long long[::1] pos, long long[::1] cnt,
                         long long[::1] pre, long long per_head, long long M, double* ht, long long* hc,
                         long long hsize, double[::1] tfree, double[::1] finish, double c_cost, double r_cost,
                         bint engine, long long writers, double[::1] prev_end, double[::1] dq_ready,
                         double[::1] prev_take, bint timeline,
                         double[::1] comp_start, double[::1] red_start) noexcept:
    # Heap events: a CTA is ready to reduce its visit ptr[c] (DAG model: its compute ended; engine model: its dQ
    # is ready and its previous reduction is done). Engine model: dq_ready[c] is when the compute of visit ptr[c]
    # ends, prev_take[c] when the CTA's previous reduction started (took the dQ buffer); the next visit's compute
    # starts at the hand-off max(dq_ready, prev_take) instead of after the reduction. Two writers: prev_end[c] is
    # when the CTA's previous reduction ends; the next one's writer is free then, and may start after this one's
    # start (wfree), not after its end.
    cdef double now, start, end, next_start, wfree
    cdef long long c, v, t_off, c2
    while hsize > 0:
        heap_pop(ht, hc, &hsize, &now, &c)
        v = ptr[c]
        t_off = <long long>visits[v, 1] * M + visits[v, 3]
        if rank[v] != sem[t_off]:
            blocked[c] = 1
            continue
        start = now if now > tfree[t_off] else tfree[t_off]
        end = start + r_cost
        tfree[t_off] = end
        sem[t_off] += 1
        if timeline:
            red_start[v] = start
        next_start = end
        wfree = end
        if engine:
            next_start = dq_ready[c] if dq_ready[c] > prev_take[c] else prev_take[c]
            prev_take[c] = start
            dq_ready[c] = next_start + c_cost
            if writers > 1:
                wfree = prev_end[c] if prev_end[c] > start else start
                prev_end[c] = end
        ptr[c] += 1
        if ptr[c] < cta_start[c + 1]:
            if timeline:
                comp_start[ptr[c]] = next_start
            if engine:
                heap_push(ht, hc, &hsize, dq_ready[c] if dq_ready[c] > wfree else wfree, c)
            else:
                heap_push(ht, hc, &hsize, end + c_cost, c)
        else:
            finish[c] = end
        c2 = unblocked(visits, ptr, blocked, pos, cnt, pre, per_head, v, sem[t_off])
        if c2 >= 0:
            heap_push(ht, hc, &hsize, end, c2)


cdef inline long long unblocked(const int[:, ::1] visits, const long long[::1] ptr, unsigned char[::1] blocked,
                                const long long[::1] pos, const long long[::1] cnt, const long long[::1] pre,
                                long long per_head, long long v, long long reached) noexcept:
    """The CTA (else -1) that waits for rank ``reached`` of visit v's dQ tile, now its turn: marked unblocked."""
    cdef long long m = visits[v, 3], nxt, c
    if reached >= cnt[m]:
        return -1
    nxt = pos[<long long>visits[v, 1] * per_head + pre[m] + reached]
    c = visits[nxt, 0]
    if blocked[c] and ptr[c] == nxt:
        blocked[c] = 0
        return c
    return -1
