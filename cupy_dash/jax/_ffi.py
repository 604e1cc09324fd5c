"""The second mechanism of :mod:`cupy_dash.jax`: a C XLA FFI handler (``xla_ffi.c``), no Python at run time.

Chosen with ``CUPY_DASH_JAX_FFI=1`` (read when a call is traced). Everything :mod:`cupy_dash.jax` prepares at
trace time is prepared the same way (kernels loaded, schedule tables uploaded, error records, on every local
Hopper GPU); in addition, each device gets a launch plan (:mod:`cupy_dash.cuda.plans`, buffers numbered as the
call's arguments then results), copied into the extension's slot table; the custom call (target
``cupy_dash_launch``, registered for CUDA) carries the slot of each device as its attribute ``slots``. At run time
the handler runs the plan with the executor every cupy_dash launch shares (``cupy_dash/cuda/launch_plan.c``) on
XLA's stream: the GIL is never taken. It answers XLA's metadata query with the command-buffer-compatible trait.

Slot ids live in this process, so programs using this mechanism cannot be serialized either.
"""
from __future__ import annotations

import threading

import numpy as np

from ..cuda import launchers, plans
from . import callbacks

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


class _Planned:
    """What the C handler's calls add to the callbacks' (:class:`cupy_dash.jax.callbacks._Call`): a plan per device
    registered in the extension's slot table, and the ``ffi_call`` that carries the slots."""

    def _register(self, plan):
        """Registers ``plan(dev)`` (a :class:`cupy_dash.cuda.plans.Parts`, built with ``dev`` current) of every
        device; ``slots``: int64 array indexed by CUDA ordinal, the plan's slot, -1 for devices without one."""
        import cupy
        slots = np.full(max(self.devices, default=0) + 1, -1, np.int64)
        for dev in self.devices:
            with cupy.cuda.Device(dev):
                blob = plans.pack_plan(*plan(dev))
                with _lock:
                    slots[dev] = _extension().register_plan(blob)
        if self.devices:
            _register_target()
        self.slots = slots

    def bind(self, *operands):
        import jax
        return jax.ffi.ffi_call(TARGET, self.types())(*operands, slots=self.slots)[:3]


class _Forward(_Planned, callbacks._Forward):
    """A traced forward launched by the C handler: buffers q, k, v (arguments), out, lse (results)."""
    names = plans.FWD_BUFFERS[:5]

    def __init__(self, p, cfg):
        super().__init__(p, cfg)
        self._register(lambda dev: plans.forward(self.spec, launchers.fwd_grid(self.p, self.block_m), self.block_m,
                                                 self.block_n, self.p, self.window, self.strides[:3], self.names))


class _Backward(_Planned, callbacks._Backward):
    """A traced backward launched by the C handler: buffers dout, q, k, v, out, lse (arguments), dq, dk, dv and
    the workspace (results)."""
    names = plans.BWD_BUFFERS[:10]

    def __init__(self, p, cfg, spin_timeout_ns):
        super().__init__(p, cfg, spin_timeout_ns)
        self._register(lambda dev: plans.backward(self.launches[dev], (*self.strides, self.strides[3]), self.names,
                                                  error=(self.records[dev], 0)))
