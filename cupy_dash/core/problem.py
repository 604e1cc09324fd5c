"""The validated description of one call, :class:`Problem`, and the argument checks that every entry point shares
(the functional API, varlen, the torch and JAX adapters, the fake implementations of the torch ops): each error names
the argument, and :func:`validate` checks in an order that lets CPU arrays reach every check before the device one.
Layouts and head dims: docs/api.md.
"""
from __future__ import annotations

import math
import typing

import numpy as np

from .. import schedule as _schedule
from ..cuda import kernels, tensormap
from . import interop

_LAYOUT = "(B, S, H, D)"


class Problem(typing.NamedTuple):
    """Validated sizes and operand descriptions of one call (immutable: what :func:`validate` checked is what every
    later step reads). ``D``: the head dim of q and k, ``Dv``: of v, out and do (kernels.VALUE_HEAD_DIMS);
    ``dtype``: "bfloat16" / "float16"; ``scale``: softmax_scale; ``softcap``: the logit cap (0: none); ``infos``:
    interop.describe of q, k, v (then do, out for a backward); ``lse_info``: lse's, or None."""
    B: int
    Sq: int
    Sk: int
    H: int
    Hkv: int
    D: int
    Dv: int
    dtype: str
    scale: float
    softcap: float
    device_id: int
    infos: tuple = ()
    lse_info: object = None


MAX_GRID_YZ = 65535        # CUDA's limit on a grid's y and z dimensions


def check_schedule(schedule) -> str:
    if not isinstance(schedule, str) or schedule not in _schedule.POLICIES:
        raise ValueError(f"schedule: expected one of {', '.join(repr(p) for p in _schedule.POLICIES)}, "
                         f"got {schedule!r}")
    return schedule


def check_scale(softmax_scale, D) -> float:
    if softmax_scale is None:
        return 1.0 / math.sqrt(D)
    try:
        scale = float(softmax_scale)
    except (TypeError, ValueError):
        raise ValueError(f"softmax_scale: expected a finite number > 0 or None, got {softmax_scale!r}") from None
    if not 0 < scale < math.inf:          # (comparisons, not math.isfinite: torch.compile traces them symbolically)
        raise ValueError(f"softmax_scale: expected a finite number > 0 or None, got {softmax_scale!r}")
    return scale


def check_softcap(softcap) -> float:
    """The logit cap as a float >= 0 (0: none); raises naming ``softcap`` otherwise."""
    if isinstance(softcap, (bool, np.bool_)) or not isinstance(softcap, (int, float, np.integer, np.floating)):
        raise TypeError(f"softcap: expected a number >= 0 (0: no soft-capping), got {softcap!r}")
    c = float(softcap)
    if not 0 <= c < math.inf:
        raise ValueError(f"softcap: expected a finite number >= 0 (0: no soft-capping), got {softcap!r}")
    return c


