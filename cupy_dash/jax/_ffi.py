"""The C XLA FFI handler of :mod:`cupy_dash.jax` (``xla_ffi.c``): no Python, no GIL at run time.

A prepared call (:class:`cupy_dash.jax.callbacks._Call`) makes one launch plan per device (buffers numbered as the
call's arguments then results); :func:`register` copies them into the extension's slot table, and the custom call
(target ``cupy_dash_launch``, for CUDA, :func:`call`) carries each device's slot in its attribute ``slots``. The
handler runs the plan with the executor every launch shares (``cupy_dash/cuda/launch_plan.c``) on XLA's stream and
answers XLA's metadata query with the command-buffer-compatible trait. Slot ids live in this process (no
serialized programs: the last entry of ``slots`` is this process's token, which the handler checks). Imports no
other module of :mod:`cupy_dash.jax`.
"""
from __future__ import annotations

import threading

import numpy as np

TARGET = "cupy_dash_launch"

_lock = threading.Lock()
_registered = False


def _extension():
    try:
        from . import _xla_ffi
    except ImportError as exc:
        raise ImportError("CUPY_DASH_JAX_FFI=1 needs the extension cupy_dash.jax._xla_ffi, which is not built; "
                          "reinstall cupy_dash (or run `python setup.py build_ext --inplace` in a checkout)") from exc
    return _xla_ffi


def _register_target():
    global _registered
    with _lock:
        if not _registered:
            import jax
            jax.ffi.register_ffi_target(TARGET, _extension().handler(), platform="CUDA")
            _registered = True


def register(launch_plans, devices) -> np.ndarray:
    """The slots of ``launch_plans`` (CUDA ordinal -> executor.LaunchPlan), each copied into the extension's slot
    table: an int64 array indexed by ordinal, -1 for ordinals without one (``devices``: those prepared), then this
    process's token (:func:`slots_of`)."""
    slots = np.full(max(devices, default=0) + 1, -1, np.int64)
    for dev, plan in launch_plans.items():
        with _lock:
            slots[dev] = _extension().register_plan(plan.blob)
    if devices:
        _register_target()
    return slots_of(slots)


def slots_of(per_device) -> np.ndarray:
    """The ``slots`` attribute of a call: the slot ids per device ordinal, then this process's token."""
    return np.append(np.asarray(per_device, np.int64), np.int64(_extension().process_token()))


def call(types, slots, operands):
    """The custom call of the handler on traced ``operands``, with the results ``types``."""
    import jax
    return jax.ffi.ffi_call(TARGET, types)(*operands, slots=slots)
