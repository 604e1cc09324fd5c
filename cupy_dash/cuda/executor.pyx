# cython: boundscheck=False, wraparound=False
"""Every kernel launch of cupy_dash, through the executor of launch_plan.c: :class:`LaunchPlan` (a forward's or a
backward's kernels, parameter template and buffer patches: :mod:`cupy_dash.cuda.plans`), and :func:`launch` for one
kernel outside a plan (the varlen tables' expansion, benchmarks). The kernels take one by-value parameter struct,
so a launch is the function handle, the grid, the block, the dynamic shared memory, the stream and the struct's
bytes; :func:`patched_block` writes integer fields into a copy of a packed block.

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
        DASH_PLAN_MAX_BUFFERS
    ctypedef struct dash_plan_header:
        unsigned int params_size
    ctypedef struct dash_plan_kernel:
        uint64_t function
        unsigned int grid[3]
        unsigned int block[3]
        unsigned int smem
    ctypedef struct dash_plan:
        dash_plan_header header
    int dash_plan_view(const void* blob, size_t size, dash_plan* plan, char* error, size_t error_size)
    int dash_launch_kernel(const dash_plan_kernel* kernel, void* params, void* stream, char* error,
                           size_t error_size)
    int dash_plan_run(const dash_plan* plan, const uint64_t* buffers, size_t num_buffers, void* stream,
                      unsigned char* inspect, char* error, size_t error_size)

PLAN_MAGIC = DASH_PLAN_MAGIC
PLAN_INSPECT = DASH_PLAN_INSPECT

cdef enum:
    CUDA_ERROR_INVALID_CONTEXT = 201

# NOTES: a thread with no CUDA context current (a new thread whose every need was cached: no runtime call has bound
# one) fails its first driver call with CUDA_ERROR_INVALID_CONTEXT, before anything is enqueued, as every driver
# call fails then (a tensor map's re-pointing is host-side and repeats the same bytes). A launch that fails so binds
# the current device's primary context (cupy_dash.gpu.bind_context) and runs once more; the path that succeeds pays
# nothing.
cdef bint _bound_after(int rc) except -1:
    if rc != CUDA_ERROR_INVALID_CONTEXT:
        return False
    from cupy_dash import gpu
    return gpu.bind_context()

def launch(uintptr_t function, unsigned int grid_x, unsigned int grid_y, unsigned int grid_z,
           unsigned int block_x, unsigned int smem_bytes, uintptr_t stream, const unsigned char[::1] params):
    """Launch ``function`` (a CUfunction) with one by-value parameter whose bytes are ``params`` (copied by the
    driver during the call) on ``stream`` (a CUstream, 0 = legacy default): one kernel outside a plan. Raises
    RuntimeError with the CUresult on failure."""
    cdef dash_plan_kernel k
    cdef char error[256]
    cdef int rc
    if params.shape[0] == 0:
        raise ValueError("params: empty parameter block")
    k.function, k.smem = function, smem_bytes
    k.grid[0], k.grid[1], k.grid[2] = grid_x, grid_y, grid_z
    k.block[0], k.block[1], k.block[2] = block_x, 1, 1
    with nogil:
        rc = dash_launch_kernel(&k, <void*>&params[0], <void*>stream, error, sizeof(error))
    if _bound_after(rc):
        with nogil:
            rc = dash_launch_kernel(&k, <void*>&params[0], <void*>stream, error, sizeof(error))
    if rc:
        raise RuntimeError(f"cupy_dash launch: {error.decode()}")


def patched_block(const unsigned char[::1] template, tuple offsets, tuple values):
    """A copy of the packed parameter block ``template`` (bytes) with, for each i, the 64-bit ``values[i]`` at byte
    ``offsets[i]`` (two's complement when negative; little-endian, as the struct's fields). Returns a bytearray.
    Raises ValueError for a field outside the block.

    NOTES: values are copied in host byte order, little-endian on every host CUDA runs on (x86-64, aarch64)."""
    cdef Py_ssize_t n = template.shape[0], i, off
    cdef unsigned long long value
    cdef long long signed_value
    if len(offsets) != len(values):
        raise ValueError("patched_block: mismatched field lists")
    out = bytearray(n)
    cdef unsigned char[::1] buf = out
    if n:
        memcpy(&buf[0], &template[0], n)
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
    launches it with a call's buffer addresses, :meth:`inspect` returns the block it would launch with. ``parts``:
    what it was packed from (:class:`cupy_dash.cuda.plans.Parts`), if given."""
    cdef readonly bytes blob
    cdef readonly object parts
    cdef dash_plan plan

    def __cinit__(self, bytes blob, parts=None):
        cdef char error[256]
        if dash_plan_view(<const char*>blob, len(blob), &self.plan, error, sizeof(error)):
            raise ValueError(error.decode())
        self.blob, self.parts = blob, parts

    cdef int _run(self, tuple buffers, uintptr_t stream, unsigned char* inspect) except -1:
        cdef uint64_t addresses[DASH_PLAN_MAX_BUFFERS]
        cdef char error[256]
        cdef Py_ssize_t i, n = len(buffers)
        cdef int rc
        if n > DASH_PLAN_MAX_BUFFERS:
            raise ValueError(f"buffers: {n} addresses, at most {DASH_PLAN_MAX_BUFFERS}")
        for i in range(n):
            addresses[i] = buffers[i]
        with nogil:
            rc = dash_plan_run(&self.plan, addresses, n, <void*>stream, inspect, error, sizeof(error))
        if _bound_after(rc):
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
