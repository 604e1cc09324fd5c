"""What a call captured into a CUDA graph needs and no eager call has made yet (its kernels compiled and loaded, its
schedule tables uploaded, the device's graph error records), made during the capture by :func:`outside`: the
thread's capture mode relaxed, on a stream of its own synchronized before the block ends, so the graph needs no
event of it. docs/architecture.md, "Captured calls".
"""
from __future__ import annotations

import contextlib
import threading

import cupy

from .tensormap import cuda_driver

_streams: dict = {}          # device -> its non-blocking stream for work made outside a capture
_lock = threading.Lock()


def _exchange(mode):
    """Set the calling thread's stream-capture mode; return the one it had."""
    driver = cuda_driver()
    err, old = driver.cuThreadExchangeStreamCaptureMode(mode)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cupy_dash: cuThreadExchangeStreamCaptureMode failed: {err}")
    return old


@contextlib.contextmanager
def outside(device_id: int):
    """A block that may compile, load kernels, allocate and upload for device ``device_id`` while a stream is
    capturing a CUDA graph: the thread's capture mode is relaxed for the block, device ``device_id`` and a
    non-blocking stream of its own (yielded) are current (CuPy's current stream is no longer the capturing one),
    and that stream is synchronized when the block ends. The previous mode, device and stream come back whatever
    happens in the block."""
    old = _exchange(cuda_driver().CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED)
    try:
        with cupy.cuda.Device(device_id):
            with _lock:           # made relaxed too: the first block of a device may run during a capture
                side = _streams.get(device_id)
                if side is None:
                    side = _streams[device_id] = cupy.cuda.Stream(non_blocking=True)
            with side:
                yield side
                side.synchronize()
    finally:
        _exchange(old)


def find_or_make(device_id: int, find):
    """What ``find(stream, capture)`` finds for a call being captured into a CUDA graph on device ``device_id``
    (``capture=True``: a cached device table, kept then for the life of the process; None where there is none):
    what an eager call left, else made by ``find`` in :func:`outside` (on its stream) and then found."""
    found = find(None, True)
    if found is None:
        with outside(device_id) as side:
            find(side, False)
        found = find(None, True)
        if found is None:         # evicted by another thread's calls in between: the cache holds many entries
            raise RuntimeError(f"cupy_dash: a schedule table made for a CUDA graph capture on device {device_id} "
                               f"was evicted before the capture could read it; capture again")
    return found


def loading(device_id: int, capturing: bool):
    """The context in which a call on device ``device_id`` may compile and load its kernels: none for an eager call,
    :func:`outside` for a captured one."""
    return outside(device_id) if capturing else contextlib.nullcontext()
