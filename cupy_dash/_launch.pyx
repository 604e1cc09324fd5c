# cython: boundscheck=False, wraparound=False
"""Kernel launch with one driver call (CUDA Driver API ``cuLaunchKernel``), for the host fast path
(:mod:`cupy_dash.fastpath`): the kernels take one by-value parameter struct, so a launch is the function handle,
the grid, the block, the dynamic shared memory, the stream and the packed struct's bytes.

libcuda is opened with ``dlopen`` on first use (CuPy has loaded it by then); building this module needs no CUDA
headers or toolkit, and importing it needs no GPU.
"""
from libc.stdint cimport uintptr_t

cdef extern from "<dlfcn.h>" nogil:
    void* dlopen(const char* filename, int flag)
    void* dlsym(void* handle, const char* symbol)
    int RTLD_NOW
    int RTLD_GLOBAL

ctypedef int (*launch_fn)(void* f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                          unsigned int by, unsigned int bz, unsigned int smem, void* stream, void** params,
                          void** extra) nogil

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
