"""What every JAX call of cupy_dash prepares at trace time and runs: the per-device preparation cache (:func:`_get`),
the local Hopper GPUs a call is prepared on, the base class :class:`_Call` (result types, a launch plan per device,
the custom call that runs them: the C handler's or a ``buffer_callback``), the fixed-length :class:`_Forward` and
:class:`_Backward`, and the run-time helpers the varlen modules share. Of :mod:`cupy_dash.jax` it imports
:mod:`cupy_dash.jax._ffi` only.
"""

from __future__ import annotations

import collections
import threading

import jax
import numpy as np

from ..core import api, interop
from ..cuda import jit, kernels, launchers, plans
from ..cuda.errors import jit_record, record_shared
from ..schedule import compact_device
from . import _ffi


_lock = threading.RLock()
_prepared: dict = {}                           # key -> _Call (ops.prepare), kept for the life of the process
callback_runs = collections.Counter()          # executions of the Python callbacks, by "forward" / "backward"


def _get(key, make):
    with _lock:
        prepared = _prepared.get(key)
        if prepared is None:
            prepared = _prepared[key] = make()
        return prepared


def _vma(x) -> frozenset:
    """The manual mesh axes (``jax.shard_map``) that ``x`` varies over; empty outside shard_map (the type's
    ``manual_axis_type.varying``, ``vma`` before JAX 0.10)."""
    aval = jax.typeof(x)
    mat = getattr(aval, "manual_axis_type", None)
    return frozenset(mat.varying if mat is not None else getattr(aval, "vma", ()))


def _cast_varying(x, axes):
    missing = tuple(sorted(axes - _vma(x)))
    if not missing:
        return x
    return jax.lax.pcast(x, missing, to="varying") if hasattr(jax.lax, "pcast") else jax.lax.pvary(x, missing)


def vary_together(*arrays) -> tuple:
    """``arrays`` typed to vary over every manual mesh axis that any of them varies over. A differentiable call does
    this to its operands before its ``custom_vjp``: an operand replicated over an axis (k, v beside a sharded q) then
    gets its gradient summed over that axis by the cast's transpose, and each cotangent has its primal's type."""
    return vary_like(arrays, arrays)


def vary_like(results, operands) -> tuple:
    """A custom call's ``results`` typed to vary over the manual mesh axes its ``operands`` vary over: inside
    ``jax.shard_map`` XLA's custom calls give results that vary over none, and shard_map's type check (and a
    ``custom_vjp`` backward, which must return its primals' types) reject that."""
    axes = frozenset().union(*map(_vma, operands))
    return tuple(_cast_varying(x, axes) for x in results)


def _gpus() -> tuple:
    """CUDA ordinals of the local GPUs JAX may run a traced call on (none when JAX has no GPU backend); raises
    RuntimeError when none of them is a Hopper GPU."""
    try:
        devices = jax.local_devices(backend="gpu")
    except RuntimeError:                     # no GPU backend: tracing / lowering only
        return ()
    ids = sorted({d.id if getattr(d, "local_hardware_id", None) is None else d.local_hardware_id for d in devices})
    import cupy
    hopper = tuple(i for i in ids if cupy.cuda.Device(i).compute_capability == "90")
    if ids and not hopper:
        raise RuntimeError(f"cupy_dash.jax: needs an NVIDIA Hopper GPU (sm_90a); JAX's GPUs {ids} are not")
    return hopper


def _load(specs) -> None:
    """Load ``specs`` on the current device, now rather than at their first launch."""
    from cupy.cuda import driver
    for spec in specs:
        # NOTES: with CUDA's lazy loading a kernel is loaded at its first launch, which may come while XLA captures
        # a command buffer; an attribute query loads it here.
        driver.funcGetAttribute(driver.CU_FUNC_ATTRIBUTE_NUM_REGS, jit.load(spec).ptr)


