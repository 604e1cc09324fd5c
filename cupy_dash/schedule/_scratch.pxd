# cython: boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# Scratch of varlen_pack.pyx's C pipeline, which cimports it: growable malloc'd arenas carved in 64-byte aligned
# pieces, and the stable sort of the sequences' dispatch order. Inline, so no module.
from libc.stdlib cimport realloc
from libc.string cimport memcpy


cdef struct Arena:
    char* buf
    size_t cap, used


cdef inline int arena_reserve(Arena* a, size_t nbytes) except -1:
    # room for nbytes (carvings included): grows the buffer, which moves it, so nothing may be carved yet
    cdef char* grown
    a.used = 0
    nbytes = nbytes if nbytes > 64 else 64
    if nbytes > a.cap:
        grown = <char*>realloc(a.buf, nbytes)
        if grown == NULL:
            raise MemoryError()
        a.buf, a.cap = grown, nbytes
    return 0


cdef inline void* arena_take(Arena* a, size_t nbytes) noexcept:
    # the next 64-byte aligned nbytes of a reserved arena
    cdef void* p = a.buf + a.used
    a.used += (nbytes + 63) // 64 * 64
    return p


cdef inline size_t room(size_t nbytes) noexcept:
    return (nbytes + 63) // 64 * 64


cdef inline void stable_argsort(const long long* key, long long n, long long* out, long long* tmp) noexcept:
    # out: 0 .. n - 1 ordered by key, ties in index order (numpy's stable argsort), by bottom-up merges
    cdef long long i, width, lo, mid, hi, a, b, k
    cdef long long* src = out
    cdef long long* dst = tmp
    for i in range(n):
        out[i] = i
    width = 1
    while width < n:
        lo = 0
        while lo < n:
            mid = lo + width if lo + width < n else n
            hi = lo + 2 * width if lo + 2 * width < n else n
            a, b, k = lo, mid, lo
            while a < mid and b < hi:
                if key[src[b]] < key[src[a]]:
                    dst[k] = src[b]
                    b += 1
                else:
                    dst[k] = src[a]
                    a += 1
                k += 1
            while a < mid:
                dst[k] = src[a]
                a += 1
                k += 1
            while b < hi:
                dst[k] = src[b]
                b += 1
                k += 1
            lo = hi
        src, dst = dst, src
        width *= 2
    if src != out:
        memcpy(out, src, n * sizeof(long long))
