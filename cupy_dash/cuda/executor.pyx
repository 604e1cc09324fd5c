# cython: boundscheck=False, wraparound=False
"""Kernel launch with one driver call (CUDA Driver API ``cuLaunchKernel``), for the host fast path
(:mod:`cupy_dash.core.fastpath`): the kernels take one by-value parameter struct, so a launch is the function handle,
the grid, the block, the dynamic shared memory, the stream and the packed struct's bytes; ``patched_block``
writes a call's fields (addresses, TMA maps) into a copy of a plan's packed block.

libcuda is opened with ``dlopen`` on first use (CuPy has loaded it by then); building this module needs no CUDA
headers or toolkit, and importing it needs no GPU.
"""
from libc.stdint cimport uint64_t, uintptr_t
from libc.string cimport memcpy

cdef extern from "launch_plan.h" nogil:
    enum:
        DASH_PLAN_MAGIC
        DASH_PLAN_INSPECT
        DASH_PLAN_MAX_PARAMS
    ctypedef struct dash_plan_header:
        unsigned int params_size
    ctypedef struct dash_plan:
        dash_plan_header header
    int dash_plan_view(const void* blob, size_t size, dash_plan* plan, char* error, size_t error_size)
    int dash_plan_run(const dash_plan* plan, const uint64_t* buffers, size_t num_buffers, void* stream,
                      unsigned char* inspect, char* error, size_t error_size)

PLAN_MAGIC = DASH_PLAN_MAGIC
PLAN_INSPECT = DASH_PLAN_INSPECT
cdef enum:
    MAX_BUFFERS = 32

cdef extern from "<dlfcn.h>" nogil:
    void* dlopen(const char* filename, int flag)
    void* dlsym(void* handle, const char* symbol)
    int RTLD_NOW
    int RTLD_GLOBAL

ctypedef int (*launch_fn)(void* f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                          unsigned int by, unsigned int bz, unsigned int smem, void* stream, void** params,
                          void** extra) noexcept nogil

cdef launch_fn _cu_launch = NULL


cdef int _init() except -1:
    global _cu_launch
    cdef void* handle
    if _cu_launch != NULL:
        return 0
    handle = dlopen(b"libcuda.so.1", RTLD_NOW | RTLD_GLOBAL)
    if handle == NULL:
        raise RuntimeError("cupy_dash fast launch: libcuda.so.1 could not be opened")
    _cu_launch = <launch_fn>dlsym(handle, b"cuLaunchKernel")
    if _cu_launch == NULL:
        raise RuntimeError("cupy_dash fast launch: cuLaunchKernel not found in libcuda.so.1")
    return 0


def launch(uintptr_t function, unsigned int grid_x, unsigned int grid_y, unsigned int grid_z,
           unsigned int block_x, unsigned int smem_bytes, uintptr_t stream, const unsigned char[::1] params):
    """Launch ``function`` (a CUfunction) with one by-value parameter whose bytes are ``params`` (copied by the
    driver during the call) on ``stream`` (a CUstream, 0 = legacy default). Raises RuntimeError with the CUresult
    on failure."""
    cdef void* arg
    cdef void* args[1]
    cdef int rc
    _init()
    if params.shape[0] == 0:
        raise ValueError("params: empty parameter block")
    arg = <void*>&params[0]
    args[0] = arg
    with nogil:
        rc = _cu_launch(<void*>function, grid_x, grid_y, grid_z, block_x, 1, 1, smem_bytes, <void*>stream, args,
                        NULL)
    if rc != 0:
        raise RuntimeError(f"cuLaunchKernel failed with CUresult {rc}")


def launch_sequence(uintptr_t stream, const unsigned char[::1] params, tuple launches):
    """Launch, in order on ``stream``, every kernel of ``launches``: tuples ``(function, grid_x, grid_y, grid_z,
    block_x, smem_bytes)``, all taking the same parameter block ``params`` (the backward's preprocess, main and
    postprocess). Stops at the first failure and raises RuntimeError naming its position and CUresult."""
    cdef void* args[1]
    cdef int rc
    cdef Py_ssize_t i
    cdef uintptr_t function
    cdef unsigned int gx, gy, gz, bx, smem
    _init()
    if params.shape[0] == 0:
        raise ValueError("params: empty parameter block")
    args[0] = <void*>&params[0]
    for i in range(len(launches)):
        function, gx, gy, gz, bx, smem = launches[i]
        with nogil:
            rc = _cu_launch(<void*>function, gx, gy, gz, bx, 1, 1, smem, <void*>stream, args, NULL)
        if rc != 0:
            raise RuntimeError(f"cuLaunchKernel of kernel {i} of {len(launches)} failed with CUresult {rc}")