class _Call:
    """A prepared custom call for the validated problem ``p`` (``packed``: the varlen layout, operands ``(total, H,
    D)`` and lse ``(H, total_q)``, ``p`` their batch of one): its result types, a launch plan per device
    (:meth:`parts`, made by :meth:`prepare`) and :meth:`bind`, the custom call that runs them with XLA's buffers,
    numbered as the call's arguments then results (``names``): the C handler's (``ffi``, :mod:`cupy_dash.jax._ffi`),
    or a ``jax.experimental.buffer_callback`` of this object (:meth:`__call__`). A backward sets ``work_bytes``."""
    packed = False
    command_buffer = True
    ffi_capable = True                         # False: a callback whatever CUPY_DASH_JAX_FFI says
    work_bytes = None                          # the backward's workspace; None: a forward
    persistent = False                         # a forward's persistent build: its tile counter is a result too
    kind, names = "forward", plans.FWD_BUFFERS[:5]

    def __init__(self, p, cfg):
        """``strides``: (batch, row, head) element strides of contiguous q ``(B, Sq, H, D)``, k ``(B, Sk, Hkv, D)``,
        v ``(B, Sk, Hkv, Dv)`` and out-like ``(B, Sq, H, Dv)`` operands; ``devices``: the GPUs to prepare
        (:func:`_gpus`)."""
        self.p, self.causal, self.window = p, cfg.causal, cfg.window
        self.ffi = cfg.ffi and self.ffi_capable
        self.strides = tuple(interop.contiguous_strides(shape)[:3] for shape in (
            (p.B, p.Sq, p.H, p.D), (p.B, p.Sk, p.Hkv, p.D), (p.B, p.Sk, p.Hkv, p.Dv), (p.B, p.Sq, p.H, p.Dv)))
        self.devices = _gpus()
        self.plans, self.slots = {}, None

    def prepare(self):
        """Each device's launch plan (:meth:`parts`; None: made when the call runs), and with the C handler their
        slots. Returns self."""
        import cupy
        for dev in self.devices:
            with cupy.cuda.Device(dev):
                parts = self.parts(dev)
                if parts is not None:
                    self.plans[dev] = parts.plan()
        if self.ffi:
            self.slots = _ffi.register(self.plans, self.devices)
        return self

    def bwd_strides(self) -> tuple:
        """The strides of a backward's q, k, v, out, dout, in the kernels' order."""
        return (*self.strides, self.strides[3])

    def types(self) -> tuple:
        """The results: out ``(B, Sq, H, Dv)``, lse ``(B, H, Sq)`` float32 and the persistent build's int32 tile
        counter ``(1,)`` (forward), or dq ``(B, Sq, H, D)``, dk ``(B, Sk, Hkv, D)``, dv ``(B, Sk, Hkv, Dv)`` and the
        uint8 workspace (backward); without B when ``packed``."""
        p, lead, dtype = self.p, (() if self.packed else (self.p.B,)), api.NP_DTYPES[self.p.dtype]
        if self.work_bytes is None:
            counter = (jax.ShapeDtypeStruct((1,), np.int32),) if self.persistent else ()
            return (jax.ShapeDtypeStruct((*lead, p.Sq, p.H, p.Dv), dtype),
                    jax.ShapeDtypeStruct((*lead, p.H, p.Sq), np.float32), *counter)
        return (*(jax.ShapeDtypeStruct((*lead, *shape), dtype) for shape in (
            (p.Sq, p.H, p.D), (p.Sk, p.Hkv, p.D), (p.Sk, p.Hkv, p.Dv))),
            jax.ShapeDtypeStruct((self.work_bytes,), np.uint8))

    def bind(self, *operands):
        """The custom call on traced operands: ``(out, lse)`` or ``(dq, dk, dv)`` (the tile counter or the workspace
        dropped)."""
        kept = 2 if self.work_bytes is None else 3
        if self.ffi:
            return _ffi.call(self.types(), self.slots, operands)[:kept]
        from jax.experimental.buffer_callback import buffer_callback
        return buffer_callback(self, self.types(), command_buffer_compatible=self.command_buffer)(*operands)[:kept]

    def __call__(self, ctx, outs, *args):
        """The buffer_callback: :meth:`run` on the results' device, XLA's stream, the call's buffers."""
        callback_runs[self.kind] += 1
        dev = _device(outs[0], self.devices)
        import cupy
        with cupy.cuda.Device(dev):
            self.run(dev, interop.external_stream(ctx.stream, dev), tuple(map(_ptr, (*args, *outs))))

    def run(self, dev, stream, buffers) -> None:
        """Launch on ``stream`` with the addresses ``buffers`` (``names``' order): the device's plan."""
        self.plans[dev].run(stream.ptr, buffers)


