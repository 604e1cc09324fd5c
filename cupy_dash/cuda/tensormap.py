"""TMA tensor maps (CUtensorMap, 128 bytes) of ``(B, S, H, D)`` 16-bit tensors, encoded on the host with
``cuTensorMapEncodeTiled`` (libcuda, no GPU work), the last few hundred kept. Layout, head dim 96 and strides:
docs/architecture.md, "Tensor maps".
"""
from __future__ import annotations

import collections
import struct
import threading

_DTYPES = {"bfloat16": "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16", "float16": "CU_TENSOR_MAP_DATA_TYPE_FLOAT16"}
_MAX_CACHED = 512
_cache: collections.OrderedDict = collections.OrderedDict()
_lock = threading.Lock()
_driver = None


def cuda_driver():
    """cuda.bindings.driver, initialised once (cuInit is cheap and idempotent; CuPy's context stays current)."""
    global _driver
    if _driver is None:
        from cuda.bindings import driver
        err, = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuInit failed: {err}")
        _driver = driver
    return _driver


def check_encodable(name: str, shape, strides, ptr: int) -> None:
    """Raise ValueError (naming the argument) unless a ``(B, S, H, D)`` tensor can be described by a map: D a
    multiple of 64 or 96, base 16-byte aligned, row / head / batch strides (of dimensions longer than 1) positive
    multiples of 8 elements (16 bytes), sizes below 2^31."""
    B, S, H, D = shape
    if D % 64 and D != 96:
        raise ValueError(f"{name}: head dim {D} is neither 96 nor a multiple of 64")
    if ptr % 16:
        raise ValueError(f"{name}: data pointer must be 16-byte aligned for TMA, got 0x{ptr:x}")
    for what, st, n in zip(("batch", "row", "head"), strides, (B, S, H)):
        if n > 1 and (st % 8 or not 0 < st < (1 << 38)):
            raise ValueError(f"{name}: {what} stride {st} must be a positive multiple of 8 elements")
    if max(B, S, H) >= 1 << 31:
        raise ValueError(f"{name}: dimensions {shape} too large for a tensor map")


def bhsd_map(ptr: int, dtype: str, shape, strides, box_rows: int, name: str = "tensor",
             box_panels: int | None = None) -> bytes:
    """The 128-byte map of a ``(B, S, H, D)`` tensor (docs/architecture.md, "Tensor maps") whose box is ``box_rows``
    rows (1..256) by ``box_panels`` 64-column panels (default: the whole head dim; head dim 96: always one panel of
    the ``{96, S, 1, H, B}`` map). ``strides`` are the ``(batch, row, head)`` element strides; ``name`` names the
    argument in errors."""
    key = (ptr, dtype, tuple(shape), tuple(strides), box_rows, box_panels)
    with _lock:
        m = _cache.get(key)
        if m is not None:
            _cache.move_to_end(key)
            return m
    m = _encode(ptr, dtype, shape, strides, box_rows, name, box_panels)
    with _lock:
        _cache[key] = m
        while len(_cache) > _MAX_CACHED:
            _cache.popitem(last=False)
    return m


def _encode(ptr: int, dtype: str, shape, strides, box_rows: int, name: str, box_panels) -> bytes:
    if dtype not in _DTYPES:
        raise ValueError(f"tensor map: unsupported dtype {dtype!r}")
    if not 1 <= box_rows <= 256:
        raise ValueError(f"tensor map: box rows {box_rows} out of [1, 256]")
    check_encodable(name, shape, strides, ptr)
    drv = cuda_driver()
    B, S, H, D = (int(x) for x in shape)
    batch_st, row_st, head_st = (int(x) for x in strides)
    padded = D % 64 != 0         # head dim 96: the real columns innermost, one 64-column box copied per panel
    dims = [D, S, 1, H, B] if padded else [64, S, D // 64, H, B]
    # dims 1..4 (dim 0 is contiguous); a dimension of size 1 takes 128 bytes, whatever the framework reported
    def stride(elements, n):
        return 2 * elements if n > 1 else 128
    byte_strides = [stride(row_st, S), 128, stride(head_st, H), stride(batch_st, B)]
    panels = 1 if padded else D // 64
    if box_panels is None:
        box_panels = panels
    if not 1 <= box_panels <= panels:
        raise ValueError(f"tensor map: box panels {box_panels} out of [1, {panels}]")
    box = [64, box_rows, box_panels, 1, 1]
    err, tmap = drv.cuTensorMapEncodeTiled(
        getattr(drv.CUtensorMapDataType, _DTYPES[dtype]), 5, ptr,
        [drv.cuuint64_t(x) for x in dims], [drv.cuuint64_t(x) for x in byte_strides],
        [drv.cuuint32_t(x) for x in box], [drv.cuuint32_t(1)] * 5,
        drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        drv.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        drv.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    if err != drv.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{name}: cuTensorMapEncodeTiled failed ({err}) for shape {tuple(shape)}, strides "
                           f"{tuple(strides)}, box rows {box_rows}, address 0x{ptr:x}")
    return struct.pack("<16Q", *(int(w) for w in tmap.opaque))