def patched_block(const unsigned char[::1] template, tuple maps, tuple map_ptrs, tuple map_offsets, tuple offsets,
                  tuple values):
    """A copy of the packed parameter block ``template`` (bytes) with, for each i, the 128-byte TMA map of
    ``map_ptrs[i]`` from ``maps[i]`` (a fastpath._Maps: its cache, else its ``get``) at byte ``map_offsets[i]``,
    and the 64-bit ``values[i]`` at byte ``offsets[i]`` (two's complement when negative; little-endian, as the
    struct's fields): the
    host fast path's per-call fields, patched in one call. Returns a bytearray. Raises ValueError for a field
    outside the block or a map that is not 128 bytes.

    NOTES: values are copied in host byte order, little-endian on every host CUDA runs on (x86-64, aarch64)."""
    cdef Py_ssize_t n = template.shape[0], i, off
    cdef const unsigned char[::1] m
    cdef unsigned long long value
    cdef long long signed_value
    if len(maps) != len(map_ptrs) or len(maps) != len(map_offsets) or len(offsets) != len(values):
        raise ValueError("patched_block: mismatched field lists")
    out = bytearray(n)
    cdef unsigned char[::1] buf = out
    if n:
        memcpy(&buf[0], &template[0], n)
    for i in range(len(maps)):
        ptr = map_ptrs[i]
        got = maps[i].cache.get(ptr)
        m = got if got is not None else maps[i].get(ptr)
        off = map_offsets[i]
        if m.shape[0] != 128 or off < 0 or off + 128 > n:
            raise ValueError(f"patched_block: map {i} at byte {off} does not fit a {n}-byte block")
        memcpy(&buf[off], &m[0], 128)
    for i in range(len(offsets)):
        off = offsets[i]
        if off < 0 or off + 8 > n:
            raise ValueError(f"patched_block: field {i} at byte {off} does not fit a {n}-byte block")
        v = values[i]
        if v < 0:
            signed_value = v
            memcpy(&buf[off], &signed_value, 8)
        else:
            value = v
            memcpy(&buf[off], &value, 8)
    return out


cdef class LaunchPlan:
    """A launch plan (launch_plan.h; packed by :func:`cupy_dash.cuda.plans.pack_plan`), checked once: :meth:`run`
    launches it with a call's buffer addresses, :meth:`inspect` returns the block it would launch with."""
    cdef readonly bytes blob
    cdef dash_plan plan

    def __cinit__(self, bytes blob):
        cdef char error[256]
        if dash_plan_view(<const char*>blob, len(blob), &self.plan, error, sizeof(error)):
            raise ValueError(error.decode())
        self.blob = blob

    cdef int _run(self, tuple buffers, uintptr_t stream, unsigned char* inspect) except -1:
        cdef uint64_t addresses[MAX_BUFFERS]
        cdef char error[256]
        cdef Py_ssize_t i, n = len(buffers)
        cdef int rc
        if n > MAX_BUFFERS:
            raise ValueError(f"buffers: {n} addresses, at most {MAX_BUFFERS}")
        for i in range(n):
            addresses[i] = buffers[i]
        with nogil:
            rc = dash_plan_run(&self.plan, addresses, n, <void*>stream, inspect, error, sizeof(error))
        if rc:
            raise RuntimeError(f"cupy_dash launch: {error.decode()}")
        return 0

    def run(self, uintptr_t stream, tuple buffers):
        """Zero the plan's buffers and launch its kernels on ``stream`` (a CUstream) with the addresses
        ``buffers`` (ints, in the plan's buffer order). Raises RuntimeError with the CUresult of a failed driver
        call (the kernels before it were enqueued)."""
        self._run(buffers, stream, NULL)

    def inspect(self, tuple buffers) -> bytes:
        """The parameter block the plan would launch with for ``buffers`` (a tensor map's patch writes its address
        over the map's first 8 bytes); no driver call, no GPU."""
        cdef unsigned char out[DASH_PLAN_MAX_PARAMS]
        self._run(buffers, 0, out)
        return out[:self.plan.header.params_size]
