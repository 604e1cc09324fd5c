# cython: language_level=3
"""Python face of the XLA FFI handler in xla_ffi.c (see cupy_dash/jax/_ffi.py): its address as a PyCapsule for
``jax.ffi.register_ffi_target``, and the registration of launch plans. Builds without jaxlib or CUDA headers."""
from cpython.pycapsule cimport PyCapsule_New

from libc.stdint cimport int64_t

cdef extern from "xla_ffi.h":
    int dash_plan_register(const void* blob, size_t size, char* error, size_t error_size) nogil
    int64_t dash_ffi_process_token() nogil
    void* dash_ffi_handler_address() nogil


def handler():
    """The handler (``XLA_FFI_Handler*``) as an unnamed PyCapsule."""
    return PyCapsule_New(dash_ffi_handler_address(), NULL, NULL)


def process_token() -> int:
    """This process's token (0 before the first registration), which the handler requires as the last entry of a
    call's ``slots``."""
    return dash_ffi_process_token()


def register_plan(bytes blob) -> int:
    """Copy a packed launch plan (xla_ffi.h) into a new slot, kept for the life of the process; return its id.
    Raises ValueError for a malformed plan. Not thread-safe: callers serialize."""
    cdef char error[256]
    cdef int slot = dash_plan_register(<const char*>blob, len(blob), error, sizeof(error))
    if slot < 0:
        raise ValueError(error.decode())
    return slot
