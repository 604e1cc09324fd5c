# cython: boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Schedule tables for the deterministic dQ reduction: build, validate, simulate (the DAG model).

A table is three arrays:
  visits    int32 (V, 4)  rows (cta, head, n_block, m_block), grouped by cta, each cta's rows in execution order
  rank      int32 (V,)    position of the visit in the reduction order of its dQ tile (head, m_block)
  cta_start int64 (C+1,)  visits of cta c are rows [cta_start[c], cta_start[c+1])
"head" is a (batch, query head) pair. With grouped-query attention (GQA, MQA) g = group_size consecutive heads
share the KV head head // g, and a KV column is (head // g, n_block): its visits cover the g query heads of the
group, back to back on one CTA, so that dK and dV stay in registers for the whole group.

NOTES: every policy is (1) an ordered list of work units (one KV column, or a pair of columns for the symmetric
shift) dispatched greedily to the CTA that frees up first, (2) a Q-tile order inside each column, (3) a tie-break
between columns.  Ranks are then *derived*: visits are ordered by (step, tie-break), where step is the visit's
position in its CTA's list, and each dQ tile receives ranks in that order.  Every wait then points from a later
(step, tie-break) key to an earlier one, so no table built here can deadlock, whatever the number of CTAs.

NOTES: grouped columns (g > 1) are Q-tile-major: the table is the g = 1 table of the KV heads with every visit
repeated for the g query heads of its group, in ascending order, and its rank repeated with it. Dispatch, Q-tile
orders and ties are those of the KV heads' table, every CTA is at query head j = step mod g at every step and
time runs g times slower; so dQ tile (head, m) ranks its visits in the order the g = 1 table ranks tile
(head // g, m), deadlock freedom carries over, the start-up waits are paid once rather than once per query head,
and the paper's closed forms hold with m = query heads. Head-major columns (all Q tiles of one query head, then
the next) would start head j's pass of column n at step j * (M - lo[n]): with a causal mask that differs between
columns and breaks the phase relations the policies are built on (descending's common start at the last Q tile,
the shift rotations). On the paper's shapes (132 SMs, H = 32, Hkv = 8 or 1) head-major was never faster in
either model and up to 1.45x the lower bound where Q-tile-major stays at 1.17x (shift, d64 causal, S = 4096,
engine model).
"""
import numpy as np
from libc.stdlib cimport malloc, free
from libc.string cimport memset

cdef enum:
    POLICY_FA3 = 0
    POLICY_DESCENDING = 1
    POLICY_SHIFT = 2
    POLICY_SYMMETRIC_SHIFT = 3

POLICY_CODES = {"fa3": POLICY_FA3, "descending": POLICY_DESCENDING, "shift": POLICY_SHIFT,
                "symmetric_shift": POLICY_SYMMETRIC_SHIFT}

cdef long long LLMAX = 0x7fffffffffffffff


def column_starts(long long seqlen_q, long long seqlen_k, long long block_m, long long block_n, bint causal):
    """First unmasked Q tile of every KV tile: int64 (N,), N = ceil(seqlen_k / block_n).

    Causal masks are bottom-right aligned: query i sees key j iff j <= i + seqlen_k - seqlen_q.  KV tile n is
    first seen by query row n*block_n - seqlen_k + seqlen_q, which is always < seqlen_q, so no column is empty.
    """
    cdef long long N = (seqlen_k + block_n - 1) // block_n
    out = np.zeros(N, dtype=np.int64)
    cdef long long[::1] lo = out
    cdef long long n, t
    if causal:
        for n in range(N):
            t = n * block_n - seqlen_k + seqlen_q
            lo[n] = (t if t > 0 else 0) // block_m
    return out


cdef inline void unit_columns(int policy, bint causal, bint paired, long long u, long long num_heads,
                              long long N, long long P, long long* head, long long* n0, long long* n1) noexcept:
    """Work unit u (in dispatch order) -> head and one or two KV columns (n1 = -1 when single)."""
    cdef long long k
    if paired:
        head[0] = u // P
        k = u % P
        n0[0] = k
        n1[0] = N - 1 - k if N - 1 - k != k else -1
    elif policy == POLICY_FA3 and causal:
        # upstream FA3's shortest-processing-time-first launch order: short (high n) columns first
        n0[0] = N - 1 - u // num_heads
        head[0] = u % num_heads
        n1[0] = -1
    else:
        head[0] = u // N
        n0[0] = u % N
        n1[0] = -1


cdef inline void heap_push(double* ht, long long* hc, long long* size, double t, long long c) noexcept:
    cdef long long i = size[0], p
    size[0] += 1
    while i > 0:
        p = (i - 1) >> 1
        if ht[p] < t or (ht[p] == t and hc[p] < c):
            break
        ht[i] = ht[p]
        hc[i] = hc[p]
        i = p
    ht[i] = t
    hc[i] = c


cdef inline void heap_pop(double* ht, long long* hc, long long* size, double* t, long long* c) noexcept:
    cdef long long n, i = 0, ch
    cdef double lt
    cdef long long lc
    t[0] = ht[0]
    c[0] = hc[0]
    size[0] -= 1
    n = size[0]
    lt = ht[n]
    lc = hc[n]
    while True:
        ch = 2 * i + 1
        if ch >= n:
            break
        if ch + 1 < n and (ht[ch + 1] < ht[ch] or (ht[ch + 1] == ht[ch] and hc[ch + 1] < hc[ch])):
            ch += 1
        if lt < ht[ch] or (lt == ht[ch] and lc < hc[ch]):
            break
        ht[i] = ht[ch]
        hc[i] = hc[ch]
        i = ch
    ht[i] = lt
    hc[i] = lc


def build_table(int policy, long long seqlen_q, long long seqlen_k, long long block_m, long long block_n,
                long long num_heads, bint causal, long long num_sms, long long group_size=1):
    """Build (visits, rank, cta_start) for one policy; see the module docstring for the layout. num_heads counts
    (batch, query head) pairs, group_size the query heads per KV head (it must divide num_heads)."""
    if group_size < 1 or num_heads % group_size:
        raise ValueError(f"group_size must be >= 1 and divide num_heads={num_heads}, got {group_size}")
    visits, rank, cta_start = _build_kv_table(policy, seqlen_q, seqlen_k, block_m, block_n,
                                              num_heads // group_size, causal, num_sms)
    if group_size == 1:
        return visits, rank, cta_start
    # every visit of KV head kh, once per query head kh * g + j, j = 0..g-1 (Q-tile-major, see NOTES above)
    grouped = np.repeat(visits, group_size, axis=0)
    grouped[:, 1] = grouped[:, 1] * group_size + np.tile(np.arange(group_size, dtype=np.int32), len(rank))
    return grouped, np.repeat(rank, group_size), cta_start * group_size


def _build_kv_table(int policy, long long seqlen_q, long long seqlen_k, long long block_m, long long block_n,
                    long long num_heads, bint causal, long long num_sms):
    """The g = 1 table of num_heads (batch, KV head) pairs."""
    cdef long long M = (seqlen_q + block_m - 1) // block_m
    cdef long long N = (seqlen_k + block_n - 1) // block_n
    lo_arr = column_starts(seqlen_q, seqlen_k, block_m, block_n, causal)
    cdef long long[::1] lo = lo_arr
    # NOTES: pairing only pays when there are at least as many pairs as CTAs; with spare SMs every column runs
    # alone (the longest column bounds the makespan anyway).
    cdef bint paired = policy == POLICY_SYMMETRIC_SHIFT and causal and num_heads * ((N + 1) // 2) >= num_sms
    cdef long long P = (N + 1) // 2 if paired else N
    cdef long long U = num_heads * P
    cdef long long G = num_sms if num_sms < U else U
    cdef long long u, c, h, n0, n1, n, L, s, m, v, w, k, k0, k1, rs, off, i, j, key
    cdef int tb_sign = -1 if (policy == POLICY_SYMMETRIC_SHIFT or (policy == POLICY_FA3 and causal)) else 1

    # (1) greedy dispatch of units to the CTA that frees up first (ties: lowest CTA index)
    unit_cta_arr = np.empty(U, dtype=np.int32)
    cdef int[::1] unit_cta = unit_cta_arr
    count_arr = np.zeros(G, dtype=np.int64)
    cdef long long[::1] count = count_arr
    cdef double* ht = <double*>malloc(G * sizeof(double))
    cdef long long* hc = <long long*>malloc(G * sizeof(long long))
    cdef long long hsize = 0
    cdef double t
    for c in range(G):
        heap_push(ht, hc, &hsize, 0.0, c)
    for u in range(U):
        unit_columns(policy, causal, paired, u, num_heads, N, P, &h, &n0, &n1)
        L = M - lo[n0]
        if n1 >= 0:
            L += M - lo[n1]
        heap_pop(ht, hc, &hsize, &t, &c)
        unit_cta[u] = <int>c
        count[c] += L
        heap_push(ht, hc, &hsize, t + L, c)
    free(ht)
    free(hc)

    cta_start_arr = np.zeros(G + 1, dtype=np.int64)
    cdef long long[::1] cta_start = cta_start_arr
    for c in range(G):
        cta_start[c + 1] = cta_start[c] + count[c]
    cdef long long V = cta_start[G]
    visits_arr = np.empty((V, 4), dtype=np.int32)
    rank_arr = np.empty(V, dtype=np.int32)
    cdef int[:, ::1] visits = visits_arr
    cdef int[::1] rank = rank_arr
    wp_arr = cta_start_arr[:G].copy()
    cdef long long[::1] wp = wp_arr

    # (2) each CTA's visit list, Q-tile order per column
    cdef long long col, ncols
    cdef long long cols[2]
    for u in range(U):
        unit_columns(policy, causal, paired, u, num_heads, N, P, &h, &n0, &n1)
        c = unit_cta[u]
        cols[0] = n0
        cols[1] = n1
        ncols = 2 if n1 >= 0 else 1
        for col in range(ncols):
            n = cols[col]
            L = M - lo[n]
            v = wp[c]
            wp[c] += L
            for s in range(L):
                if policy == POLICY_FA3:
                    m = lo[n] + s
                elif policy == POLICY_DESCENDING:
                    m = M - 1 - s
                elif paired and col == 1:
                    m = M - 1 - s                       # short column of a pair: descending
                elif paired:
                    # long column: cyclic shift over the rectangle of Q tiles that every long column of this
                    # head in the same dispatch wave covers, then its own triangle in ascending order
                    w = u // G
                    k = u % P
                    k0 = (w * G if w * G > h * P else h * P) - h * P
                    k1 = ((w + 1) * G if (w + 1) * G < (h + 1) * P else (h + 1) * P) - 1 - h * P
                    rs = lo[k1]
                    if s < M - rs:
                        m = rs + (k - k0 + s) % (M - rs)
                    else:
                        m = lo[n] + (s - (M - rs))
                else:
                    m = lo[n] + (n + s) % L           # shift: rotate the column's range by n
                visits[v + s, 0] = <int>c
                visits[v + s, 1] = <int>h
                visits[v + s, 2] = <int>n
                visits[v + s, 3] = <int>m

    # (3) derived ranks: walk the wait-free timeline step by step; within a step, CTAs in (tie-break, cta) order
    cdef long long maxlen = 0
    for c in range(G):
        if count[c] > maxlen:
            maxlen = count[c]
    counter_arr = np.zeros(num_heads * M, dtype=np.int32)
    cdef int[::1] counter = counter_arr
    order_arr = np.arange(G, dtype=np.int64)
    keys_arr = np.zeros(G, dtype=np.int64)
    cdef long long[::1] order = order_arr
    cdef long long[::1] keys = keys_arr
    cdef long long nact = G
    cdef bint changed
    for s in range(maxlen):
        changed = False
        for i in range(nact):
            c = order[i]
            if s >= count[c]:
                keys[c] = LLMAX
                changed = True
            else:
                v = cta_start[c] + s
                if s == 0 or visits[v, 1] != visits[v - 1, 1] or visits[v, 2] != visits[v - 1, 2]:
                    keys[c] = (tb_sign * <long long>visits[v, 2] + N) * G + c
                    changed = True
        if changed:
            for i in range(1, nact):
                c = order[i]
                key = keys[c]
                j = i - 1
                while j >= 0 and keys[order[j]] > key:
                    order[j + 1] = order[j]
                    j -= 1
                order[j + 1] = c
            while nact > 0 and keys[order[nact - 1]] == LLMAX:
                nact -= 1
        for i in range(nact):
            c = order[i]
            v = cta_start[c] + s
            off = <long long>visits[v, 1] * M + visits[v, 3]
            rank[v] = counter[off]
            counter[off] += 1
    return visits_arr, rank_arr, cta_start_arr


def analyze_table(visits_arr, rank_arr, cta_start_arr, long long num_heads, long long num_m_blocks, lo_arr,
                  bint timed=False, double c_cost=1.0, double r_cost=0.25, bint timeline=False, bint engine=False,
                  long long group_size=1):
    """Validate a table and, if ``timed``, simulate it in the DAG model (``engine``: in the engine model).

    Raises ValueError naming the first offending tile unless: the layout is consistent; every visited tile is
    unmasked and in range; the visits of each KV column (head // group_size, n_block) form one contiguous chain
    on one CTA that covers every unmasked Q tile of each query head of its group once, in any order (so its dK,
    dV are written once); every dQ tile's ranks are 0..k-1 exactly once; execution cannot deadlock.
    Returns None, or with ``timed`` (makespan, per-CTA finish times, compute-start and reduce-start per visit
    when ``timeline``). DAG model (the paper's): each visit computes for c_cost, then waits for its rank, then
    reduces for r_cost, and the CTA's next visit starts after that. Engine model (the Hopper kernel): a CTA's
    compute and its reductions are two serial resources with one dQ buffer between them: a visit's compute
    ends with the hand-off of its dQ, which waits until the previous reduction has taken the buffer; a
    reduction starts once its visit is handed off, its rank is reached and the CTA's previous reduction has
    completed, and takes r_cost.
    """
    cdef const int[:, ::1] visits = np.ascontiguousarray(visits_arr, dtype=np.int32)
    cdef const int[::1] rank = np.ascontiguousarray(rank_arr, dtype=np.int32)
    cdef const long long[::1] cta_start = np.ascontiguousarray(cta_start_arr, dtype=np.int64)
    cdef const long long[::1] lo = np.ascontiguousarray(lo_arr, dtype=np.int64)
    cdef long long M = num_m_blocks, N = lo.shape[0], NH = num_heads, g = group_size
    cdef long long V = visits.shape[0], C = cta_start.shape[0] - 1
    cdef long long c, v, h = 0, n = 0, m = 0, r, i, idx, prev_h, prev_n, chain_len, chain_id = 0, k = 0, vend
    if g < 1 or NH % g:
        raise ValueError(f"group_size must be >= 1 and divide num_heads={NH}, got {g}")
    if visits.shape[1] != 4 or rank.shape[0] != V:
        raise ValueError(f"visits must be (V, 4) and rank (V,), got {visits_arr.shape} and {rank_arr.shape}")
    if C < 1 or cta_start[0] != 0 or cta_start[C] != V:
        raise ValueError("cta_start must start at 0 and end at the number of visits")
    # expected number of contributions per dQ tile and the offset of each tile's rank slots
    cnt_arr = np.zeros(M, dtype=np.int64)
    cdef long long[::1] cnt = cnt_arr
    for n in range(N):
        for m in range(lo[n], M):
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
                if prev_h >= 0 and chain_len != g * (M - lo[prev_n]):
                    for k in range(g * M):
                        if k % M >= lo[prev_n] and mstamp[k] != chain_id:
                            break
                    raise ValueError(f"tile (head {prev_h // g * g + k // M}, n_block {prev_n}, m_block {k % M}) is "
                                     f"unmasked but not in its KV tile's chain on cta {c} ({chain_len} of "
                                     f"{g * (M - lo[prev_n])} visits): a KV tile's visits must be one contiguous "
                                     f"chain covering each unmasked tile of each query head of its group")
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
            if m < lo[n]:
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
        if not colseen[i]:
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
                m = visits[v, 3]
                if sem[t_off] < cnt[m]:
                    nxt = pos[<long long>visits[v, 1] * per_head + pre[m] + sem[t_off]]
                    c2 = visits[nxt, 0]
                    if blocked[c2] and ptr[c2] == nxt:
                        blocked[c2] = 0
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
                       tfree_arr, finish, c_cost, r_cost, engine, np.full(C, c_cost), np.zeros(C), timeline,
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


cdef void _simulate_loop(const int[:, ::1] visits, const int[::1] rank, const long long[::1] cta_start, long long[::1] ptr,
                         long long[::1] sem, unsigned char[::1] blocked, long long[::1] pos, long long[::1] cnt,
                         long long[::1] pre, long long per_head, long long M, double* ht, long long* hc,
                         long long hsize, double[::1] tfree, double[::1] finish, double c_cost, double r_cost,
                         bint engine, double[::1] dq_ready, double[::1] prev_take, bint timeline,
                         double[::1] comp_start, double[::1] red_start) noexcept:
    # Heap events: a CTA is ready to reduce its visit ptr[c] (DAG model: its compute ended; engine model: its dQ
    # is ready and its previous reduction is done). Engine model: dq_ready[c] is when the compute of visit ptr[c]
    # ends, prev_take[c] when the CTA's previous reduction started (took the dQ buffer); the next visit's compute
    # starts at the hand-off max(dq_ready, prev_take) instead of after the reduction.
    cdef double now, start, end, next_start
    cdef long long c, v, t_off, m, nxt, c2
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
        if engine:
            next_start = dq_ready[c] if dq_ready[c] > prev_take[c] else prev_take[c]
            prev_take[c] = start
            dq_ready[c] = next_start + c_cost
        ptr[c] += 1
        if ptr[c] < cta_start[c + 1]:
            if timeline:
                comp_start[ptr[c]] = next_start
            if engine:
                heap_push(ht, hc, &hsize, dq_ready[c] if dq_ready[c] > end else end, c)
            else:
                heap_push(ht, hc, &hsize, end + c_cost, c)
        else:
            finish[c] = end
        m = visits[v, 3]
        if sem[t_off] < cnt[m]:
            nxt = pos[<long long>visits[v, 1] * per_head + pre[m] + sem[t_off]]
            c2 = visits[nxt, 0]
            if blocked[c2] and ptr[c2] == nxt:
                blocked[c2] = 0
                heap_push(ht, hc, &hsize, end, c2)
