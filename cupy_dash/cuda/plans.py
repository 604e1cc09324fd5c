"""Launch plans: what one forward or backward needs on one device except buffer addresses (kernels, parameter
template, where each named buffer's address goes, buffers to zero), run by :class:`cupy_dash.cuda.executor.LaunchPlan`
(the JAX handler runs the same blobs). Where the addresses go is found by :func:`find_patches`, not listed by hand.
docs/architecture.md, "Launchers and launch plans"; docs/decisions/launch-plans.md.
"""
from __future__ import annotations

import struct
import threading
import typing

import numpy as np

from . import executor, jit, kernels, launchers
from .params import int_field_offsets

PLAN_INSPECT = executor.PLAN_INSPECT     # launch_plan.h DASH_PLAN_INSPECT (the JAX handler's inspect flag)
FWD_BUFFERS = ("q", "k", "v", "out", "lse", "cu_seqlens_q", "cu_seqlens_k")
FWD_PERSISTENT_BUFFERS = FWD_BUFFERS[:5] + ("tile_counter",)     # the persistent build's (fixed length)
BWD_BUFFERS = ("dout", "q", "k", "v", "out", "lse", "dq", "dk", "dv", "work", "error", "error_host")
# tensor-map fields of the parameter blocks -> the buffer each describes
MAP_BUFFERS = {"tma_q": "q", "tma_k": "k", "tma_v": "v", "tma_o": "out", "tma_do": "dout", "tma_dk": "dk",
               "tma_dv": "dv"}
_MAX_CACHED = 256       # forward plans, and backward plans per schedule table
_forwards: dict = {}
_lock = threading.Lock()
_SHIFT = 36                              # each fake buffer spans 2^36 bytes (16-byte aligned, below 2^47)
_FAKE_BASES = (0x100 << _SHIFT, 0x180 << _SHIFT)
# the block offsets of the workspace's arrays, in launchers.BwdLaunch.offsets' order (their patches add the offset)
_WORK_FIELDS = {kernels.BWD_PARAMS_DTYPE.fields[name][1]: k for k, name in enumerate(
    ("lse_log2", "dpsum", "dq_accum", "dq_semaphore", "dkv_pieces", "piece_count"))}


class Parts(typing.NamedTuple):
    """A plan before packing: ``kernels`` ``[(CUfunction, grid, threads, smem bytes), ...]``, ``params`` the
    template (a size-1 structured array), ``pointers`` / ``maps`` ``[(offset, buffer, add), ...]``, ``zeros``
    ``[(buffer, bytes), ...]``, ``names`` the buffers' (:func:`forward`, :func:`backward`); ``work``: a backward's
    ``(pointer patch index, workspace array)`` of the patches into its workspace (:func:`rebased`); ``pack``: the
    packer the patches were found from (``pack({name: address})`` -> the block for those addresses), None where
    the plan was patched after (:func:`rebased`)."""
    kernels: tuple
    params: np.ndarray
    pointers: tuple
    maps: tuple
    zeros: tuple = ()
    names: tuple = ()
    work: tuple = ()
    pack: typing.Callable = None

    def plan(self, flags: int = 0) -> executor.LaunchPlan:
        return executor.LaunchPlan(pack_plan(self.kernels, self.params, self.pointers, self.maps, self.zeros, flags),
                                   self)


def find_patches(pack, names):
    """``(params, pointer patches, map patches)`` of a parameter block.

    ``pack(addresses)`` packs the block (a size-1 structured array) for the buffer addresses ``addresses``
    (``names[i]`` -> address); it is called with two fake address sets. Pointer patches are ``(offset, buffer,
    add)``: the field holds buffer ``buffer``'s address plus ``add``; map patches ``(offset, buffer, 0)``.
    Raises ValueError for a field that moves but not like one buffer, or a map field with no known buffer."""
    def fake(base):
        return {name: base + (i << _SHIFT) for i, name in enumerate(names)}
    base_a, base_b = _FAKE_BASES
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
    return a, tuple(pointers), tuple(maps)


def pack_plan(kernel_launches, params, pointers, maps, zeros=(), flags=0) -> bytes:
    """The plan blob of launch_plan.h: ``kernel_launches`` = ``[(CUfunction, grid, threads, smem bytes), ...]``;
    ``zeros`` = ``[(buffer, bytes), ...]`` to zero before the kernels."""
    raw = params.tobytes()
    blob = [struct.pack("<8I", executor.PLAN_MAGIC, flags, len(kernel_launches), len(raw), len(pointers), len(maps),
                        len(zeros), 0)]
    blob += [_kernel_bytes(*k) for k in kernel_launches]
    blob += [_PATCH_STRUCT.pack(int(o), int(i), int(add)) for o, i, add in (*pointers, *maps)]
    blob += [_PATCH_STRUCT.pack(0, int(i), int(n)) for i, n in zeros]
    blob.append(raw)
    return b"".join(blob)