def check_flag(name, value) -> bool:
    """``value`` as a bool if it is one (``bool`` or ``numpy.bool_``); anything else, such as the string "no"
    (truthy), raises TypeError naming ``name``."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected a bool (True or False), got {type(value).__name__} {value!r}")
    return bool(value)


# window = (left, right) -> the (left, right) the kernels get, right = 0 with causal; raises naming "window"
check_window = _schedule.check_window


UNCHECKED = object()           # validate's schedule: not checked (a call with an explicit table)


def validate(q, k, v, do=None, out=None, lse=None, *, softmax_scale=None, schedule=UNCHECKED,
             backward=False, softcap=0.0, do_name="do") -> Problem:
    """All argument checks, in an order that lets CPU arrays reach every check before the device one:
    dtype -> rank -> shapes -> head dim -> sizes / heads -> softmax_scale, softcap -> schedule -> strides /
    alignment -> device. ``do_name``: what the caller's signature calls ``do`` (JAX's: ``dout``)."""
    qi = interop.describe(q, "q")
    ki = interop.describe(k, "k")
    vi = interop.describe(v, "v")
    like_q = []
    li = None
    if backward:
        like_q = [interop.describe(do, do_name), interop.describe(out, "out")]
        li = interop.describe(lse, "lse")
    operands = [qi, ki, vi, *like_q]

    # dtype
    if qi.dtype not in kernels.SUPPORTED_DTYPES:
        raise ValueError(f"q: expected dtype {' or '.join(kernels.SUPPORTED_DTYPES)}, got {qi.dtype}")
    for i in operands[1:]:
        if i.dtype != qi.dtype:
            raise ValueError(f"{i.name}: expected dtype {qi.dtype} (the dtype of q), got {i.dtype}")
    if li is not None and li.dtype != "float32":
        raise ValueError(f"lse: expected dtype float32, got {li.dtype}")

    # rank and shapes
    for i in operands:
        if len(i.shape) != 4:
            raise ValueError(f"{i.name}: expected a 4-D tensor {_LAYOUT}, got shape {i.shape}")
    if li is not None and len(li.shape) != 3:
        raise ValueError(f"lse: expected a 3-D tensor (B, H, Sq), got shape {li.shape}")
    B, Sq, H, D = qi.shape
    _, Sk, Hkv, _ = ki.shape
    Dv = vi.shape[3]
    if ki.shape[0] != B or ki.shape[3] != D:
        raise ValueError(f"k: expected shape (B, Sk, Hkv, D) with B={B} and D={D} as in q {qi.shape}, "
                         f"got {ki.shape}")
    if vi.shape[:3] != ki.shape[:3]:
        raise ValueError(f"v: expected the shape of k {ki.shape} (or that shape with another head dim), got "
                         f"{vi.shape}")
    for i in like_q:
        if i.shape != (B, Sq, H, Dv):
            what = "the shape of q" if Dv == D else "shape (B, Sq, H, Dv): q's with v's head dim"
            raise ValueError(f"{i.name}: expected {what} {(B, Sq, H, Dv)}, got {i.shape}")
    if li is not None and li.shape != (B, H, Sq):
        raise ValueError(f"lse: expected shape (B, H, Sq) = {(B, H, Sq)}, got {li.shape}")

    # head dim
    dims = kernels.BWD_HEAD_DIMS if backward else kernels.SUPPORTED_HEAD_DIMS
    if D not in dims:
        also = ("; the forward also takes " + ", ".join(str(d) for d in kernels.SUPPORTED_HEAD_DIMS if d not in dims)
                if backward and D in kernels.SUPPORTED_HEAD_DIMS else "")
        raise NotImplementedError(f"q: head dim D={D} is not supported{' by the backward' if backward else ''}; "
                                  f"supported head dims are {', '.join(str(d) for d in dims)}{also}")
    if Dv not in kernels.value_head_dims(D):
        pairs = ", ".join(f"{d} with {dv}" for d, dvs in kernels.VALUE_HEAD_DIMS.items() for dv in dvs)
        raise NotImplementedError(f"v: value head dim {Dv} with q / k head dim {D} is not supported; v's head "
                                  f"dim must be q's, or (q / k, v): {pairs}")

    # sizes and heads
    if B == 0:
        raise ValueError(f"q: batch size B is 0 (shape {qi.shape}); empty batches are not supported")
    if Sq == 0:
        raise ValueError(f"q: sequence length Sq is 0 (shape {qi.shape}); empty sequences are not supported")
    if Sk == 0:
        raise ValueError(f"k: sequence length Sk is 0 (shape {ki.shape}); empty sequences are not supported")
    if H == 0:
        raise ValueError(f"q: number of heads H is 0 (shape {qi.shape})")
    if Hkv == 0 or H % Hkv:
        raise ValueError(f"k: the number of kv heads Hkv={Hkv} must divide the number of query heads H={H} of q")
    if B > MAX_GRID_YZ or H > MAX_GRID_YZ:        # the grids' y (heads) and z (batch) dimensions
        raise ValueError(f"q: batch size B={B} and heads H={H} must each be at most {MAX_GRID_YZ} (a CUDA grid "
                         f"dimension); split the batch (under jax.vmap: the mapped axis folds into B)")

    scale = check_scale(softmax_scale, D)
    softcap = check_softcap(softcap)
    if schedule is not UNCHECKED:
        check_schedule(schedule)

    # strides and alignment
    for i in operands:
        interop.check_layout(i)
    if li is not None:
        interop.check_contiguous(li)

    # device
    every = operands if li is None else [*operands, li]
    for i in every:
        if not i.is_cuda:
            raise ValueError(f"{i.name}: expected a tensor on a CUDA device, got one on {i.device}")
    for i in every[1:]:
        if i.device_id != qi.device_id:
            raise ValueError(f"{i.name}: is on {i.device} but q is on {qi.device}; all tensors must be on one "
                             f"CUDA device")

    return Problem(B, Sq, Sk, H, Hkv, D, Dv, qi.dtype, scale, softcap, qi.device_id, tuple(operands), li)


def check_tma_operands(p) -> None:
    """The backward's q, k, v, do (read through TMA maps) can be encoded: raises ValueError naming the argument."""
    for info in p.infos[:4]:
        tensormap.check_encodable(info.name, info.shape, info.strides[:3], info.data_ptr or 0)
