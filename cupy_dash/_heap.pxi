# Binary min-heap of (time, cta) pairs, ties broken by the lower cta: the "CTA that frees up first" of the
# builder's dispatch (_schedule.pyx) and the event queue of the simulation (_schedule_check.pyx). Included by
# both; ht / hc are caller-owned arrays with room for every CTA.

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