class _Forward(_Call):
    """A traced forward: buffers q, k, v (arguments), out, lse (results), and with the persistent build its tile
    counter (a third result). :mod:`cupy_dash.jax.varlen`'s subclass launches packed batches, with its ``grid``,
    ``num_seqs``, ``names`` and :meth:`cu_seqlens` (``grid`` None: launchers.fwd_grid)."""
    grid = num_seqs = None

    def __init__(self, p, cfg):
        super().__init__(p, cfg)
        # NOTES: fixed-length forwards take the persistent build where the functional API's do
        # (kernels.FWD_PERSISTENT: causal masks); its tile counter is a result of the custom call, so that XLA gives
        # each call its own (stream-ordered, as the functional API's allocation) and the plan zeroes it before the
        # launch, also in a command buffer's replay.
        self.persistent = not self.packed and cfg.causal in kernels.FWD_PERSISTENT
        if self.persistent:
            self.names = plans.FWD_PERSISTENT_BUFFERS
        self.spec, self.block_m, self.block_n = kernels.fwd_entry(p.dtype, p.D, cfg.causal, p.Dv,
                                                                 persistent=self.persistent)
        import cupy
        for dev in self.devices:
            with cupy.cuda.Device(dev):
                _load([self.spec])

    def parts(self, dev):
        p = self.p._replace(device_id=dev)       # the launch order follows the device's SMs and L2
        grid = launchers.fwd_grid(p, self.block_m) if self.grid is None else self.grid
        return plans.forward(self.spec, grid, self.block_m, self.block_n, p, self.window, self.strides[:3],
                             self.names, self.num_seqs, self.cu_seqlens(dev))

    def cu_seqlens(self, dev) -> tuple:
        """Fixed device cu_seqlens of a varlen launch on ``dev`` (none: the call's own buffers, or fixed length)."""
        return (0, 0)


class _Backward(_Call):
    """A traced backward: buffers dout, q, k, v, out, lse (arguments), dq, dk, dv and the workspace (results); per
    device its :class:`cupy_dash.cuda.launchers.BwdLaunch` (kernels loaded, schedule tables uploaded) and error
    record."""
    kind, names = "backward", plans.BWD_BUFFERS[:10]

    def __init__(self, p, cfg, spin_timeout_ns):
        import cupy
        tile = kernels.bwd_tile(p.D, cfg.causal, seqlen_q=p.Sq, window=cfg.window)
        # NOTES: long problems read compact records, as the eager path does (compact_device.table_form)
        capped = p.softcap > 0
        compact = compact_device.wanted(p.Sq, p.Sk, tile.block_m, tile.block_n, p.B * p.H, cfg.causal, cfg.window)
        specs = kernels.bwd_specs(p.dtype, p.D, cfg.causal, compact=compact, softcap=capped,
                                  seqlen_q=p.Sq, window=cfg.window, head_dim_v=p.Dv)
        tile = kernels.bwd_tile(p.D, cfg.causal, compact, p.Sq, cfg.window)
        self.work_bytes = launchers.BwdLaunch(specs, tile.block_m, tile.block_n, p, cfg.deterministic,
                                              spin_timeout_ns, cfg.causal, cfg.window).work_bytes
        super().__init__(p, cfg)
        self.launches, self.records = {}, {}
        for dev in self.devices:
            with cupy.cuda.Device(dev):
                specs, bm, bn, max_ctas = kernels.bwd_entry(dev, p.dtype, p.D, cfg.causal, compact=compact,
                                                            softcap=capped, seqlen_q=p.Sq, window=cfg.window,
                                                            head_dim_v=p.Dv)
                _load(specs)
                c = launchers.BwdLaunch(specs, bm, bn, p._replace(device_id=dev), cfg.deterministic, spin_timeout_ns,
                                        cfg.causal, cfg.window)
                stream = cupy.cuda.Stream(non_blocking=True)       # the upload waits for nothing of XLA's
                with stream:
                    c.tables = launchers.bwd_tables(cfg.schedule, c, max_ctas, dev, stream, compact=compact)
                self.launches[dev] = c
                self.records[dev] = jit_record(dev, (c.tables.policy, p.B, p.H, p.Sq, p.Sk, p.D, cfg.causal,
                                                     cfg.window))
                if record_shared(dev, self.records[dev]):
                    c.fold = False
        # NOTES: tables with split KV columns (cupy_dash/schedule/pieces.py) need workspace for their slots, which
        # only the uploaded tables know
        self.work_bytes = max([self.work_bytes, *(c.work_bytes for c in self.launches.values())])

    def parts(self, dev):
        return plans.backward(self.launches[dev], self.bwd_strides(), self.names, error=(self.records[dev], 0))


# ------------------------------------------------------------------------------------------------------------
# run time (inside the callback): buffers
# ------------------------------------------------------------------------------------------------------------
def _device(buffer, prepared) -> int:
    """The CUDA ordinal of an XLA buffer, which must be one the call was prepared on."""
    kind, ordinal = buffer.__dlpack_device__()
    if kind != interop.DLPACK_CUDA:
        raise RuntimeError(f"cupy_dash.jax: runs on CUDA GPUs only, but XLA runs this call on "
                           f"{interop.device_name(kind, ordinal)}")
    if ordinal not in prepared:
        raise RuntimeError(f"cupy_dash.jax: this call was prepared (when traced) for the Hopper GPUs "
                           f"{list(prepared)} JAX had then, but XLA runs it on cuda:{ordinal}")
    return ordinal


def _ptr(buffer) -> int:
    return buffer.__cuda_array_interface__["data"][0]