def _launch(spec, grid) -> tuple:
    """A kernel of a plan: ``spec`` loaded on the current device, launched with ``grid``."""
    return jit.load(spec).ptr, grid, spec.threads, spec.smem_bytes


def forward(spec, grid, block_m, block_n, p, window, strides, names=FWD_BUFFERS[:5], varlen=None,
            cu_seqlens=(0, 0)) -> Parts:
    """The forward of ``p`` (``launchers.fwd_params``' arguments; ``strides``: the (batch, row, head) element
    strides of q, k, v) with the tile ``grid``, buffers ``names`` (:data:`FWD_BUFFERS`' names, in the order the
    caller passes them); ``varlen``: the number of sequences of a varlen launch, whose cu_seqlens are buffers
    ``cu_seqlens_q`` and ``cu_seqlens_k``, or, where ``names`` has none, the fixed device arrays ``cu_seqlens``. The
    persistent build (``spec``'s DASH_PERSISTENT; fixed length) takes :data:`FWD_PERSISTENT_BUFFERS`: its tile
    counter, zeroed before the launch, and one CTA per SM (launchers.fwd_persistent_grid)."""
    persistent = ("DASH_PERSISTENT", 1) in spec.defines

    def pack(a):
        cu = None if varlen is None else (varlen, a.get("cu_seqlens_q", cu_seqlens[0]),
                                          a.get("cu_seqlens_k", cu_seqlens[1]))
        return launchers.fwd_params(block_m, block_n, p, window, tuple(zip((a["q"], a["k"], a["v"]), strides)),
                                    a["out"], a["lse"], cu, None if varlen is None else grid,
                                    a["tile_counter"] if persistent else 0)
    if persistent:
        return Parts((_launch(spec, launchers.fwd_persistent_grid(p, grid)),), *find_patches(pack, names),
                     ((names.index("tile_counter"), 4),), names, pack=pack)
    return Parts((_launch(spec, grid),), *find_patches(pack, names), (), names, pack=pack)


def backward(c, strides, names=BWD_BUFFERS, error=None, cu_seqlens=(0, 0), timeline=0) -> Parts:
    """The backward ``c`` (a launchers.BwdLaunch with tables; ``strides``: the (batch, row, head) element strides
    of q, k, v, out, dout) with buffers ``names`` (a prefix of :data:`BWD_BUFFERS`): its kernels
    (``launchers.bwd_kernels``), dk and dv zeroed first where ``c.zero_kv``. ``error``: a fixed ``(device record,
    host mirror)`` (a JAX call's, a captured call's), else buffers ``error`` and ``error_host`` (an eager call's
    slot); ``cu_seqlens``: a varlen launch's device lengths; ``timeline``: the debug build's stamps."""
    def pack(a):
        operands = tuple(zip((a["q"], a["k"], a["v"], a["out"], a["dout"]), strides))
        return launchers.bwd_params(c, operands, a["lse"], a["work"], (a["dq"], a["dk"], a["dv"]),
                                    (a["error"], a["error_host"]) if error is None else error, timeline, cu_seqlens)
    zeros = tuple(zip((names.index("dk"), names.index("dv")), launchers.kv_bytes(c.p))) if c.zero_kv else ()
    params, pointers, maps = find_patches(pack, names)
    work = tuple((i, _WORK_FIELDS[o]) for i, (o, b, _) in enumerate(pointers)
                 if names[b] == "work" and o in _WORK_FIELDS)
    kernel_launches = tuple(_launch(s, g) for s, g in launchers.bwd_kernels(c))
    return Parts(kernel_launches, params, pointers, maps, zeros, names, work, pack)


# ------------------------------------------------------------------------------------------------------------
# the plans of calls, cached by what they depend on
# ------------------------------------------------------------------------------------------------------------
def _cached(cache, key, build) -> executor.LaunchPlan:
    """The plan ``cache`` holds under ``key``, else ``build()``'s, kept there (at most _MAX_CACHED, oldest out)."""
    with _lock:
        plan = cache.get(key)
        if plan is not None:
            return plan
    plan = build().plan()
    with _lock:
        if len(cache) >= _MAX_CACHED:
            cache.pop(next(iter(cache)))
        cache[key] = plan
    return plan


def clear() -> None:
    """Forget the cached forward plans (tests; a backward's go with its tables)."""
    with _lock:
        _forwards.clear()


def _problem_key(p) -> tuple:
    return p.B, p.Sq, p.Sk, p.H, p.Hkv, p.D, p.Dv, p.dtype, p.scale, p.softcap, p.device_id


