"""Whether a CUDA device can run the kernels (a Hopper GPU, sm_90a, with a CUDA 13 driver), asked in one place:
:func:`state` never raises; :func:`require` raises RuntimeError saying what is missing and who needed it. What
first touches a device without a CUDA tensor in hand asks :func:`require` (not a raw CuPy driver error).
"""
from __future__ import annotations

import threading

NEEDS = "an NVIDIA Hopper GPU (sm_90a, e.g. H100 / H200) with a CUDA 13 driver (>= 580)"

_hopper: set = set()          # device ordinals found to be Hopper GPUs (a device does not change in a process)
_lock = threading.Lock()


def _no_driver(exc) -> str:
    """Why CuPy's CUDA runtime could not count the devices (``exc``), in words."""
    try:
        import cupy
        version = cupy.cuda.runtime.driverGetVersion()
    except Exception:
        version = None
    if version == 0:
        return f"no NVIDIA driver is installed ({exc})"
    if version:
        return f"the NVIDIA driver supports CUDA {version // 1000}.{version % 1000 // 10} only ({exc})"
    return f"no usable CUDA driver ({type(exc).__name__}: {exc})"


def _probe(device: int) -> tuple:
    """``(state, description, device count)``: :func:`state`'s answer and how many devices there are (0 when
    none can be counted)."""
    try:
        import cupy
        rt = cupy.cuda.runtime
        count = rt.getDeviceCount()
    except Exception as exc:        # CUDARuntimeError without a driver, or a CUDA runtime library that fails to load
        return "none", _no_driver(exc), 0
    if count == 0:
        return "none", "the driver sees no CUDA GPU", 0
    if not 0 <= device < count:
        return "none", f"there is no CUDA device {device} ({count} present)", count
    try:
        props = rt.getDeviceProperties(device)
    except Exception as exc:
        return "none", f"CUDA device {device} cannot be queried ({type(exc).__name__}: {exc})", count
    name = props["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    cc = f"{props['major']}{props['minor']}"
    desc = f"{name} (sm_{cc}, {int(props['multiProcessorCount'])} SMs)"
    return ("hopper" if cc == "90" else "other"), desc, count


def state(device: int = 0) -> tuple:
    """``("none" | "other" | "hopper", description)`` of CUDA device ``device`` (an ordinal), never raising:
    "none" with the reason (no driver, a driver too old, no GPU, no such device), "other" for a GPU that is not
    a Hopper one, "hopper" with its name, compute capability and SM count."""
    st, desc, _ = _probe(device)
    return st, desc


def require(what: str, device: int = 0) -> None:
    """Return if CUDA device ``device`` is a Hopper GPU; else raise ``RuntimeError`` saying that ``what`` (e.g.
    "cupy_dash.prepare_varlen_backward (builds and uploads a schedule table)") needs one and what this machine
    has instead. A device found to be a Hopper GPU is not asked again."""
    if device in _hopper:
        return
    st, desc, count = _probe(device)
    if st == "hopper":
        with _lock:
            _hopper.add(device)
        return
    if st == "none" and count:
        problem = desc
    elif st == "none":
        problem = f"no CUDA GPU is available here: {desc}"
    else:
        problem = f"CUDA device {device} is {desc}, not a Hopper GPU"
    raise RuntimeError(f"{what} needs {NEEDS}; {problem}. (cupy_dash.schedule works without a GPU.)")


def bind_context() -> bool:
    """Make the current CUDA device's primary context current on the calling thread if no context is; True if it
    had to (the caller's failed driver call may then be repeated).

    NOTES: CuPy's ``Device(i)`` calls cudaSetDevice only when ``i`` differs from the thread's current device, and
    a thread's current device is 0 before anything sets it, so a new thread can reach a driver-API call (a module
    load, the occupancy query, a launch) with no context current (CUDA_ERROR_INVALID_CONTEXT) when everything it
    needs is cached and its memory comes from CuPy's pool (no runtime call in between, which would bind the
    context). ``cudaFree(0)`` binds it. Called by jit.load before a module load and by kernels.max_resident_ctas
    before the occupancy query (both on cache misses only), and by the executor after a launch that failed so."""
    from cupy.cuda import driver, runtime
    if driver.ctxGetCurrent() != 0:
        return False
    runtime.free(0)
    return True
