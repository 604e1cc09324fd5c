"""The sentinels of the CPU validation tests (not a test module): an autouse fixture that replaces every entry
into GPU work (allocation, stream, DLPack import, occupancy query, schedule build, launch) with a sentinel that
raises GpuTouched, and the inputs and calls those tests make: numpy / ``ml_dtypes.bfloat16`` arrays of a consistent
problem and a tiny fake "CUDA" array (``__dlpack_device__`` says CUDA) to reach the device checks. A test module
that imports ``gpu_work_log`` gets the fixture (autouse) for all its tests. Shared by test_validation.py and
test_window_api.py."""
from __future__ import annotations

import cupy
import ml_dtypes
import numpy as np
import pytest

import cupy_dash
from cupy_dash import schedule
from cupy_dash.core import api, interop
from cupy_dash.cuda import kernels


BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
_build_schedule = schedule.build      # the real one (the autouse fixture replaces schedule.build)


class GpuTouched(Exception):
    """Raised by the sentinels: the call got past validation into GPU work."""


@pytest.fixture(autouse=True)
def gpu_work_log(monkeypatch):
    """Every GPU entry point raises GpuTouched and is logged; yields the log."""
    log = []

    def sentinel(name):
        def f(*args, **kwargs):
            log.append(name)
            raise GpuTouched(name)
        return f

    for mod, names in ((cupy, ("empty", "zeros", "asarray", "from_dlpack")),
                       (cupy.cuda, ("Device", "ExternalStream", "get_current_stream", "alloc")),
                       (kernels, ("launch", "max_resident_ctas")),
                       (schedule, ("build",)),
                       (interop, ("to_cupy", "caller_stream")),
                       (api, ("acquire_slot",))):
        for name in names:
            monkeypatch.setattr(mod, name, sentinel(f"{mod.__name__}.{name}"))
    yield log


def make(B=2, Sq=96, Sk=160, H=4, Hkv=4, D=64, dtype=BF16, Dv=None):
    """q, k, v, do, out (bf16) and lse (fp32) numpy arrays of a consistent problem (``Dv``: v's head dim, default
    ``D``)."""
    Dv = D if Dv is None else Dv
    q = np.zeros((B, Sq, H, D), dtype)
    k = np.zeros((B, Sk, Hkv, D), dtype)
    v = np.zeros((B, Sk, Hkv, Dv), dtype)
    do = np.zeros((B, Sq, H, Dv), dtype)
    out = np.zeros((B, Sq, H, Dv), dtype)
    lse = np.zeros((B, H, Sq), F32)
    return dict(do=do, q=q, k=k, v=v, out=out, lse=lse)


def fwd(t, **kw):
    return cupy_dash.attention_forward(t["q"], t["k"], t["v"], **kw)


def bwd(t, **kw):
    return cupy_dash.attention_backward(t["do"], t["q"], t["k"], t["v"], t["out"], t["lse"], **kw)


def raises(exc, call, *needles):
    """Assert ``call()`` raises ``exc`` with every needle in its message; return the message."""
    with pytest.raises(exc) as info:
        call()
    msg = str(info.value)
    for needle in needles:
        assert needle in msg, f"{needle!r} not in {msg!r}"
    return msg


class FakeCuda:
    """A numpy array that claims to live on a CUDA device (framework "other"): enough for validation."""

    def __init__(self, a, device_id=0):
        self._a = a
        self.shape = a.shape
        self.dtype = a.dtype
        self._dev = device_id
        self.__cuda_array_interface__ = {"shape": a.shape, "typestr": a.dtype.str, "version": 3,
                                         "data": (a.__array_interface__["data"][0], False),
                                         "strides": a.strides}

    def __dlpack_device__(self):
        return (2, self._dev)


def fake(t, device_id=0, skip=()):
    return {n: (a if n in skip else FakeCuda(a, device_id)) for n, a in t.items()}