def forward_plan(spec, grid, block_m, block_n, p, window, strides, names=FWD_BUFFERS[:5],
                 varlen=None) -> executor.LaunchPlan:
    """The launch plan of :func:`forward` (the current device: ``p``'s), built once per distinct call."""
    key = (spec, tuple(grid), block_m, block_n, _problem_key(p), tuple(window), tuple(strides), names, varlen)
    return _cached(_forwards, key, lambda: forward(spec, grid, block_m, block_n, p, window, strides, names, varlen))


def backward_plan(c, strides, names=BWD_BUFFERS, error=None, cu_seqlens=(0, 0), timeline=0) -> executor.LaunchPlan:
    """The launch plan of :func:`backward` (the current device: ``c.p``'s), built once per distinct call and kept
    with the tables it reads (``c.tables.plans``), so that it goes when they go; a timeline build's is not kept."""
    if timeline:
        return backward(c, strides, names, error, cu_seqlens, timeline).plan()
    cache = getattr(c.tables, "plans", None)
    if cache is None:
        cache = c.tables.plans = {}
    key = (c.specs, c.block_m, c.block_n, _problem_key(c.p), c.deterministic, c.spin_timeout_ns, c.causal, c.window,
           c.varlen, c.fold, c.zero_kv, tuple(strides), names, error, tuple(cu_seqlens))
    return _cached(cache, key, lambda: backward(c, strides, names, error, cu_seqlens))


# every schedule field, then the other length-dependent ones, in rebased's order
_REBASED_OFFSETS = int_field_offsets(kernels.BWD_PARAMS_DTYPE, launchers.SCHEDULE_FIELDS + (
    "batch", "num_m_blocks", "seqlen_q_rounded", "cu_seqlens_q", "cu_seqlens_k"))
_KERNEL_STRUCT, _PATCH_STRUCT = struct.Struct("<Q3I3III"), struct.Struct("<IIQ")     # launch_plan.h's records
_HEADER, _KERNEL = struct.calcsize("<8I"), _KERNEL_STRUCT.size


def _kernel_bytes(function, grid, threads, smem) -> bytes:
    gx, gy, gz = (*grid, 1, 1)[:3] if type(grid) is tuple and 0 < len(grid) <= 3 and min(grid) >= 1 else \
        kernels.grid_xyz(grid)
    return _KERNEL_STRUCT.pack(int(function), gx, gy, gz, int(threads), 1, 1, int(smem), 0)


def rebased(base, base_specs, c, cu_seqlens) -> executor.LaunchPlan:
    """The plan ``base`` (a varlen backward's, of the kernels ``base_specs``) for the backward ``c`` of another
    packing of the same tensors, flags and stream (``cu_seqlens``: its device lengths): the fields that depend on
    the lengths (every schedule field, the sequence count, the padded scratch rows, the lengths) patched into
    base's template, its kernels' grids (base's function handles where the kernels are base's; a packing large
    enough for compact tables has others), the patches base's (the same buffers) but the workspace's.

    NOTES: the workspace's layout follows the lengths too (its arrays' offsets, launchers.BwdLaunch.offsets): the
    patches of the buffer ``work`` get this packing's offsets. On the training step's path (a new packing per step):
    the template is patched in C and the blob spliced from base's, not packed again (~5 µs against ~30)."""
    parts = base.parts
    fields = launchers.bwd_schedule_fields(c.tables)
    size = parts.params.dtype.itemsize
    template = executor.patched_block(base.blob[len(base.blob) - size:], _REBASED_OFFSETS, (
        *(fields[name] for name in launchers.SCHEDULE_FIELDS), c.varlen[0], c.num_m_blocks, c.sq_rounded,
        *cu_seqlens))
    bwd = launchers.bwd_kernels(c)
    if c.specs == base_specs:
        kernel_launches = tuple((k[0], g, *k[2:]) for k, (_, g) in zip(parts.kernels, bwd))
    else:
        kernel_launches = tuple(_launch(s, g) for s, g in bwd)
    pointers = list(parts.pointers)
    start = _HEADER + len(parts.kernels) * _KERNEL
    patches = bytearray(base.blob[start:start + 16 * len(pointers)])
    for i, k in parts.work:
        o, b, _ = pointers[i]
        pointers[i] = (o, b, c.offsets[k])
        _PATCH_STRUCT.pack_into(patches, 16 * i, o, b, c.offsets[k])
    new = parts._replace(kernels=kernel_launches, params=np.frombuffer(template, dtype=parts.params.dtype),
                         pointers=tuple(pointers), pack=None)
    # NOTES: base's header serves: a varlen backward never folds, so both launch three kernels (LaunchPlan's size
    # check refuses the blob otherwise)
    return executor.LaunchPlan(b"".join((base.blob[:_HEADER], *(_kernel_bytes(*k) for k in kernel_launches),
                                         patches, base.blob[start + len(patches):len(base.blob) - size],
                                         bytes(template))), new)
