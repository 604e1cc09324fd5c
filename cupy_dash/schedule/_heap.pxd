# cython: boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# Binary min-heap of (time, cta) pairs, ties broken by the lower cta: the "CTA that frees up first" of the
# oracle builders' dispatch (testing.pyx; the bucket queue of _varlen_sched.pyx pops in the same order) and the
# event queue of the simulation (_schedule.pyx), which cimport it; ht / hc are caller-owned arrays with room
# for every CTA. Inline (their hot loops), so no module.

cdef inline bint earlier(double ta, long long ca, double tb, long long cb) noexcept:
    """(ta, ca) pops before (tb, cb): the earlier time, ties to the lower cta."""
    return ta < tb or (ta == tb and ca < cb)


cdef inline void heap_push(double* ht, long long* hc, long long* size, double t, long long c) noexcept:
    cdef long long i = size[0], p
    size[0] += 1
    while i > 0:
        p = (i - 1) >> 1
        if earlier(ht[p], hc[p], t, c):
            break
        ht[i], hc[i] = ht[p], hc[p]
        i = p
    ht[i], hc[i] = t, c


cdef inline void heap_pop(double* ht, long long* hc, long long* size, double* t, long long* c) noexcept:
    cdef long long n, i = 0, ch
    cdef double lt
    cdef long long lc
    t[0], c[0] = ht[0], hc[0]
    size[0] -= 1
    n = size[0]
    lt, lc = ht[n], hc[n]
    while True:
        ch = 2 * i + 1
        if ch >= n:
            break
        if ch + 1 < n and earlier(ht[ch + 1], hc[ch + 1], ht[ch], hc[ch]):
            ch += 1
        if earlier(lt, lc, ht[ch], hc[ch]):
            break
        ht[i], hc[i] = ht[ch], hc[ch]
        i = ch
    ht[i], hc[i] = lt, lc
