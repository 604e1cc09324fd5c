"""The second mechanism of :mod:`cupy_dash.jax`: a C XLA FFI handler (``xla_ffi.c``), no Python at run time.

Chosen with ``CUPY_DASH_JAX_FFI=1`` (read when a call is traced). Everything :mod:`cupy_dash.jax` prepares at
trace time is prepared the same way (kernels loaded, schedule tables uploaded, error records, on every local
Hopper GPU); in addition, each device gets a *launch plan*: the kernels' function handles and launch shapes, the
parameter block as :mod:`cupy_dash.cuda.launchers` packs it, the places where buffer addresses go, and the buffers to
zero first (dk, dv when a window leaves keys unseen). The plan is copied into the extension's slot table, and the
custom call (target ``cupy_dash_launch``, registered for CUDA) carries the slot of each device as its attribute
``slots``. At run time the handler copies the block, writes the addresses (tensor maps through
``cuTensorMapReplaceAddress``), zeroes (``cuMemsetD8Async``) and calls ``cuLaunchKernel`` on XLA's stream: the GIL
is never taken. It answers XLA's metadata query with the command-buffer-compatible trait.

Where the addresses go is found, not hard-coded: the block is packed twice with two different sets of fake
addresses (one disjoint range per buffer); the 8-byte pointer fields that move with the fake addresses are
patches (buffer and offset from the range), the others are constants (schedule tables, error record, null).
Tensor maps are assigned to their buffer by field name (:data:`MAP_BUFFERS`).

Slot ids live in this process, so programs using this mechanism cannot be serialized either.
"""
from __future__ import annotations

import struct
import threading

import numpy as np

from ..cuda import jit, launchers
from . import callbacks

TARGET = "cupy_dash_launch"
PLAN_MAGIC = 0x48534144                  # xla_ffi.h DASH_PLAN_MAGIC
PLAN_INSPECT = 1                         # xla_ffi.h DASH_PLAN_INSPECT
_SHIFT = 36                              # each fake buffer spans 2^36 bytes (16-byte aligned, below 2^47)
_FAKE_BASES = (0x100 << _SHIFT, 0x180 << _SHIFT)
# tensor-map fields of the parameter blocks -> the operand each describes
MAP_BUFFERS = {"tma_q": "q", "tma_k": "k", "tma_v": "v", "tma_o": "out", "tma_do": "dout"}

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


def find_patches(pack, names, base_a=_FAKE_BASES[0], base_b=_FAKE_BASES[1]):
    """``(params, pointer patches, map patches)`` of a parameter block.

    ``pack(addresses)`` packs the block (a size-1 structured array) for the buffer addresses ``addresses``
    (``names[i]`` -> address); it is called with two fake address sets. Pointer patches are ``(offset, buffer,
    add)``: the field holds buffer ``buffer``'s address plus ``add``; map patches ``(offset, buffer, 0)``.
    Raises ValueError for a field that moves but not like one buffer, or a map field with no known buffer."""
    def fake(base):
        return {name: base + (i << _SHIFT) for i, name in enumerate(names)}
    a, b = pack(fake(base_a)), pack(fake(base_b))
    pointers, maps = [], []
    for field in a.dtype.names:
        fdt, offset = a.dtype.fields[field][:2]
        if fdt == np.dtype("<u8"):
            va, vb = int(a[field][0]), int(b[field][0])
            if va == vb:
                continue                                          # a constant address (or null)
            ra, rb = va - base_a, vb - base_b
            if ra != rb or not 0 <= ra < len(names) << _SHIFT:
                raise ValueError(f"plan: pointer field {field} does not follow any one buffer")
            pointers.append((offset, ra >> _SHIFT, ra & ((1 << _SHIFT) - 1)))
        elif fdt.kind == "V" and fdt.itemsize == 128:
            operand = MAP_BUFFERS.get(field)
            if operand not in names:
                raise ValueError(f"plan: tensor map field {field} describes no buffer of {names}")
            maps.append((offset, names.index(operand), 0))
    return a, pointers, maps


def pack_plan(kernel_launches, params, pointers, maps, zeros=(), flags=0) -> bytes:
    """The plan blob of xla_ffi.h: ``kernel_launches`` = ``[(CUfunction, grid, threads, smem bytes), ...]``;
    ``zeros`` = ``[(buffer, bytes), ...]`` to zero before the kernels."""
    raw = params.tobytes()
    blob = [struct.pack("<8I", PLAN_MAGIC, flags, len(kernel_launches), len(raw), len(pointers), len(maps),
                        len(zeros), 0)]
    for function, grid, threads, smem in kernel_launches:
        grid = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
        blob.append(struct.pack("<Q3I3III", int(function), *grid, int(threads), 1, 1, int(smem), 0))
    blob += [struct.pack("<IIQ", int(o), int(i), int(add)) for o, i, add in (*pointers, *maps)]
    blob += [struct.pack("<IIQ", 0, int(i), int(n)) for i, n in zeros]
    blob.append(raw)
    return b"".join(blob)


def _function(spec) -> int:
    return int(jit.load(spec).ptr)


class _Planned:
    """What the C handler's calls add to the callbacks' (:class:`cupy_dash.jax.callbacks._Call`): a plan per device
    registered in the extension's slot table, and the ``ffi_call`` that carries the slots."""

    def _register(self, plan):
        """Registers ``plan(dev)`` (a plan blob, built with ``dev`` current) of every device; ``slots``: int64 array
        indexed by CUDA ordinal, the plan's slot, -1 for devices without one."""
        import cupy
        slots = np.full(max(self.devices, default=0) + 1, -1, np.int64)
        for dev in self.devices:
            with cupy.cuda.Device(dev):
                blob = plan(dev)
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
    names = ("q", "k", "v", "out", "lse")

    def __init__(self, p, cfg):
        super().__init__(p, cfg)
        self._register(self._plan)

    def _plan(self, dev):
        launch = (_function(self.spec), launchers.fwd_grid(self.p, self.block_m), self.spec.threads,
                  self.spec.smem_bytes)
        return pack_plan([launch], *find_patches(self._pack, self.names))

    def _pack(self, a):
        return launchers.fwd_params(self.block_m, self.block_n, self.p, self.window,
                                    self.operands(a["q"], a["k"], a["v"]), a["out"], a["lse"])


class _Backward(_Planned, callbacks._Backward):
    """A traced backward launched by the C handler: buffers dout, q, k, v, out, lse (arguments), dq, dk, dv and
    the workspace (results)."""
    names = ("dout", "q", "k", "v", "out", "lse", "dq", "dk", "dv", "work")

    def __init__(self, p, cfg, spin_timeout_ns):
        super().__init__(p, cfg, spin_timeout_ns)
        self._register(self._plan)

    def _plan(self, dev):
        c, record = self.launches[dev], self.records[dev]
        kernels = [(_function(s), g, s.threads, s.smem_bytes) for s, g in launchers.bwd_kernels(c)]
        zeros = list(zip(map(self.names.index, ("dk", "dv")), launchers.kv_bytes(self.p))) if c.zero_kv else []
        return pack_plan(kernels, *find_patches(lambda a: self._pack(c, record, a), self.names), zeros)

    def _pack(self, c, record, a):
        operands = self.operands(a["q"], a["k"], a["v"], a["out"], a["dout"])
        return launchers.bwd_params(c, operands, a["lse"], a["work"], (a["dq"], a["dk"], a["dv"]), (record, 0))
